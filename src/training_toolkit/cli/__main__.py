"""`python -m training_toolkit.cli`: the `training-toolkit` command."""
from . import console_main

console_main()
