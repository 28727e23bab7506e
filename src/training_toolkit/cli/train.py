"""sagemaker_training.cli.train: `main()` runs `train` as the console script
does (signals held until `train`'s handlers are in place, then the job), and
ends the process by SystemExit with the job's exit code, as the reference's
does: a caller's finally blocks and atexit handlers run."""
import sys


def main():
    from ..__main__ import hold_signals

    hold_signals()
    from ..trainer import train

    train(sys.argv[1:])


if __name__ == "__main__":
    main()
