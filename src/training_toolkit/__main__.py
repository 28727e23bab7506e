"""`train` (the console entry) and `python -m training_toolkit`."""
import os
import signal
import sys

USAGE = """\
usage: train                       run the job's entry point (or its framework hook)
       train train                 the same (SageMaker starts an image as `IMAGE train`)
       train -- COMMAND [ARGS...]  run COMMAND instead, under the same contract
       train --help | --version

The entrypoint of ML training containers: reads the job tree at $SAGEMAKER_BASE_DIR
(default /opt/ml), fetches and installs the code, runs and supervises it, and ends
with the verdict: output/success or output/failure, output/status.json, the exit code.

Main variables: SAGEMAKER_BASE_DIR (the job tree), SAGEMAKER_PROGRAM (the entry
point), SAGEMAKER_SUBMIT_DIRECTORY (the code), SAGEMAKER_TRAINING_MODULE (a framework
hook), TRAINING_TOOLKIT_ORCHESTRATOR (auto, slurm, pytorchjob, trainjob, mpijob, batch,
sagemaker, none), SM_TERMINATION_GRACE_SECONDS (default 110).
Where there is no job tree, `training-toolkit local CODE_DIR` writes one and runs it.
Documentation: README.md and docs/contract.md of training-toolkit.
"""


def hold_signals():
    """First thing, before the toolkit's imports: hold SIGTERM and SIGINT
    until `train` has its handlers (it unblocks them then), so that a stop in
    the first milliseconds still ends with 128+N and a status written; and
    SIGUSR1 and SIGUSR2, which would end it, until it can pass them on."""
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                              signal.SIGUSR2))


def print_usage_or_version(option):
    """`train --help` or `--version`: printed, nothing else touched."""
    if option == "--version":
        from . import __version__

        text = "train (training-toolkit) %s\n" % __version__
    else:
        text = USAGE
    try:
        os.write(sys.stdout.fileno(), text.encode())
    except OSError:  # a closed stdout: nothing to say it to
        pass


def main():
    if sys.argv[1:2] in (["-h"], ["--help"], ["--version"]):  # before any import or file
        return print_usage_or_version(sys.argv[1])
    hold_signals()
    from .trainer import main as train_main

    train_main()


if __name__ == "__main__":
    main()
