"""A hang, from one rank's silence to the job's verdict: what each rank is
given (its heartbeat file, armed stacks), what each host dumps, and the
verdict the master writes (which rank hung first, where it was, and the
odd one out among every rank's stack)."""
import dataclasses
import os
import time

from .. import log, params


def rank_env(settings, paths, rank):
    """The variables a rank gets while the watchdog is on: its heartbeat
    file, and the stack dump armed in every Python process it starts."""
    from . import stacks

    heartbeat = paths.heartbeat_file(rank)
    os.makedirs(os.path.dirname(heartbeat), exist_ok=True)
    os.makedirs(paths.stacks_dir, exist_ok=True)
    try:  # an earlier run's file would count as this rank's first heartbeat
        os.unlink(heartbeat)
    except OSError:
        pass
    env = {params.HEARTBEAT_FILE_ENV: heartbeat}
    env.update(stacks.rank_env(dict(os.environ, **env), paths.stacks_dir))
    return env


def settings_of(environ, hosts=1):
    """The watchdog's settings in a job of `hosts`, or None when it is off."""
    if not params.hang_watch_requested(environ):
        return None
    from .settings import HangSettings

    return HangSettings.from_environ(environ, hosts)


def watch_rank(settings, paths, rank, host, env):
    """(RankWatch, the rank's env with the watchdog's variables added)."""
    from .watchdog import RankWatch

    env = dict(env, **rank_env(settings, paths, rank))
    return RankWatch(settings, rank, host, env[params.HEARTBEAT_FILE_ENV]), env


def rank_pids(ranks_dir):
    """{rank: (wrapper pid, program pid)} of this host's ranks, from the pid
    files their wrappers write (cluster/rank.py)."""
    found = {}
    try:
        names = os.listdir(ranks_dir)
    except OSError:
        return found
    for name in names:
        if not name.endswith(".pid"):
            continue
        try:
            with open(os.path.join(ranks_dir, name)) as f:
                wrapper, program = (int(p) for p in f.read().split())
            found[int(name[:-4])] = (wrapper, program)
        except (OSError, ValueError):
            continue
    return found


def dump(paths, host, ranks, deadline_s, on_demand=False):
    """Every rank's stack on this host into output/data/hang/<host>/ (or a
    `sigquit-<time>` dir below it); returns {rank: summary} (JSON-able)
    within `deadline_s`."""
    from . import stacks

    dest = paths.hang_dir(host)
    if on_demand:
        dest = os.path.join(dest, time.strftime("sigquit-%Y%m%dT%H%M%S"))
    started = time.monotonic()
    try:
        found = stacks.collect(ranks, host, dest, paths.stacks_dir, deadline_s)
    except OSError as e:
        log.error("could not write the ranks' stacks to %s: %s" % (dest, e))
        return {}
    summary = {int(rank): dict(info, host=host) for rank, info in stacks.summary(found).items()}
    log.info("wrote the stacks of %d rank(s) on %s to %s in %.1f s" % (
        len(found), host, dest, time.monotonic() - started))
    return summary


def _stack_deadline(settings):
    return (settings.stack_deadline_s if settings is not None
            else params.setting(os.environ, params.STACK_DEADLINE_ENV))


def process_dumper(paths, host, rank, supervisor, settings=None):
    """`dump_here(on_demand)`: the stack of the one program `supervisor`
    runs (the process runner's), as `rank`'s; {rank: summary}."""
    def dump_here(on_demand):
        proc = supervisor.proc
        if proc is None:
            return {}
        return dump(paths, host, {rank: proc.pid}, _stack_deadline(settings), on_demand)

    return dump_here


def host_dumper(paths, host, settings=None):
    """`dump_here(on_demand)`: the stacks of this host's ranks, as their
    wrappers' pid files name them; {rank: summary}."""
    deadline_s = _stack_deadline(settings)
    return lambda on_demand: dump(
        paths, host, {rank: pids[1] for rank, pids in rank_pids(paths.ranks_dir).items()},
        deadline_s, on_demand)


