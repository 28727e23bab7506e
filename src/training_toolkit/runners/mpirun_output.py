"""What mpirun writes (the MPI runner, mpi.py): its tags on the ranks' output,
and its notices of a rank that called MPI_Abort, of the rank that ended the
job and of a rank killed by a signal. Pure: bytes in, lines and Failures out.
"""
import re

from ..cluster.verdict import Failure

# mpirun's --tag-output tags each piece it reads from a rank, not each line:
# when a rank writes faster than mpirun's output drains, a line arrives in two
# pieces and the second is tagged again, mid-line. Pieces are joined again per
# rank and stream, and only whole lines go out.
_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>:")
# A rank that calls MPI_Abort (as `python -m mpi4py` does on an uncaught
# error) stays blocked until OpenMPI kills it, seconds later; mpirun says so at
# once, and that notice starts the fail-fast.
_ABORT = re.compile(rb"MPI_ABORT was invoked on rank (\d+) in communicator \S+\s+"
                    rb"with errorcode (\d+)")
# When a rank's non-zero exit ends the job (orte_abort_on_non_zero_status),
# mpirun names that rank as it ends; a rank killed by a signal, likewise. Its
# lines may carry the tag of the rank whose output they followed in one read.
_ANY_TAG = rb"\[[^\[\]\n]*\]<std(?:out|err)>:"
_FIRST_FAILED = re.compile(
    rb"The first process to do so was:(?:\s|%s)*Process name:\s*\[\[\d+,\d+\],(\d+)\]"
    rb"(?:\s|%s)*Exit code:\s*(\d+)" % (_ANY_TAG, _ANY_TAG))
_KILLED = re.compile(rb"mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) "
                     rb"exited on signal (\d+)")


def aborted(block):
    """(rank, error code) of the MPI_Abort that mpirun announces in `block`,
    or None."""
    found = _ABORT.search(block)
    if not found:
        return None
    return int(found.group(1)), int(found.group(2))


def retag(block, cut_lines, host_tag):
    """`block` of mpirun's output with each rank's pieces joined into whole
    lines, each tagged `host_tag(rank, stream)`. `cut_lines` ((rank, stream)
    -> the start of a line mpirun cut) keeps what has no end yet, from one
    block to the next."""
    pieces = _TAG.split(block)  # untagged, then (rank, stream, text) per piece
    out = [pieces[0]]
    for i in range(1, len(pieces), 3):
        key = (int(pieces[i]), pieces[i + 1])
        text = cut_lines.pop(key, b"") + pieces[i + 2]
        end = text.rfind(b"\n") + 1
        if end < len(text):
            cut_lines[key] = text[end:]
        tag = host_tag(*key)
        out.extend(tag + line for line in text[:end].splitlines(keepends=True))
    return b"".join(out)


def first_failed(tail, rank_host):
    """The Failure of the rank that mpirun's own notice at its end names as
    the one that ended the job, or None."""
    named = _FIRST_FAILED.search(tail)
    if named:
        rank = int(named.group(1))
        return Failure(rank, rank_host(rank), int(named.group(2)))
    killed = _KILLED.search(tail)
    if killed:
        return Failure(int(killed.group(1)), killed.group(2).decode("utf-8", "replace"),
                       128 + int(killed.group(3)))
    return None


# mpirun frames its notices with lines of dashes; one that follows a rank's
# output in the same read carries that rank's tag on every line.
_FRAME = re.compile(rb"^-{20,}\s*$")


def rank_lines(tail, rank):
    """The lines of `rank` in a tagged tail (when its own report is missing),
    without mpirun's notices that came tagged as the rank's (they would push
    the rank's own last words out of the failure's first lines)."""
    if rank is None:
        return None
    pattern = re.compile(rb"^(\[[^,\]]+,%d\]<std(?:out|err)>:)(.*)$" % rank, re.M)
    kept, in_notice = [], False
    for m in pattern.finditer(tail):
        if _FRAME.match(m.group(2)):
            in_notice = not in_notice
        elif not in_notice:
            kept.append(m.group(0))
    return b"\n".join(kept).decode("utf-8", "replace")

