"""sagemaker_training.cli.train: `main()` runs `train`, as the console
script does (training_toolkit.__main__.main: signals held until `train`'s
handlers are in place, then the job, then its exit code)."""


def main():
    from ..__main__ import main as train_main

    train_main()


if __name__ == "__main__":
    main()
