"""The same requests through nginx and Envoy, both with rpcedge in front of the same upstream:
the headers that matter and the bytes match, as both hosts only carry out the core's decisions,
and what each client decodes is what the node sent (its recorded answer)."""

import pytest

from testbed import wire
from testbed.envoy_harness import ENVOY_HOSTS, run_envoy
from testbed.harness import LOOPBACK, free_port
from testbed.nginx_harness import start_nginx
from test_nginx import BUCKETS

SERVER = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
            proxy_http_version 1.1;
        }}
    }}
"""

HEADERS_THAT_MATTER = ["content-encoding", "content-length", "vary", "etag", "accept-ranges", "content-range"]

CASES = [
    *[(f"/corpus/{path}", {}, "gzip") for path in BUCKETS.values()],
    *[(f"/corpus/{BUCKETS[b]}", {"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "4096"}, "gzip")
      for b in ("under 1 KiB", "1-16 KiB", "16-256 KiB", "1-4 MiB")],
    (f"/corpus/{BUCKETS['16-256 KiB']}", {}, "gzip;q=0.5, deflate"),
    *[(f"/corpus/{BUCKETS[b]}", {}, accept) for b in ("1-16 KiB", "256 KiB-1 MiB", "1-4 MiB")
      for accept in ("zstd", "br", "gzip, deflate, br, zstd")],
    *[(f"/corpus/{BUCKETS['16-256 KiB']}", {"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "4096"}, accept)
      for accept in ("zstd", "br")],
    (f"/corpus/{BUCKETS['16-256 KiB']}", {}, None),
    (f"/corpus/{BUCKETS['16-256 KiB']}", {"X-Replay-Header": ['ETag: "v7"', "Accept-Ranges: bytes"]}, "gzip"),
    (f"/corpus/{BUCKETS['16-256 KiB']}", {"X-Replay-Header": "Cache-Control: no-transform"}, "gzip"),
    (f"/corpus/{BUCKETS['16-256 KiB']}", {"X-Replay-Status": "206",
                                          "X-Replay-Header": "Content-Range: bytes 0-99/1000"}, "gzip"),
    (f"/corpus/{BUCKETS['1-16 KiB']}", {"X-Replay-Header": "Content-Type: text/html"}, "gzip"),
    (f"/corpus/{BUCKETS['1-16 KiB']}", {"X-Replay-Header": "Content-Type: image/png"}, "gzip"),
]


@pytest.fixture(scope="module")
def hosts(replay, tmp_path_factory):
    port = free_port()
    nginx = start_nginx(tmp_path_factory.mktemp("cross-nginx"),
                        SERVER.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port), [port])
    envoys = {host: run_envoy(tmp_path_factory.mktemp(f"cross-{host}"), replay.port, adapter=adapter)
              for host, adapter in ENVOY_HOSTS.items()}
    yield nginx.port, {host: envoy.port for host, envoy in envoys.items()}
    for envoy in envoys.values():
        envoy.process.stop()
    nginx.stop()


@pytest.mark.parametrize("envoy_host", ENVOY_HOSTS)
@pytest.mark.parametrize("path,headers,accept", CASES)
def test_nginx_and_envoy_send_the_same(hosts, replay, envoy_host, path, headers, accept):
    nginx_port, envoy_ports = hosts
    envoy_port = envoy_ports[envoy_host]
    a = wire.request(nginx_port, path, headers=headers, accept_encoding=accept)
    b = wire.request(envoy_port, path, headers=headers, accept_encoding=accept)
    node = wire.request(replay.port, path, headers=headers, accept_encoding=None)
    assert a.complete and b.complete and node.complete
    # two hosts that garbled alike would still agree with each other
    assert a.decoded() == node.body and b.decoded() == node.body
    assert a.status == b.status
    for name in HEADERS_THAT_MATTER:
        assert (a.header(name) or "").lower() == (b.header(name) or "").lower(), name
    if a.header("content-length") is not None:
        assert a.body == b.body, "one-shot and untouched bodies are byte-identical"
    else:
        # Streamed: where each host flushed may differ, what the client decodes may not.
        assert a.decoded() == b.decoded()
