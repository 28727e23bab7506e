"""Keeping long runs alive: the hang watchdog (`settings`, `watchdog`,
`hang`), HyperPod's log rules (`rules`), every rank's stack without ptrace
(`stacks`, armed in each Python rank by `boot/sitecustomize.py`), and
checkpoints that survive preemption (`checkpoints`, `restore`, on the
intermediate output's sync). A mechanism beside `supervise/`: it imports the
base, `job/` and `intermediate/` only, and nothing of it is imported while
the watchdog and the checkpoint wing are off."""
