"""rpcedge's counters in nginx: the core's (rpcedge_core::metrics), kept in shared memory by every
worker, served by `rpcedge_status` in Prometheus' text format as Envoy prints its own."""

import socket
import time

import pytest

from testbed import wire
from testbed.counters import scrape
from testbed.nginx_harness import LOOPBACK, free_port, shipped_conf, start_nginx
from test_nginx import BUCKETS, recorded

SERVER = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;

        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
        }}

        location = /rpcedge_status {{
            rpcedge_status;
            # not counted itself, so that the counts here are exact
            rpcedge off;
        }}
    }}
"""


@pytest.fixture(scope="module")
def nginx(replay, tmp_path_factory):
    port = free_port()
    server = start_nginx(tmp_path_factory.mktemp("nginx-status"),
                         SERVER.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port), [port], workers=2)
    yield server
    server.stop()


def test_counters_add_up_across_workers(nginx, replay):
    before = scrape(nginx.port)
    oneshot, small, streamed = BUCKETS["16-256 KiB"], BUCKETS["under 1 KiB"], BUCKETS["1-4 MiB"]
    plan = [oneshot] * 12 + [small] * 6 + [streamed] * 2
    bytes_in = bytes_out = 0
    for path in plan:
        r = wire.request(nginx.port, f"/corpus/{path}")
        assert r.complete and r.decoded() == recorded(replay, path)
        if path != small:
            bytes_in += len(recorded(replay, path))
            bytes_out += len(r.body)
    untouched = wire.request(nginx.port, f"/corpus/{oneshot}", accept_encoding=None)
    assert untouched.header("content-encoding") is None
    # A client that leaves while rpcedge holds its response.
    with socket.create_connection((LOOPBACK, nginx.port)) as sock:
        sock.sendall(f"GET /corpus/{BUCKETS['1-16 KiB']} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
                     "X-Replay-Mode: chunked\r\nX-Replay-Chunk-Size: 1000\r\nX-Replay-Chunk-Delay-Ms: 50\r\n\r\n"
                     .encode())
        time.sleep(0.02)
    deadline = time.monotonic() + 10
    while True:
        after = scrape(nginx.port)
        delta = {name: after[name] - before.get(name, 0) for name in after}
        if delta["rpcedge_responses_aborted"] >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert delta["rpcedge_responses_oneshot"] == 12
    assert delta["rpcedge_responses_small"] == 6
    assert delta["rpcedge_responses_stream"] == 2
    assert delta["rpcedge_responses_untouched"] == 1
    assert delta["rpcedge_responses_failed"] == 0
    # an aborted exchange counts as aborted alone, as in Envoy: none of its bytes
    assert delta["rpcedge_responses_aborted"] == 1
    assert delta["rpcedge_body_bytes_in"] == bytes_in
    assert delta["rpcedge_body_bytes_out"] == bytes_out
    assert delta["rpcedge_compress_time_us"] > 0
    # no thread pool here
    assert delta["rpcedge_offload_posted"] == delta["rpcedge_offload_inline"] == 0
    # without rpcedge_cache, no cache counts
    assert not any(delta[name] for name in delta if name.startswith("rpcedge_cache_"))


def test_only_get_and_head(nginx):
    r = wire.request(nginx.port, "/rpcedge_status", method="POST", body=b"x", accept_encoding=None)
    assert r.status == 405


def test_the_shipped_config_serves_the_counters_to_loopback_only(tmp_path):
    text = shipped_conf("nginx.conf", tmp_path)
    assert "location = /rpcedge_status {\n            rpcedge_status;" in text
    assert "allow 127.0.0.1;\n            deny all;" in text
