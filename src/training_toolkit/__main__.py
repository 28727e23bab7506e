"""`train` (the console entry) and `python -m training_toolkit`."""
import signal


def main():
    # First thing, before the toolkit's imports: hold SIGTERM and SIGINT until
    # `train` has its handlers (it unblocks them then), so that a stop in the
    # first milliseconds still ends with 128+N and a status written.
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT))
    from .trainer import main as train_main

    train_main()


if __name__ == "__main__":
    main()
