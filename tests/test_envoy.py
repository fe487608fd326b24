"""rpcedge in real Envoy (1.40) in front of the replay upstream, through both Envoy adapters: the
proxy-wasm filter (V8) and the native dynamic module."""

import json
import re
import socket
import struct
import subprocess
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.envoy_harness import (ADAPTERS, EXAMPLE_PLUGIN_CONFIG, EXAMPLE, NATIVE, NATIVE_SNIPPET, PROMETHEUS_PREFIX, SNIPPET, envoy_binary,
                                   native_entry, render_config, replace_rpcedge_entry, run_envoy, start_envoy)
from testbed.harness import CORPUS, REPO, free_port, start_replay

# The corpus files these tests replay, by the size of their compact response.
CORPUS_FILES = {
    "35B": "ots_getApiLevel/erigon-rpc-tests__mainnet__test_1.json",
    "1022B": "trace_call/erigon-rpc-tests__mainnet__test_06.json",
    "1030B": "eth_getTransactionReceipt/erigon-rpc-tests__mainnet__test_01.json",
    "15KiB": "erigon_getBalanceChangesInBlock/erigon-rpc-tests__mainnet__test_05.json",
    "248KiB": "erigon_getBlockReceiptsByBlockHash/erigon-rpc-tests__mainnet__test_05.json",
    "967KiB": "erigon_getBlockByTimestamp/erigon-rpc-tests__mainnet__test_06.json",
    "1.07MiB": "debug_traceBlockByNumber/erigon-rpc-tests__mainnet__test_14.tar",
    "3.6MiB": "debug_traceBlockByNumber/erigon-rpc-tests__mainnet__test_32.json",
}


def corpus_path(name):
    """The replay's route to the recorded body of a corpus file."""
    return f"/corpus/{CORPUS_FILES[name]}?pair=0"


class Upstream:
    def __init__(self, replay):
        self.replay = replay
        self.port = replay.port
        self._bodies = {}

    def body(self, name):
        """What the upstream sends for a corpus file, fetched directly."""
        if name not in self._bodies:
            status, _, body = self.replay.request("GET", corpus_path(name))
            assert status == 200, f"the replay has no {name}"
            self._bodies[name] = body
        return self._bodies[name]


@pytest.fixture(scope="session")
def envoy_upstream(tmp_path_factory):
    """A replay upstream over the few corpus files these tests use (it loads at once)."""
    corpus = tmp_path_factory.mktemp("envoy-corpus")
    for relative in CORPUS_FILES.values():
        (corpus / relative).parent.mkdir(parents=True, exist_ok=True)
        (corpus / relative).symlink_to(CORPUS / relative)
    replay = start_replay(tmp_path_factory.mktemp("envoy-replay"), corpus=corpus)
    try:
        yield Upstream(replay)
    finally:
        replay.process.stop()


@pytest.fixture(scope="session", params=ADAPTERS)
def adapter(request):
    """Each Envoy adapter in turn: every test that uses it runs against both."""
    return request.param


@pytest.fixture(scope="session")
def envoy(envoy_upstream, adapter, tmp_path_factory):
    """Envoy from the shipped example config on free ports, with the adapter; its requests go
    through `wire`, so a test sees the exact bytes on the wire and when each arrived."""
    envoy = run_envoy(tmp_path_factory.mktemp(f"envoy-{adapter}"), envoy_upstream.port, adapter=adapter)
    try:
        yield envoy
    finally:
        envoy.process.stop()

STREAM_DELAY = 0.100  # the example's stream_delay_ms


def check_validates(config):
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", config, "--disable-hot-restart"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_config_validates():
    check_validates(EXAMPLE)


def test_drop_in_filter_entry_validates(tmp_path):
    # The example with its rpcedge entry replaced by the drop-in one, indented into place.
    entry = "".join(f"          {line}" if line.strip() else line for line in SNIPPET.read_text().splitlines(True))
    config = tmp_path / "with-drop-in.yaml"
    config.write_text(replace_rpcedge_entry(EXAMPLE.read_text(), entry))
    check_validates(config)


