"""rpcedge in real nginx with `aio threads`: large one-shot compressions run in nginx's thread pool
(the default pool, which `aio threads` creates), and a client gets the same bytes as inline."""

import gzip
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed import wire
from testbed.nginx_harness import LOOPBACK, free_port, start_nginx
from test_nginx import BUCKETS, recorded

# Offloaded from 128 KiB (the default offload_min_length); both within max_buffer (1 MiB).
OFFLOADED = {
    "400 KiB": BUCKETS["256 KiB-1 MiB"],
    "1 MiB": "erigon_getBlockByTimestamp/erigon-rpc-tests__mainnet__test_06.json",  # 967 KiB
}
INLINE = BUCKETS["16-256 KiB"]  # 56 KiB

SERVER = """
    upstream replay {{
        server {LOOPBACK}:{replay_port};
        keepalive 16;
    }}

    server {{
        listen {LOOPBACK}:{port};
        listen {LOOPBACK}:{h2_port} http2;

        # the module's debug lines tell which compressions went to a thread
        error_log {prefix}/debug.log debug;

        rpcedge on;
        aio threads;

        proxy_http_version 1.1;
        proxy_set_header Connection "";

        location / {{
            proxy_pass http://replay;
        }}

        location /unbuffered/ {{
            proxy_buffering off;
            proxy_pass http://replay/;
        }}

        # slow enough for a client to go away while the thread compresses
        location /level12/ {{
            rpcedge_level 12;
            proxy_pass http://replay/;
        }}

        location /static/ {{
            alias {static}/;
            types {{ application/json json; }}
        }}

        location /inline/ {{
            aio off;
            proxy_pass http://replay/;
        }}

        location /offload-from-512k/ {{
            rpcedge_offload_min_length 512k;
            proxy_pass http://replay/;
        }}

        # an aborted request is redirected to post_action while its body is in a thread
        location /postaction/ {{
            rpcedge_level 12;
            post_action /after;
            proxy_pass http://replay/;
        }}

        location = /after {{
            return 204;
        }}

        # an error page whose body is compressed in a thread
        location = /missing.json {{
            error_page 404 /corpus/{offloaded_1m};
            return 404;
        }}

        # a small queue: a burst overflows it and falls back to compressing inline
        location /small-pool/ {{
            aio threads=small;
            rpcedge_level 12;
            proxy_pass http://replay/;
        }}
    }}
"""

MAIN = "thread_pool small threads=1 max_queue=1;"


@pytest.fixture(scope="module")
def nginx(replay, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("nginx-threads")
    static = prefix / "static"
    static.mkdir()
    (static / "big.json").write_bytes(recorded(replay, OFFLOADED["400 KiB"]))
    ports = [free_port(), free_port()]
    body = SERVER.format(LOOPBACK=LOOPBACK, replay_port=replay.port, port=ports[0], h2_port=ports[1],
                         prefix=prefix, static=static, offloaded_1m=OFFLOADED["1 MiB"])
    server = start_nginx(prefix, body, ports, main=MAIN)
    yield server
    server.stop()


def get(nginx, path, headers=None):
    return wire.request(nginx.port, path, headers=headers)


def offloaded(nginx, uri):
    """How many compressions for `uri` went to a thread, from the debug log."""
    log = (nginx.prefix / "debug.log").read_text(errors="replace")
    return log.count(f'rpcedge thread: "{uri}?"')


def assert_oneshot(r, original):
    assert r.status == 200
    assert_oneshot_body(r, original)


def assert_oneshot_body(r, original):
    assert r.complete and r.header("content-encoding") == "gzip"
    assert not r.chunked and r.header("content-length") == str(len(r.body)), "exact compressed length"
    assert gzip.decompress(r.body) == original


@pytest.mark.parametrize("mode", ["length", "chunked"])
@pytest.mark.parametrize("size", OFFLOADED)
def test_large_bodies_are_compressed_in_a_thread(nginx, replay, size, mode):
    path = OFFLOADED[size]
    # unbuffered proxying passes each chunk on flushed, which streams
    for prefix in ["", "/unbuffered"] if mode == "length" else [""]:
        uri = f"{prefix}/corpus/{path}"
        before = offloaded(nginx, uri)
        r = get(nginx, uri, headers={"X-Replay-Mode": mode})
        assert_oneshot(r, recorded(replay, path))
        assert offloaded(nginx, uri) == before + 1


def test_the_same_bytes_as_inline(nginx, replay):
    path = OFFLOADED["1 MiB"]
    threaded = get(nginx, f"/corpus/{path}")
    inline = get(nginx, f"/inline/corpus/{path}")
    assert offloaded(nginx, f"/inline/corpus/{path}") == 0
    assert threaded.body == inline.body
    assert threaded.header("content-length") == inline.header("content-length")


def test_static_files_read_in_threads_too(nginx, replay):
    r = get(nginx, "/static/big.json")
    assert_oneshot(r, recorded(replay, OFFLOADED["400 KiB"]))
    assert r.header("etag").startswith('W/"')
    assert offloaded(nginx, "/static/big.json") == 1


def test_the_offload_threshold_is_a_directive(nginx, replay):
    for size, threaded in [("400 KiB", False), ("1 MiB", True)]:
        uri = f"/offload-from-512k/corpus/{OFFLOADED[size]}"
        assert_oneshot(get(nginx, uri), recorded(replay, OFFLOADED[size]))
        assert offloaded(nginx, uri) == int(threaded), size


def test_a_full_thread_queue_falls_back_to_inline(nginx, replay):
    path = OFFLOADED["1 MiB"]
    uri = f"/small-pool/corpus/{path}"
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: get(nginx, uri), range(6)))
    for r in responses:
        assert_oneshot(r, recorded(replay, path))
    log = nginx.error_log()
    assert "thread pool \"small\" queue overflow" in log, "the burst did overflow the queue"
    assert offloaded(nginx, uri) < 6, "some compressed inline"
    assert "alert" not in log


