"""training-toolkit: the entrypoint of ML training containers.

Nothing is imported here on purpose: `train` must start fast. Import the
modules you need (`training_toolkit.environment`, `.entry_point`, `.runner`,
`.errors`), as with sagemaker_training.
"""
__version__ = "0.1.0"
