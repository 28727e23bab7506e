"""Keeping long runs alive: the hang watchdog (`settings`, `watchdog`,
`hang`), HyperPod's log rules (`rules`), every rank's stack without ptrace
(`stacks`, armed in each Python rank by `boot/sitecustomize.py`),
checkpoints that survive preemption (`checkpoints`, `restore`, on the
S3 sync, `s3sync/`), restarts in place (`restarts`, the decision;
`attempts`, the record), and the pre-flight's checks of a host (`preflight`,
`probes`; cluster/preflight.py runs them across the hosts). A mechanism
beside `supervise/`: it imports the base, `job/` and `s3sync/` only,
and nothing of it is imported while the watchdog, the checkpoint wing,
restarts and the pre-flight are off."""