@dataclasses.dataclass(frozen=True)
class HangVerdict:
    """The job's verdict on a hang, as the master decides it."""
    hang: object            # watchdog.Hang: the first rank found hung
    exit_code: int
    top_frame: str = ""     # the hung rank's top user frame
    odd_one_out: object = None  # the rank whose stack differs from all the others
    odd_frame: str = ""
    ranks_dumped: int = 0
    unanswered: tuple = ()  # ranks whose Python stack did not come in time
    dump_s: float = 0.0     # from the verdict to the last stack file

    def headline(self):
        hang = self.hang
        text = "rank %d on %s hung: %s for %.1f s in phase %s" % (
            hang.rank, hang.host, hang.reason, hang.silent_s, hang.phase)
        if hang.step:
            text += " (step %s)" % hang.step
        return text

    def details(self):
        """The lines after the headline in output/failure."""
        lines = []
        if self.top_frame:
            lines.append("its stack: %s" % self.top_frame)
        if self.odd_one_out is not None:
            lines.append("the odd one out: rank %s (%s), whose stack differs from every "
                         "other rank's" % (self.odd_one_out, self.odd_frame or "no frame"))
        if self.hang.last_line:
            lines.append("its last line: %s" % self.hang.last_line)
        lines.append("stacks of %d rank(s) in output/data/hang/<host>/ (%s)" % (
            self.ranks_dumped, "all answered" if not self.unanswered else
            "no Python stack from rank(s) %s" % ", ".join(map(str, self.unanswered))))
        return lines

    def status(self):
        out = dict(dataclasses.asdict(self.hang), exit_code=self.exit_code,
                   top_frame=self.top_frame, odd_one_out=self.odd_one_out,
                   odd_frame=self.odd_frame,
                   ranks_dumped=self.ranks_dumped, unanswered=list(self.unanswered),
                   dump_s=self.dump_s)
        out["detection_latency_s"] = round(max(self.hang.silent_s - self.hang.timeout_s, 0), 2)
        return out

    def to_message(self):
        return dict(self.status(), hang=dataclasses.asdict(self.hang))

    @classmethod
    def from_message(cls, message):
        from .watchdog import Hang

        return cls(hang=Hang(**message["hang"]), exit_code=int(message["exit_code"]),
                   top_frame=message.get("top_frame") or "",
                   odd_one_out=message.get("odd_one_out"),
                   odd_frame=message.get("odd_frame") or "",
                   ranks_dumped=int(message.get("ranks_dumped") or 0),
                   unanswered=tuple(message.get("unanswered") or ()),
                   dump_s=float(message.get("dump_s") or 0.0))


def odd_rank(summaries):
    """The rank whose stack differs from every other rank's, or None."""
    from .stacks import odd_one_out

    # Ranks share their signature's list (stacks.with_signatures): each list
    # made a tuple once, not once a rank.
    tuples = {}

    def signature(summary):
        frames = summary.get("signature") or ()
        key = tuples.get(id(frames))
        if key is None:
            key = tuples[id(frames)] = tuple(frames)
        return key

    return odd_one_out({r: signature(s) for r, s in summaries.items()})


# Functions a rank waits in when it waits for its peers (torch.distributed's
# Python frames; mpi4py's calls are C, seen as their caller's frame only).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier",
               "all_to_all", "monitored_barrier", "gather", "scatter")


def in_collective(summary):
    return any(name in COLLECTIVES for name in summary.get("signature") or ())


def decide(hangs, summaries, exit_code, dump_s):
    """The verdict from the Hangs reported so far (in a collective hang every
    rank goes silent within a poll of the others) and every host's {rank:
    summary}. The rank named is the odd one out when it is among them (the
    one in a data loader while the rest wait in all_reduce is the cause),
    else the one whose silence began first."""
    odd = odd_rank(summaries)
    # With no odd one out (two ranks), a silent rank outside a collective
    # is the likelier cause than one waiting in it.
    outside = [h for h in hangs if not in_collective(summaries.get(h.rank, {}))]
    hang = next((h for h in hangs if h.rank == odd), None) or min(
        outside or hangs, key=lambda h: h.detected_at - h.silent_s)
    top = summaries.get(hang.rank, {}).get("top") or ""
    return HangVerdict(hang=hang, exit_code=exit_code, top_frame=top, odd_one_out=odd,
                       odd_frame=(summaries.get(odd, {}).get("top") or "") if odd is not None
                       else "",
                       ranks_dumped=len(summaries),
                       unanswered=tuple(sorted(r for r, s in summaries.items()
                                               if not s.get("answered"))),
                       dump_s=round(dump_s, 2))