def test_the_native_example_validates(tmp_path):
    # The example with the native drop-in entry as it ships (its module path relative to the
    # repository, where Envoy starts), and with the example's settings (the cache on).
    for name, entry in (("as-shipped", "".join(f"          {line}" if line.strip() else line
                                              for line in NATIVE_SNIPPET.read_text().splitlines(True))),
                        ("example-settings", native_entry(EXAMPLE_PLUGIN_CONFIG))):
        config = tmp_path / f"native-{name}.yaml"
        config.write_text(replace_rpcedge_entry(EXAMPLE.read_text(), entry))
        check_validates(config)


def test_the_native_module_imports_only_what_envoy_exports():
    # The loader resolves the module's imports when Envoy loads it: each must be in this Envoy.
    def symbols(path, *flags):
        result = subprocess.run(["nm", "-D", *flags, path], capture_output=True, text=True, check=True)
        return {line.split()[-1] for line in result.stdout.splitlines() if "envoy_dynamic_module" in line}
    imported = symbols(NATIVE, "--undefined-only")
    assert imported and all(name.startswith("envoy_dynamic_module_callback_") for name in imported)
    assert imported <= symbols(envoy_binary(), "--defined-only")


def test_the_native_abi_is_declared_for_the_pinned_envoy(envoy_upstream, tmp_path):
    # abi.rs declares Envoy's dynamic-module ABI by hand, from one Envoy release's abi.h: a
    # callback whose arguments changed in another release would be caught by neither Envoy nor the
    # loader. So the pinned Envoy must be that release, and must say the ABI matched when it loads
    # the module: bumping the pinned Envoy fails here until abi.rs is read against the new abi.h
    # (envoy-filter/README.md, "Keeping in step with the Envoy version").
    abi = (REPO / "envoy-filter" / "native" / "src" / "abi.rs").read_text()
    written_for = re.search(r"\(ABI version `(v[0-9.]+)`, Envoy ([0-9]+\.[0-9]+)\)", abi)
    returned = re.search(r'pub const ABI_VERSION: &std::ffi::CStr = c"([^"]+)";', abi)
    assert written_for and returned and written_for[1] == returned[1], "abi.rs names one ABI version"
    version = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"/([0-9]+\.[0-9]+)\.[0-9]+/", version)
    assert release and release[1] == written_for[2], (
        f"the pinned Envoy is {version.strip()}, but abi.rs was written from Envoy {written_for[2]}'s abi.h: "
        "read the pinned release's abi.h for each callback and hook in abi.rs and lib.rs, then update both")
    envoy = run_envoy(tmp_path, envoy_upstream.port, adapter="native")
    try:
        assert f"Dynamic module ABI version {returned[1]} matched." in envoy.process.log.read_text()
    finally:
        envoy.process.stop()


def refusal(tmp_path, adapter, plugin_config):
    """Envoy's log line refusing `plugin_config`, once Envoy has exited for it."""
    text = render_config(free_port(), free_port(), free_port(), plugin_config, adapter=adapter)
    process = start_envoy(tmp_path, text)
    try:
        returncode = process.proc.wait(timeout=60)
    finally:
        process.stop()
    log = process.log.read_text()
    assert returncode != 0, log[-3000:]
    line = next((l for l in log.splitlines() if "invalid plugin configuration" in l), None)
    assert line is not None, log[-3000:]
    return line


@pytest.mark.parametrize("plugin_config, field", [
    ('{"level": 13}', "level"),
    ('{"stream_level": 0}', "stream_level"),
    ('{"min_length": 4096, "max_buffer": 1024}', "min_length"),
    ('{"types": ["json"]}', "types"),
    ('{"levle": 6}', "levle"),
    ('{"cache": {"timeout_ms": 0}}', "cache_timeout_ms"),
    ('{"cache": {"cluster": ""}}', "cache_cluster"),
    ('{"transcode": true}', "buffer_limit"),
    ('{"transcode": true, "buffer_limit": 2097152}', "buffer_limit"),
    ('{"transcode_max": 9663676416}', "transcode_max"),
    ('{"transcode_budget": -1}', "config"),
])
def test_a_bad_setting_stops_envoy_from_starting(tmp_path, adapter, plugin_config, field):
    assert field in refusal(tmp_path, adapter, plugin_config)


