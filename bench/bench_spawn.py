"""What starting one process costs `proctree.Process`: start to exit of
/bin/true, per way of giving it the parent-death signal, from a process with
other threads running (as `train` has them).

Contenders, run alternately in the interpreter running this script:
  setpriv         Process as it runs where util-linux's setpriv has --pdeathsig
                  (fork_exec of `setpriv --pdeathsig TERM -- /bin/true`);
  preexec         Process where there is none (fork_exec of /bin/true, prctl in
                  a preexec_fn: a plain fork, no vfork);
  no pdeathsig    fork_exec of /bin/true alone (vfork), the floor;
  os.fork         the previous Process: os.fork, the child's setup in Python,
                  execve (kept here only to compare with).
The difference setpriv - no pdeathsig is what the parent-death signal costs.
"""
import argparse
import os
import shlex
import signal
import statistics
import sys
import threading
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from training_toolkit import proctree  # noqa: E402

TRUE = "/bin/true"


SETPRIV = proctree.setpriv_path()  # looked up once, as in `train`


def with_setpriv():
    proctree._setpriv[:] = [SETPRIV]
    proctree.Process([TRUE]).wait()


def with_preexec():
    proctree._setpriv[:] = [None]
    proctree.Process([TRUE]).wait()


def bare_fork_exec():
    pid = proctree._fork_exec(TRUE, [TRUE], TRUE, os.environ, None, None, None)
    os.waitpid(pid, 0)


def old_os_fork():
    """The child side of the previous Process, reduced to what it did."""
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_r)
            os.setsid()
            proctree.die_with_parent()
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.set_inheritable(report_w, False)
            for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
                if fd > 2 and fd != report_w:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            os.execve(TRUE, [TRUE], os.environ)
        finally:
            os._exit(127)
    os.close(report_w)
    os.read(report_r, 100)
    os.close(report_r)
    os.waitpid(pid, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300, help="timed starts per contender")
    p.add_argument("--threads", type=int, default=4, help="idle threads running meanwhile")
    args = p.parse_args()
    print("$ " + shlex.join([sys.executable] + sys.argv))
    print("python %s, load average at start: %.2f %.2f %.2f"
          % ((sys.version.split()[0],) + os.getloadavg()))
    print("setpriv: %s" % (SETPRIV or "none with --pdeathsig"))
    stop = threading.Event()
    for _ in range(args.threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    contenders = {"no pdeathsig": bare_fork_exec, "preexec": with_preexec,
                  "os.fork": old_os_fork}
    if SETPRIV:
        contenders["setpriv"] = with_setpriv
    warnings.simplefilter("ignore", DeprecationWarning)  # os.fork's, on 3.12+
    times = {name: [] for name in contenders}
    names = list(contenders)
    for fn in contenders.values():  # warm-up
        fn()
    for i in range(args.runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t0)
    stop.set()
    floor = statistics.median(times["no pdeathsig"])
    print("\nstart to exit of %s, median of %d (alternated), %d other threads:"
          % (TRUE, args.runs, args.threads))
    for name in names:
        med = statistics.median(times[name])
        print("  %-13s %6.2f ms  (%+.2f ms vs no pdeathsig)" % (name, med * 1e3,
                                                               (med - floor) * 1e3))


if __name__ == "__main__":
    main()
