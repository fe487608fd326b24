"""What the container tests share: commands run from the repository, and the Docker engine that
docker/engine.sh starts (making the base image where needed)."""

import shutil
import subprocess
import sys
import time

import pytest

from testbed.harness import REPO, port_accepts


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


def stack_up(compose, project, ports, wait_up, up_within):
    """A fixture's body: the images built from this build, the compose stack `compose` (project
    `project`, publishing `ports`) brought up until `wait_up(deadline)` returns, within
    `up_within` seconds; torn down after (containers, networks, volumes), its logs printed if the
    tests failed."""
    start_engine()
    started = time.monotonic()
    build = checked([sys.executable, "docker/build.py"])
    print(f"\nimages built in {time.monotonic() - started:.0f} s:\n{build.stdout}")
    busy = [port for port in ports if port_accepts(port)]
    assert not busy, f"ports {busy} are taken (is `make run` or another stack up?)"
    run(compose + ["down", "-v"])
    started = time.monotonic()
    try:
        checked(compose + ["up", "-d"], timeout=600)
        wait_up(started + 2 * up_within)
        up_after = time.monotonic() - started
        print(f"stack up and healthy {up_after:.1f} s after `up`")
        assert up_after <= up_within
        yield
    finally:
        logs = run(compose + ["logs", "--tail", "20"])
        down = run(compose + ["down", "-v"], timeout=300)
        assert down.returncode == 0, down.stderr
        assert not run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"]).stdout.strip()
        if sys.exc_info()[0] is not None:
            print(logs.stdout[-8000:])
