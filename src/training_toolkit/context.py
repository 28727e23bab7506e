"""The one job context: what the `train` process running this job holds.

`train` activates it once; the drop-in faces (`entry_point.run` called from
a framework hook, through `pipeline.current_job()`, and `intermediate_output`)
find the job they run inside through `current()`. Nothing below the pipeline
reads it: the runners get the reporter they record through as an argument.
"""


class JobContext:
    """paths (job.paths.JobPaths), reporter (report.Reporter), supervisor
    (supervise.Supervisor), sync (the intermediate-output sync, when one
    runs), checkpoints (resilience.checkpoints.Checkpoints, once open),
    stop_signal_at (monotonic time of the first stop signal), failing
    (the failure verdict is being written: a stop then only shortens it)
    and promotion (on a spare host put in a lost host's place: the
    master's message, its attempt and the promotions).
    A plain class: dataclasses would import inspect on every job's start."""

    __slots__ = ("paths", "reporter", "supervisor", "sync", "stop_signal_at", "checkpoints",
                 "failing", "promotion")

    def __init__(self, paths, reporter, supervisor, sync=None, stop_signal_at=None):
        self.paths, self.reporter, self.supervisor = paths, reporter, supervisor
        self.sync, self.stop_signal_at = sync, stop_signal_at
        self.checkpoints = None
        self.failing = False
        self.promotion = None


_active = None


def activate(context):
    """Make `context` the job of this process (`train` does, once)."""
    global _active
    _active = context
    return context


def current():
    """The active JobContext, or None outside `train`."""
    return _active
