"""The recorded task environments of a real Slurm (test/fixtures/slurm/*.env,
which the orchestrator adapters' unit tests use): ``format_env_fixture``
writes one, ``read_env_fixture`` reads it (both also reached through
slurm.py). Standard library only.
"""


def format_env_fixture(tasks, header=()):
    """Text of an env fixture: ``tasks`` maps (host, procid) -> {var: value};
    ``header``: comment lines. One section per task, ``[host procid]``,
    then ``VAR=value`` lines, sorted."""
    out = ["# " + line if line else "#" for line in header]
    for (host, procid) in sorted(tasks, key=lambda k: int(k[1])):
        out.append("")
        out.append("[%s %d]" % (host, int(procid)))
        for var in sorted(tasks[(host, procid)]):
            value = tasks[(host, procid)][var]
            if "\n" in value:
                raise ValueError("a value with a newline cannot be recorded: %s" % var)
            out.append("%s=%s" % (var, value))
    return "\n".join(out) + "\n"


def read_env_fixture(path):
    """{(host, procid): {var: value}} from a fixture format_env_fixture wrote."""
    tasks, current = {}, None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                host, procid = line.strip("[]").split()
                current = tasks.setdefault((host, int(procid)), {})
            elif current is None or "=" not in line:
                raise ValueError("%s:%d: not a [host procid] section or VAR=value: %r"
                                 % (path, n, line))
            else:
                var, value = line.split("=", 1)
                current[var] = value
    return tasks

