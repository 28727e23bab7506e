"""`train` (the console entry) and `python -m training_toolkit`."""
import signal


def hold_signals():
    """First thing, before the toolkit's imports: hold SIGTERM and SIGINT
    until `train` has its handlers (it unblocks them then), so that a stop in
    the first milliseconds still ends with 128+N and a status written; and
    SIGUSR1 and SIGUSR2, which would end it, until it can pass them on."""
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                              signal.SIGUSR2))


def main():
    hold_signals()
    from .trainer import main as train_main

    train_main()


if __name__ == "__main__":
    main()
