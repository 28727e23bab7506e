"""Slurm's compressed host lists (`SLURM_JOB_NODELIST`, `SLURM_STEP_NODELIST`),
expanded without `scontrol show hostnames`, which a container rarely has.

The grammar is Slurm's (`src/common/hostlist.h`): items are separated by
commas or whitespace outside brackets; an item is ``prefix[ranges]suffix``,
with any number of bracket groups, expanded as a Cartesian product with the
first group outermost (``r[1-2]-n[1-2]`` is r1-n1, r1-n2, r2-n1, r2-n2);
`ranges` is a comma list of ``N`` or ``N-M``, and the low end's digits fix the
width (``a[08-10]`` is a08, a09, a10). The order written is the order kept:
it is Slurm's node order, in which ``node9`` comes before ``node10``. The
BlueGene ``x`` boxes are not supported.
"""

# Slurm's MAX_RANGE: no list expands to more hosts than this.
MAX_HOSTS = 65536


def expand(nodelist):
    """The host names of a Slurm host list, in Slurm's order, as a list. A
    list that is not one raises ValueError with a short reason."""
    if not isinstance(nodelist, str):
        raise ValueError("not a string: %r" % (nodelist,))
    hosts = []
    for item in _items(nodelist):
        names = _expand_item(item, MAX_HOSTS - len(hosts))
        hosts.extend(names)
    if not hosts:
        raise ValueError("empty host list")
    return hosts


def _items(text):
    """The items of a list: split on commas and whitespace outside brackets."""
    items, start, depth = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError("nested '[' at offset %d" % i)
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError("']' without '[' at offset %d" % i)
            depth = 0
        elif depth and char.isspace():
            raise ValueError("whitespace inside brackets at offset %d" % i)
        elif not depth and (char == "," or char.isspace()):
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' not closed")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_item(item, room):
    """The names one item stands for: its literal parts and bracket groups
    multiplied out, first group outermost."""
    parts = []  # each a list of alternatives
    rest = item
    while "[" in rest:
        literal, _, rest = rest.partition("[")
        inside, _, rest = rest.partition("]")
        if literal:
            parts.append([literal])
        parts.append(_ranges(inside, item))
    if rest:
        parts.append([rest])
    size = 1
    for alternatives in parts:
        size *= len(alternatives)
    if size > room:
        raise ValueError("more than %d hosts" % MAX_HOSTS)
    names = [""]
    for alternatives in parts:
        names = [name + alternative for name in names for alternative in alternatives]
    return names


def _ranges(inside, item):
    """The numbers of one bracket group, as zero-padded strings in order."""
    if not inside:
        raise ValueError("empty brackets in %r" % item)
    numbers = []
    for spec in inside.split(","):
        low, dash, high = spec.partition("-")
        if not dash:
            high = low
        for end in (low, high):
            if not (end.isascii() and end.isdigit()):
                if spec.replace("x", "").isdigit():
                    raise ValueError("3-D ranges like %r are not supported" % spec)
                raise ValueError("bad range %r in %r" % (spec, item))
        first, last = int(low), int(high)
        if last < first:
            raise ValueError("range %r runs backwards in %r" % (spec, item))
        if last - first + 1 + len(numbers) > MAX_HOSTS:
            raise ValueError("more than %d hosts" % MAX_HOSTS)
        width = len(low)
        numbers.extend("%0*d" % (width, n) for n in range(first, last + 1))
    return numbers