def test_a_plugin_json_that_still_lists_shards_stops_envoy_saying_what_replaced_them(tmp_path, adapter):
    line = refusal(tmp_path, adapter, '{"cache": {"clusters": ["rpcedge_cached_0", "rpcedge_cached_1"]}}')
    assert "cache_clusters: sharding was retired" in line and "--fleet" in line, line


# (corpus file, whether rpcedge compresses it in one shot with an exact length; None: too small)
SIZE_BUCKETS = {
    "<1KiB": ("1022B", None),
    "1-16KiB, just": ("1030B", True),
    "1-16KiB": ("15KiB", True),
    "16-256KiB": ("248KiB", True),
    "256KiB-1MiB": ("967KiB", True),
    ">1MiB": ("3.6MiB", False),
    ">1MiB, just": ("1.07MiB", False),
}


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("bucket", list(SIZE_BUCKETS))
def test_size_buckets(envoy, envoy_upstream, bucket, framing):
    name, oneshot = SIZE_BUCKETS[bucket]
    original = envoy_upstream.body(name)
    response = envoy.request(corpus_path(name), headers={"X-Replay-Mode": framing})
    assert response.status == 200 and response.complete
    assert response.header("vary") == "Accept-Encoding"
    if oneshot is None:
        # Small: untouched, with its exact length, even when it came chunked.
        assert response.header("content-encoding") is None
        assert response.body == original
        assert response.header("content-length") == str(len(original))
        return
    assert response.header("content-encoding") == "gzip"
    assert response.decoded() == original
    if oneshot:
        # Buffered whole (a chunked body that ends within max_buffer too): exact length.
        assert response.header("content-length") == str(len(response.body))
        assert not response.chunked
    else:
        assert response.header("content-length") is None and response.chunked
    assert len(response.body) < len(original)


def test_a_json_rpc_post_is_compressed(envoy, envoy_upstream):
    recorded = json.loads((envoy_upstream.replay.corpus / CORPUS_FILES["15KiB"]).read_text())[0]
    response = envoy.request("/", method="POST", body=json.dumps(recorded["request"]).encode(),
                             headers={"Content-Type": "application/json"})
    assert response.status == 200
    assert response.header("content-encoding") == "gzip"
    assert response.header("content-length") == str(len(response.body))
    assert json.loads(response.decoded()) == recorded["response"]


@pytest.mark.parametrize("coding", ["gzip", "zstd", "br"])
def test_a_trickling_body_arrives_chunk_by_chunk(envoy, envoy_upstream, coding):
    # Four chunks 500 ms apart, each due at the client within stream_delay + 100 ms of the time
    # the upstream sent it (sent times are counted from the request, so never late).
    original = envoy_upstream.body("15KiB")
    size, delay = 4000, 0.5
    response = envoy.request(corpus_path("15KiB"), accept_encoding=coding, headers={
        "X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": str(size), "X-Replay-Chunk-Delay-Ms": str(int(delay * 1000)),
    })
    assert response.complete and response.decoded() == original
    assert response.header("content-encoding") == coding and response.chunked
    progress = response.decoded_over_time()
    for index in range(4):
        wanted = min((index + 1) * size, len(original))
        arrived = next(seconds for seconds, decoded in progress if decoded >= wanted)
        assert arrived - index * delay <= STREAM_DELAY + 0.100, (index, progress)


def test_bodies_that_stream_then_pause_keep_every_byte(envoy, envoy_upstream):
    # Fast parts, pauses longer and shorter than stream_delay: every path between body callbacks
    # and timer ticks, concurrently.
    pacing = {"248KiB": ((65536, 0), (100000, 120), (7000, 30)), "967KiB": ((65536, 0), (100000, 120), (20000, 30)),
              "3.6MiB": ((65536, 0), (300000, 250))}
    cases = [(name, framing, chunk, pause) for name, paces in pacing.items() for framing in ("length", "chunked")
             for chunk, pause in paces]

    def fetch(case):
        name, framing, chunk, pause = case
        response = envoy.request(corpus_path(name), headers={
            "X-Replay-Mode": framing, "X-Replay-Chunk-Size": str(chunk), "X-Replay-Chunk-Delay-Ms": str(pause)})
        return response.complete and response.decoded() == envoy_upstream.body(name)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(fetch, cases))
    assert all(results), [case for case, ok in zip(cases, results) if not ok]


