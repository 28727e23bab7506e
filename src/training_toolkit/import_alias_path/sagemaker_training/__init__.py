"""`sagemaker_training` in a user's process that `train` started: the name is
training-toolkit's (training_toolkit/import_alias.py says how and why). This
directory is on the process's PYTHONPATH ahead of site-packages, so it is
found before the reference toolkit's package where that one is installed."""
import sys

import training_toolkit
from training_toolkit import import_alias

sys.modules[__name__] = training_toolkit  # what `import sagemaker_training` returns
import_alias.install()
