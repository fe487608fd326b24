"""Where a result came from, to keep beside it: the commit and whether the tree differed from it,
a hash of each binary measured, the machine, and when the run began and ended (issue 66)."""

import hashlib
import os
import platform
import subprocess
from datetime import datetime, timezone

from testbed.harness import REPO


def git(*args):
    # only the last newline goes: a porcelain line begins with a space where the index is clean
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.rstrip("\n")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cpu_model():
    for line in open("/proc/cpuinfo", encoding="utf-8"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def now():
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def of_run(started, binaries):
    """The provenance of a run that began at `started` (`now()`) and measured `binaries` (paths):
    a tree that differs from its commit outside loadtest/results/ is `dirty`, with the files."""
    changed = [line[3:] for line in git("status", "--porcelain").splitlines()
               if not line[3:].startswith("loadtest/results/")]
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": changed,
        "binaries": {os.path.relpath(path, REPO): sha256(path) for path in binaries},
        "machine": {"cpus": os.cpu_count(), "model": cpu_model(), "kernel": platform.release()},
        "started": started,
        "ended": now(),
    }