@pytest.mark.parametrize("case, request_headers, method", [
    ("HEAD", {}, "HEAD"),
    ("204", {"X-Replay-Status": "204"}, "GET"),
    ("304", {"X-Replay-Status": "304"}, "GET"),
    ("206", {"X-Replay-Status": "206", "X-Replay-Header": "Content-Range: bytes 0-15721/15722"}, "GET"),
    ("Content-Range", {"X-Replay-Header": "Content-Range: bytes 0-15721/15722"}, "GET"),
    ("no-transform", {"X-Replay-Header": "Cache-Control: public, no-transform"}, "GET"),
    ("already encoded", {"X-Replay-Header": "Content-Encoding: br"}, "GET"),
    ("other type", {"X-Replay-Header": "Content-Type: application/octet-stream"}, "GET"),
])
def test_untouched_responses(envoy, envoy_upstream, case, request_headers, method):
    original = envoy_upstream.body("15KiB")
    for framing in ("length", "chunked"):
        response = envoy.request(corpus_path("15KiB"), method=method, headers={**request_headers, "X-Replay-Mode": framing})
        assert response.complete, case
        assert response.header("content-encoding") in (None, "br"), case
        if method == "GET" and response.status not in (204, 304):
            assert response.body == original, case
        if framing == "length" and response.status not in (204, 304):
            assert response.header("content-length") == str(len(original)), case


@pytest.mark.parametrize("accept, coding", [
    ("gzip", "gzip"),
    ("GZIP;q=0.5, identity;q=0.4", "gzip"),
    ("identity;q=0, *;q=0.1", "gzip"),
    ("deflate", "deflate"),
    ("gzip;q=0.5, deflate;q=0.8", "deflate"),
    ("gzip;q=0", None),
    ("br", "br"),
    ("zstd", "zstd"),
    ("gzip, deflate, br, zstd", "zstd"),
    ("zstd;q=0, *", "gzip"),
    ("zstd;q=0, gzip;q=0, *", "br"),
    ("compress", None),
    ("gzip;q=0.5, identity", None),
    (None, None),
])
def test_accept_encoding_q_values(envoy, envoy_upstream, accept, coding):
    original = envoy_upstream.body("15KiB")
    response = envoy.request(corpus_path("15KiB"), accept_encoding=accept)
    assert response.header("content-encoding") == coding
    assert response.decoded() == original
    assert response.header("content-length") == str(len(response.body))
    # Every response of a compressible type varies on Accept-Encoding, identity or not.
    assert response.header("vary") == "Accept-Encoding"


def test_vary_etag_and_accept_ranges(envoy):
    extra = {"X-Replay-Header": ['ETag: "abc"', "Vary: Origin", "Accept-Ranges: bytes"]}
    compressed = envoy.request(corpus_path("15KiB"), headers=extra)
    assert compressed.header("content-encoding") == "gzip"
    assert compressed.header("etag") == 'W/"abc"'
    assert [v.strip() for v in compressed.header("vary").split(",")] == ["Origin", "Accept-Encoding"]
    assert compressed.header("accept-ranges") is None

    identity = envoy.request(corpus_path("15KiB"), headers=extra, accept_encoding="identity")
    assert identity.header("content-encoding") is None
    assert identity.header("etag") == '"abc"'
    assert identity.header("accept-ranges") == "bytes"

    weak = envoy.request(corpus_path("15KiB"), headers={"X-Replay-Header": 'ETag: W/"abc"'})
    assert weak.header("content-encoding") == "gzip" and weak.header("etag") == 'W/"abc"'

    already = envoy.request(corpus_path("15KiB"), headers={"X-Replay-Header": "Vary: accept-encoding"})
    assert already.header("vary") == "accept-encoding"


