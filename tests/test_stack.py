"""`make run`'s stack (testbed/stack.py) as an operator meets it: a part that dies comes back and the
stack answers again (the cache daemon, nginx's upstream node and nginx's master, each killed
outright); Ctrl-C still stops everything. On the stack's own fixed ports, with its run directory
in a temporary one."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import wire
from testbed.harness import CACHED_BIN, REPLAY_BIN, REPO, port_accepts
from testbed.stack import CACHED_PORT, ENVOY_ADMIN, ENVOY_PORT, NGINX_PORT, REPLAY_PORT

# Runs on one pytest-xdist worker with the other tests of the host's fixed ports and Docker engine
# (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("host")

PORTS = (REPLAY_PORT, NGINX_PORT, ENVOY_PORT, ENVOY_ADMIN, CACHED_PORT)
CALL = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": ["0xF42401", True]}).encode()


def wait(condition, timeout=90, what="the stack"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.2)


def pids_of(binary, marker):
    """The processes running `binary` with an argument that holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and argv[0] == os.fsencode(binary) and any(str(marker).encode() in a for a in argv):
            found.append(int(entry.name))
    return found


@pytest.fixture
def stack(tmp_path):
    busy = [port for port in PORTS if port_accepts(port)]
    assert not busy, f"ports {busy} are taken (is `make run` or another stack up?)"
    run = tmp_path / "run"
    env = {**os.environ, "RPCEDGE_RUN": str(run)}
    out = open(tmp_path / "stack.out", "wb")
    process = subprocess.Popen([sys.executable, "-m", "testbed.stack"], cwd=REPO, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait(lambda: b"rpcedge is running" in (tmp_path / "stack.out").read_bytes() or process.poll() is not None,
             timeout=300)
        assert process.poll() is None, (tmp_path / "stack.out").read_text(errors="replace")
        yield process, run, tmp_path / "stack.out"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            # nginx leads a group of its own (the stack kills it whole): its workers too
            pid = run / "nginx" / "nginx.pid"
            try:
                os.killpg(int(pid.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        out.close()


def state(pid):
    """A process's state and parent, from /proc (None once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def children(parent):
    """The processes whose parent is `parent`."""
    return [int(entry.name) for entry in Path("/proc").glob("[0-9]*") if (state(entry.name) or (0, 0))[1] == parent]


def alive(pid):
    """Running: neither gone nor a zombie (which a container's first process may never reap)."""
    return (state(pid) or ("Z", 0))[0] != "Z"


def answers(port=NGINX_PORT):
    """The block through a proxy, or None while it cannot answer it."""
    try:
        r = wire.request(port, "/mainnet", method="POST", headers={"Content-Type": "application/json"}, body=CALL,
                         timeout=10)
    except OSError:
        return None
    return r.decoded() if r.complete and r.status == 200 else None


def test_a_part_that_dies_comes_back_and_ctrl_c_still_stops_all(stack):
    process, run, out = stack
    block = answers()
    assert block and json.loads(block)["result"]["number"].lower() == "0xf42401"

    # the daemon by its store, the node by its port
    for binary, marker, name in [(CACHED_BIN, run, "cache daemon"), (REPLAY_BIN, f":{REPLAY_PORT}", "replay upstream")]:
        [pid] = pids_of(binary, marker)
        os.kill(pid, signal.SIGKILL)
        wait(lambda: pids_of(binary, marker) not in ([], [pid]), what=f"the {name} started again")
        wait(lambda: f"{name} is running again" in out.read_text(errors="replace"), what=f"the {name} back")
        wait(lambda: answers() == block and answers(ENVOY_PORT) == block, what=f"answers after the {name} came back")
        log = (run / "stack.log").read_text()
        assert f"{name} exited with -9; starting it again in 0.5 s (restart 1)" in log, log

    # nginx's master, killed outright: its workers, which outlive it holding the port, go with it
    master = int((run / "nginx" / "nginx.pid").read_text())
    workers = children(master)
    assert workers
    os.kill(master, signal.SIGKILL)
    wait(lambda: "nginx is running again" in out.read_text(errors="replace"), what="nginx back")
    wait(lambda: answers() == block, what="answers after nginx came back")
    assert not [pid for pid in workers if alive(pid)], "the dead master's workers are gone"
    assert "nginx exited with -9; starting it again in 0.5 s (restart 1)" in (run / "stack.log").read_text()
    assert process.poll() is None

    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    assert not [port for port in PORTS if port_accepts(port)], "every part stopped"
