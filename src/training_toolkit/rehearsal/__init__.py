"""Rehearsal: simulated hosts (simcluster, over holder, relay, stale and
namespaces), containers, job trees (jobtree, v3tree) and timelines for trying
a job before it runs for real. `train` never imports this package."""