@pytest.mark.parametrize("name, oneshot", [("967KiB", True), ("3.6MiB", False)])
def test_an_http2_client(envoy, envoy_upstream, tmp_path, name, oneshot):
    body, head = tmp_path / "body", tmp_path / "head"
    subprocess.run(
        ["curl", "-sS", "--fail", "--http2-prior-knowledge", "-H", "Accept-Encoding: gzip", "-H", "X-Replay-Mode: chunked",
         "-D", head, "-o", body, f"http://127.0.0.1:{envoy.port}{corpus_path(name)}"],
        check=True, timeout=60,
    )
    lines = head.read_text().splitlines()
    assert lines[0].startswith("HTTP/2 200")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    assert headers["content-encoding"] == "gzip"
    data = body.read_bytes()
    assert zlib.decompress(data, wbits=31) == envoy_upstream.body(name)
    assert headers.get("content-length") == (str(len(data)) if oneshot else None)


def test_an_upstream_reset_while_buffering_is_an_error(envoy):
    for framing in ("length", "chunked"):
        response = envoy.request(corpus_path("967KiB"), headers={"X-Replay-Mode": framing, "X-Replay-Reset-After": "300000"})
        # The headers were still held: Envoy answers with its own error.
        assert response.status == 502, framing
        assert response.header("content-encoding") is None


def test_an_upstream_reset_while_streaming_truncates(envoy, envoy_upstream):
    # Paced, so that Envoy has read everything the upstream sent before its reset (which drops
    # whatever the reader had not read yet).
    for framing in ("length", "chunked"):
        response = envoy.request(corpus_path("3.6MiB"), headers={
            "X-Replay-Mode": framing, "X-Replay-Reset-After": "2000000", "X-Replay-Chunk-Size": "131072", "X-Replay-Chunk-Delay-Ms": "20"})
        assert response.status == 200 and response.header("content-encoding") == "gzip"
        assert not response.complete, framing
        inflater = zlib.decompressobj(wbits=31)
        inflater.decompress(response.body)
        assert not inflater.eof, "a truncated stream must not look like a whole gzip member"
    check_streams_after_failures(envoy, envoy_upstream)


def check_streams_after_failures(envoy, envoy_upstream):
    # Exchanges cut short must leave nothing behind (e.g. in pooled compressors) that taints
    # the next ones, on either worker.
    for _ in range(4):
        response = envoy.request(corpus_path("3.6MiB"), headers={"X-Replay-Mode": "chunked"})
        assert response.complete and response.decoded() == envoy_upstream.body("3.6MiB")


def test_envoy_serves_on_after_clients_abort(envoy, envoy_upstream):
    before = envoy.counters()
    for name, framing in (("3.6MiB", "chunked"), ("967KiB", "chunked"), ("248KiB", "length")):
        with socket.create_connection(("127.0.0.1", envoy.port)) as sock:
            sock.sendall((f"GET {corpus_path(name)} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
                          f"X-Replay-Mode: {framing}\r\nX-Replay-Chunk-Size: 50000\r\nX-Replay-Chunk-Delay-Ms: 150\r\n\r\n").encode())
            if name == "3.6MiB":
                sock.recv(1024)  # abort mid-stream, after the first bytes
            else:
                time.sleep(0.2)  # abort while rpcedge holds the headers
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.5)  # past the deadlines of the aborted exchanges
    response = envoy.request(corpus_path("967KiB"))
    assert response.status == 200 and response.decoded() == envoy_upstream.body("967KiB")
    check_streams_after_failures(envoy, envoy_upstream)
    assert envoy.process.proc.poll() is None
    after = envoy.counters()
    assert after["responses.failed"] == before["responses.failed"]
    assert after["responses.aborted"] == before["responses.aborted"] + 3, "each abort counted once"
    assert "panicked" not in envoy.process.log.read_text()


def test_stats(envoy, envoy_upstream):
    before = envoy.counters()
    envoy.request(corpus_path("967KiB"))
    envoy.request(corpus_path("3.6MiB"))
    envoy.request(corpus_path("35B"))
    envoy.request(corpus_path("15KiB"), accept_encoding="identity")
    after = envoy.counters()
    for mode in ("oneshot", "stream", "small", "untouched"):
        assert after[f"responses.{mode}"] == before[f"responses.{mode}"] + 1, mode
    assert {"responses.incompressible", "responses.failed"} <= set(after)
    bytes_in = after["body_bytes_in"] - before["body_bytes_in"]
    bytes_out = after["body_bytes_out"] - before["body_bytes_out"]
    assert bytes_in == len(envoy_upstream.body("967KiB")) + len(envoy_upstream.body("3.6MiB"))
    assert 0 < bytes_out < bytes_in
    assert after["compress_time_us"] > before["compress_time_us"]
    prometheus = envoy.admin_get("/stats/prometheus")
    prefix = PROMETHEUS_PREFIX[envoy.adapter]
    for name in ("responses_oneshot", "responses_aborted", "body_bytes_in", "compress_time_us"):
        assert f"\n{prefix}{name}{{}} " in prometheus, name
    # one compression time per compressed exchange; Envoy merges histograms at its stats flush (5 s)
    deadline = time.monotonic() + 15
    while True:
        count = re.search(rf"\n{prefix}compress_duration_us_count\{{\}} (\d+)", envoy.admin_get("/stats/prometheus"))
        if count and int(count.group(1)) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert count and int(count.group(1)) >= 2


