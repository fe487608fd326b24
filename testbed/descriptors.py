"""Descriptor exhaustion (EMFILE) for the fault matrix: a running process's RLIMIT_NOFILE lowered to
the number of descriptors it holds, plus SLACK, for the length of a cell, then given back. What it
holds stays open; each new socket or file past the limit fails with EMFILE ("Too many open
files"), as on a host whose limit a load outgrew."""

import contextlib
import resource
from pathlib import Path

# room for a few new descriptors: the process still works at its limit, not only beyond it
SLACK = 4
EMFILE = "Too many open files"


def held(pid):
    """How many descriptors `pid` holds. A new one takes the lowest free number, and the limit
    bounds the number: under a limit of this count it may open as many as it holds above it (and
    what it closes), however many gaps lie below its highest."""
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


@contextlib.contextmanager
def limited(pids, logs, slack=SLACK):
    """Each of `pids` limited to the descriptors it holds plus `slack` while inside. A
    RuntimeError after, if none of `logs` (paths) grew a line saying EMFILE: the cell tested
    nothing."""
    given, logged = {}, {log: log.stat().st_size if log.exists() else 0 for log in logs}
    try:
        for pid in pids:
            soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
            given[pid] = (soft, hard)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(soft, held(pid) + slack), hard))
        yield
    finally:
        for pid, limits in given.items():
            with contextlib.suppress(ProcessLookupError):
                resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    if not any(EMFILE.encode() in read_from(log, at) for log, at in logged.items()):
        raise RuntimeError(f"no process ran out of descriptors: nothing in {', '.join(map(str, logs))} says "
                           f"{EMFILE!r}")


def read_from(path, offset):
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read()
