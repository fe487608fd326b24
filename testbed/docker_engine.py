"""What the container tests share: commands run from the repository, and the Docker engine that
docker/engine.sh starts (making the base image where needed)."""

import shutil
import subprocess

import pytest

from testbed.harness import REPO


def run(argv, timeout=1800, **kwargs):
    return subprocess.run([str(a) for a in argv], cwd=REPO, timeout=timeout, text=True, capture_output=True, **kwargs)


def checked(argv, timeout=1800, **kwargs):
    result = run(argv, timeout, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, argv))}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def start_engine(*args):
    """A running engine (docker/engine.sh with `args`); skips only where none can be started."""
    if shutil.which("dockerd") is None and shutil.which("docker") is None:
        pytest.skip("no Docker engine here: install Debian's docker.io (make deps does)")
    engine = run(["bash", "docker/engine.sh", *args])
    if engine.returncode != 0 and "dockerd is missing" in engine.stderr:
        pytest.skip(f"no Docker engine can be started: {engine.stderr.strip()}")
    assert engine.returncode == 0, engine.stdout + engine.stderr
