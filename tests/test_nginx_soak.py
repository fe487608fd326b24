"""nginx with rpcedge under sustained load: worker memory stays flat over 200k requests, and a run
under valgrind's memcheck finds no memory error in the module or the core."""

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from testbed import wire
from testbed.harness import LOOPBACK, Process, free_port
from testbed.nginx_harness import NGINX_BIN, main_conf, start_nginx
from test_nginx import BUCKETS

# heavy on both CPUs: one after another with the other load tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("load")

# The mix, every path of the filter: small (untouched), one-shot, chunked ending within max_buffer,
# streamed (under /stream/, max_buffer is 8k), a streamed body above max_buffer, incompressible.
PATHS = [
    (f"/corpus/{BUCKETS['under 1 KiB']}", {}),
    (f"/corpus/{BUCKETS['1-16 KiB']}", {}),
    (f"/corpus/{BUCKETS['1-16 KiB']}", {"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "1000"}),
    (f"/stream/corpus/{BUCKETS['16-256 KiB']}", {"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "8192"}),
    (f"/stream/corpus/{BUCKETS['16-256 KiB']}", {}),
    (f"/corpus/{BUCKETS['1-16 KiB']}", {"X-Replay-Header": "Content-Type: text/plain"}),
]

SERVER = """
    upstream replay {{
        server {LOOPBACK}:{replay_port};
        keepalive 16;
    }}

    server {{
        listen {LOOPBACK}:{port};
        access_log off;
        rpcedge on;
        proxy_http_version 1.1;
        proxy_set_header Connection "";

        location / {{
            proxy_pass http://replay;
        }}

        location /stream/ {{
            rpcedge_max_buffer 8k;
            proxy_pass http://replay/;
        }}
    }}
"""

WRK_SCRIPT = """
local paths = {%s}
local headers = {%s}
local i = 0
request = function()
    i = i %% #paths + 1
    local h = headers[i]
    h["Accept-Encoding"] = "gzip"
    return wrk.format("GET", paths[i], h)
end
"""


def rss_kib(pid):
    return int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read()).group(1))


def wrk(port, script, seconds, connections=8):
    """Runs wrk; returns (requests, non-2xx/3xx responses + socket errors)."""
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script,
                          f"http://{LOOPBACK}:{port}"], capture_output=True, text=True, timeout=seconds + 30)
    assert out.returncode == 0, out.stderr
    requests = int(re.search(r"(\d+) requests in", out.stdout).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out.stdout)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out.stdout)
    return requests, (int(bad.group(1)) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0)


def write_script(tmp_path, paths):
    script = tmp_path / "mix.lua"
    lua_paths = ", ".join(f'"{p}"' for p, _ in paths)
    lua_headers = ", ".join("{" + ", ".join(f'["{k}"] = "{v}"' for k, v in h.items()) + "}" for _, h in paths)
    script.write_text(WRK_SCRIPT % (lua_paths, lua_headers))
    return script


def test_worker_memory_stays_flat_over_200k_requests(replay, tmp_path):
    port = free_port()
    nginx = start_nginx(tmp_path / "nginx", SERVER.format(LOOPBACK=LOOPBACK, replay_port=replay.port, port=port),
                        [port])
    try:
        script = write_script(tmp_path, PATHS)
        [worker] = nginx.worker_pids()
        total, bad = wrk(nginx.port, script, 5)  # warm-up: pools, compressors, buffers at size
        baseline = rss_kib(worker)
        samples = [baseline]
        deadline = time.monotonic() + 300
        while total < 200_000 and time.monotonic() < deadline:
            n, b = wrk(nginx.port, script, 10)
            total, bad = total + n, bad + b
            samples.append(rss_kib(worker))
        assert total >= 200_000, f"only {total} requests in the time allowed; RSS KiB {samples}"
        assert bad == 0
        print(f"{total} requests; worker RSS KiB: {samples}")
        # Flat: the last samples do not climb above the warmed-up worker by more than noise.
        assert max(samples[-3:]) - baseline < 16 * 1024, samples
        assert samples[-1] - samples[len(samples) // 2] < 4 * 1024, samples
    finally:
        nginx.stop()


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_no_memory_errors_under_valgrind(replay, tmp_path):
    port = free_port()
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    text = main_conf(prefix, SERVER.format(LOOPBACK=LOOPBACK, replay_port=replay.port, port=port))
    conf.write_text(text.replace("master_process on;", "master_process off;"))
    log = tmp_path / "valgrind.log"
    nginx = Process("nginx-valgrind", ["valgrind", "--error-exitcode=99", "--leak-check=full",
                                       "--errors-for-leak-kinds=definite", f"--log-file={log}",
                                       f"--suppressions={Path(__file__).parent / 'valgrind-nginx.supp'}",
                                       NGINX_BIN, "-p", prefix, "-c", conf, "-e", prefix / "error.log"],
                    tmp_path / "nginx.out")
    nginx.wait_for_port(port, timeout=120)
    try:
        # Every path of the mix, plus upstream resets and client aborts, a few times over.
        for _ in range(3):
            for path, headers in PATHS:
                r = wire.request(port, path, headers=headers, timeout=120)
                assert r.status == 200 and r.complete
            for prefix in ("", "/stream"):  # reset while buffering, and while streaming
                for mode in ("length", "chunked"):
                    r = wire.request(port, f"{prefix}/corpus/{BUCKETS['16-256 KiB']}", timeout=120,
                                     headers={"X-Replay-Mode": mode, "X-Replay-Reset-After": "20000"})
                    # held: a whole 502; streamed: a broken body
                    assert (r.status == 502 and r.complete) if prefix == "" else not r.complete
            with wire.socket.create_connection((LOOPBACK, port)) as sock:
                sock.sendall(f"GET {PATHS[3][0]} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
                             "X-Replay-Mode: chunked\r\nX-Replay-Chunk-Delay-Ms: 200\r\n\r\n".encode())
                sock.recv(100)
        # Concurrent load for a while.
        threads = [threading.Thread(target=lambda: [wire.request(port, p, headers=h, timeout=120)
                                                    for p, h in PATHS * 4]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        nginx.proc.send_signal(3)  # SIGQUIT: graceful exit, so the leak check runs
        nginx.proc.wait(timeout=120)
    report = log.read_text()
    summary = re.search(r"ERROR SUMMARY: (\d+) errors", report)
    assert summary, report[-3000:]
    assert summary.group(1) == "0", report[-6000:]
    assert "rpcedge" not in report, "no report names the module or the core"
