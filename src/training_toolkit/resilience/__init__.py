"""Keeping long runs alive: the hang watchdog (`settings`, `progress`,
`watchdog`), HyperPod's log rules (`rules`) and every rank's stack without
ptrace (`stacks`, armed in each Python rank by `boot/sitecustomize.py`).
A mechanism beside `supervise/`: it imports the base and `job/` only, and
nothing of it is imported while the watchdog is off."""
