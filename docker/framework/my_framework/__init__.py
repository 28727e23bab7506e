"""A minimal framework toolkit, as a DLC ships one: `train` calls
`my_framework.training:main` (SAGEMAKER_TRAINING_MODULE)."""