def test_buffer_limits_far_below_the_body_are_enough(envoy_upstream, adapter, tmp_path):
    # rpcedge keeps the body it buffers: Envoy only needs room for max_buffer and one upstream
    # read, however big the response.
    text = EXAMPLE.read_text()
    for old, new in (("    per_connection_buffer_limit_bytes: 68157440\n", "    per_connection_buffer_limit_bytes: 262144\n"),
                     ("    per_connection_buffer_limit_bytes: 1048576\n", "    per_connection_buffer_limit_bytes: 65536\n")):
        assert text.count(old) == 1
        text = text.replace(old, new)
    plugin_config = '{"max_buffer": 131072, "buffer_limit": 262144}'
    envoy = run_envoy(tmp_path, envoy_upstream.port, plugin_config, text=text, name="envoy-small-limits",
                      adapter=adapter)
    try:
        for name, oneshot in (("15KiB", True), ("248KiB", False), ("3.6MiB", False)):
            for framing in ("length", "chunked"):
                response = envoy.request(corpus_path(name), headers={"X-Replay-Mode": framing})
                assert response.status == 200 and response.complete, (name, framing)
                assert response.decoded() == envoy_upstream.body(name), (name, framing)
                assert (response.header("content-length") is not None) == oneshot, (name, framing)
    finally:
        envoy.process.stop()


H2_CLUSTER = """
  - name: node_h2
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: node_h2
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{address: 127.0.0.1, port_value: {port}}}
"""
H2_ROUTE = """              - match: {prefix: "/h2/"}
                route: {cluster: node_h2, timeout: 120s}
"""


@pytest.mark.parametrize("name, chunk, delay, oneshot", [
    ("3.6MiB", 131072, 0.02, False),  # streamed, its end in the trailers
    ("3.6MiB", 1 << 22, 0.0, False),  # the last body callback sent output: Envoy holds no body
    ("15KiB", 15000, 0.3, False),  # a tick streamed it, and resumed, before the trailers
    ("248KiB", 16384, 0.0, True),  # buffered whole: the trailers end it
    ("15KiB", 4096, 0.15, False),  # pauses past stream_delay: streamed from a tick
    ("1022B", 1022, 0.0, None),  # below min_length
])
def test_an_http2_upstream_that_sends_trailers(envoy_upstream, adapter, tmp_path, name, chunk, delay, oneshot):
    from testbed.h2_upstream import TrailersUpstream
    body = envoy_upstream.body(name)
    upstream = TrailersUpstream(body, chunk=chunk, delay=delay)
    text = EXAMPLE.read_text()
    text = text.replace('              - match: {prefix: "/"}\n', H2_ROUTE + '              - match: {prefix: "/"}\n', 1)
    text = text.rstrip("\n") + "\n" + H2_CLUSTER.format(port=upstream.port)
    envoy = run_envoy(tmp_path, envoy_upstream.port, text=text, name="envoy-h2-trailers", adapter=adapter)
    try:
        for _ in range(2):
            response = envoy.request("/h2/anything")
            assert response.status == 200 and response.complete, response.raw[-200:]
            assert response.decoded() == body
            if oneshot is None:
                assert response.header("content-encoding") is None
            else:
                assert response.header("content-encoding") == "gzip"
                assert (response.header("content-length") is not None) == oneshot
        assert envoy.counters()["responses.failed"] == 0
        assert envoy.process.proc.poll() is None
    finally:
        envoy.process.stop()
        upstream.stop()
