"""Where a result came from, to keep beside it: the commit and whether the tree differed from it,
a hash of each binary measured, the machine, and when the run began and ended (issue 66)."""

import hashlib
import json
import os
import platform
import subprocess
from datetime import datetime, timezone

from testbed.cache_cases import CORE_LIB
from testbed.envoy_harness import NATIVE, WASM
from testbed.harness import CACHED_BIN, REPLAY_BIN, REPO
from testbed.nginx_harness import MODULE

# What `make build` makes: a bench's run hashes each that is there, whichever it measured.
BUILT = [MODULE, WASM, NATIVE, CORE_LIB, CACHED_BIN, REPLAY_BIN]


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


def of_run(started, binaries=BUILT):
    """The provenance of a run that began at `started` (`now()`) and measured `binaries` (paths;
    those not built are left out): a tree that differs from its commit outside loadtest/results/
    is `dirty`, with the files."""
    changed = [line[3:] for line in git("status", "--porcelain").splitlines()
               if not line[3:].startswith("loadtest/results/")]
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": changed,
        "binaries": {os.path.relpath(path, REPO): sha256(path) for path in binaries if os.path.exists(path)},
        "machine": {"cpus": os.cpu_count(), "model": cpu_model(), "kernel": platform.release()},
        "started": started,
        "ended": now(),
    }


def write(path, results, started, binaries=BUILT):
    """`results` (a dict) as JSON into `path`, with the provenance of the run that began at
    `started` and measured `binaries`; a run on a tree that differs from its commit says so."""
    record = {**results, "provenance": of_run(started, binaries)}
    path.write_text(json.dumps(record, indent=1) + "\n")
    if record["provenance"]["dirty"]:
        print(f"{os.path.relpath(path, REPO)}: measured on a tree that differs from its commit: "
              f"{', '.join(record['provenance']['dirty'])}")
