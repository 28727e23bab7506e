"""One round of reports from every worker to the master, on the control
port, before the job's own channel opens: the pre-flight's checks
(cluster/preflight.py), each host's restore of the job's checkpoint
(cluster/checkpoint_plan.py). Every report names its round, so a late one
from an earlier round never counts."""
from .control import MasterControl


class RoundReports(MasterControl):
    """The master's side of a job-wide exchange (the pre-flight's, the
    checkpoint restore's): the control server, taking each worker's report
    of this round, a message of type `kind` named in the drop log as
    `during`; `take(host, message)` gives what is kept of it."""

    kind = during = None

    def __init__(self, port, workers, key, round_):
        self.round = round_
        self.reports = {}  # worker host -> what `take` kept of its report
        super().__init__(port, workers, key)

    def take(self, host, message):
        raise NotImplementedError

    def _handle(self, message):
        host = self._known(message.get("host", ""))
        if message["type"] != self.kind or host is None or message["round"] != self.round:
            self.drops.note(message.get("host", "?")[:80], "a %r message of round %r during "
                            "the %s" % (message["type"][:40], message.get("round"), self.during))
            return
        report = self.take(host, message)
        with self._joined:
            self.reports[host] = report
            self._joined.notify_all()

    def wait_for_reports(self, deadline):
        """The workers still missing at `deadline` (none: all reported)."""
        return self.wait_for_every_worker(self.reports, deadline)