def test_post_action_after_an_abort_during_offload(nginx, replay):
    """The abort finalizes the request, post_action redirects it (clearing its module contexts)
    while the thread still compresses: the completion must not need the request's ctx."""
    path = OFFLOADED["1 MiB"]
    uri = f"/postaction/corpus/{path}"
    for delay in [0.02, 0.05, 0.1]:
        with socket.create_connection((LOOPBACK, nginx.port)) as sock:
            sock.sendall(f"GET {uri} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n".encode())
            time.sleep(delay)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    deadline = time.monotonic() + 20
    while sum(line.startswith(f"{uri} ") for line in nginx.access_log()) < 3:
        assert time.monotonic() < deadline, nginx.access_log()[-3:]
        time.sleep(0.1)
    # the completion logs the request as post_action left it
    assert offloaded(nginx, "/after") > 0, "an abort came while a thread compressed"
    assert_oneshot(get(nginx, f"/corpus/{OFFLOADED['400 KiB']}"), recorded(replay, OFFLOADED["400 KiB"]))
    log = nginx.error_log()
    assert "signal" not in log, "no worker crashed"
    assert "alert" not in log


def test_an_error_page_is_compressed_in_a_thread(nginx, replay):
    """error_page redirects at the header, before any body: the redirected request starts a new
    exchange (the redirect cleared the old ctx), and its body goes to a thread like any other."""
    r = get(nginx, "/missing.json")
    assert r.status == 404
    assert_oneshot_body(r, recorded(replay, OFFLOADED["1 MiB"]))
    assert offloaded(nginx, f"/corpus/{OFFLOADED['1 MiB']}") > 0


def test_small_bodies_stay_inline(nginx, replay):
    for mode in ["length", "chunked"]:
        r = get(nginx, f"/corpus/{INLINE}", headers={"X-Replay-Mode": mode})
        assert_oneshot(r, recorded(replay, INLINE))
    assert offloaded(nginx, f"/corpus/{INLINE}") == 0


def test_concurrent_offloads(nginx, replay):
    paths = [OFFLOADED["1 MiB"], OFFLOADED["400 KiB"], INLINE] * 4
    with ThreadPoolExecutor(len(paths)) as pool:
        responses = list(pool.map(lambda p: get(nginx, f"/corpus/{p}"), paths))
    for path, r in zip(paths, responses):
        assert_oneshot(r, recorded(replay, path))


def test_http2_client(nginx, replay, tmp_path):
    path = OFFLOADED["1 MiB"]
    out = tmp_path / "body"
    uri = f"/level12/corpus/{path}"
    result = subprocess.run(
        ["curl", "-sS", "--http2-prior-knowledge", "-H", "Accept-Encoding: gzip", "-D", "-",
         "-o", out, f"http://{LOOPBACK}:{nginx.ports[1]}{uri}"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    head = result.stdout.lower()
    assert head.startswith("http/2 200") and "content-encoding: gzip" in head
    body = out.read_bytes()
    assert f"content-length: {len(body)}" in head
    assert gzip.decompress(body) == recorded(replay, path)
    assert offloaded(nginx, uri) == 1


def test_client_aborts_during_offloaded_compression(nginx, replay):
    path = OFFLOADED["1 MiB"]
    uri = f"/level12/corpus/{path}"
    before = offloaded(nginx, uri)
    delays = [0.01, 0.05, 0.1, 0.2]
    for delay in delays:
        with socket.create_connection((LOOPBACK, nginx.port)) as sock:
            sock.sendall(f"GET {uri} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n".encode())
            time.sleep(delay)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    # HTTP/2 clients that go away with their stream open
    for delay in delays[1:]:
        subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-H", "Accept-Encoding: gzip", "--max-time",
                        str(delay), "-o", "/dev/null", f"http://{LOOPBACK}:{nginx.ports[1]}{uri}"], timeout=10)
    # Each aborted request is finished (and logged) once its thread is done, not before.
    deadline = time.monotonic() + 20
    while sum(line.startswith(f"{uri} 499 ") for line in nginx.access_log()) < 2 * len(delays) - 1:
        assert time.monotonic() < deadline, nginx.access_log()[-len(delays):]
        time.sleep(0.1)
    assert offloaded(nginx, uri) > before, "some aborts came while a thread compressed"
    assert_oneshot(get(nginx, f"/corpus/{OFFLOADED['400 KiB']}"), recorded(replay, OFFLOADED["400 KiB"]))
    log = nginx.error_log()
    assert "alert" not in log
    assert "signal" not in log, "no worker crashed"
