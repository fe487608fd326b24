"""A memory limit on a running process, for the fault matrix: the process moved into a memory
cgroup of its own, limited to what is charged there plus HEADROOM (on kernels that no longer move
a process's charges with it, HEADROOM of what it takes from then on), so that the kernel reclaims its page
cache and slows its allocations (memory pressure), and kills it (the cgroup's OOM killer) only if
it keeps growing. cgroup v1's memory hierarchy, or v2's where its memory controller is enabled;
`unavailable` says why neither can be used (no root, no controller)."""

import contextlib
import os
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
V1 = CGROUPS / "memory"
HEADROOM = 2 << 20


def unavailable():
    """Why no memory cgroup can be made here, or None."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    if (V1 / "memory.limit_in_bytes").exists() or (V1 / "tasks").exists():
        return None if os.access(V1, os.W_OK) else f"{V1} is read-only"
    enabled = CGROUPS / "cgroup.subtree_control"
    if enabled.exists() and "memory" in enabled.read_text().split():
        return None if os.access(CGROUPS, os.W_OK) else f"{CGROUPS} is read-only"
    return "no memory controller for a cgroup of our own (v1's hierarchy, or v2's enabled below the root)"


def current(pid):
    """The cgroup `pid` is in, for memory: (the directory, whether it is v1)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return V1 / path.lstrip("/"), True
        if number == "0" and not V1.exists():
            return CGROUPS / path.lstrip("/"), False
    raise RuntimeError(f"process {pid} is in no memory cgroup")


@contextlib.contextmanager
def limited(pid, headroom=HEADROOM):
    """`pid` in a cgroup of its own, limited to its usage there plus `headroom`, while inside;
    then moved back. Yields a function that says how often the limit was met so far (v1's
    failcnt, v2's `max` events) and whether the process was killed for it."""
    home, v1 = current(pid)
    # v1: beside the process, in its own hierarchy; v2: at the root, where a cgroup may hold
    # processes and children both
    cgroup = (home if v1 else CGROUPS) / f"rpcedge-fault-{pid}"
    cgroup.mkdir()
    try:
        if v1:
            # its charges move with it where the kernel still can (Linux 6.x refuses: what it
            # holds stays charged where it was, and the limit bounds what it takes from now on)
            with contextlib.suppress(OSError):
                (cgroup / "memory.move_charge_at_immigrate").write_text("3")
        (cgroup / "cgroup.procs").write_text(str(pid))
        try:
            usage = int((cgroup / ("memory.usage_in_bytes" if v1 else "memory.current")).read_text())
            (cgroup / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(usage + headroom))
            yield lambda: pressure(cgroup, v1)
        finally:
            # back where it was, unless the cgroup killed it
            with contextlib.suppress(ProcessLookupError):
                (home / "cgroup.procs").write_text(str(pid))
    finally:
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def pressure(cgroup, v1):
    """(times the limit was met, times the OOM killer killed in it)."""
    if v1:
        oom = dict(line.split() for line in (cgroup / "memory.oom_control").read_text().splitlines())
        return int((cgroup / "memory.failcnt").read_text()), int(oom.get("oom_kill", 0))
    events = dict(line.split() for line in (cgroup / "memory.events").read_text().splitlines())
    return int(events.get("max", 0)), int(events.get("oom_kill", 0))
