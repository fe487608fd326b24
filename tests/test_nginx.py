"""rpcedge in real nginx (Debian's stock binary, the module loaded with load_module) in front of the
replay upstream: what a client gets on the wire."""

import gzip
import json
import socket
import subprocess
import time
import zlib

import pytest

from testbed import replay_corpus as rc
from testbed import wire
from testbed.fastcgi_upstream import FastCgi
from testbed.harness import CORPUS
from testbed.nginx_harness import LOOPBACK, check_conf, free_port, main_conf, shipped_conf, start_nginx

MIB = 1 << 20

# One recorded response per size bucket of the corpus (compact size in the comment).
BUCKETS = {
    "under 1 KiB": "eth_call/erigon-rpc-tests__arb-sepolia__test_13.json",  # 102 B
    "1-16 KiB": "debug_traceTransaction/erigon-rpc-tests__mainnet__test_60.json",  # 4 KiB
    "16-256 KiB": "erigon_getLatestLogs/erigon-rpc-tests__mainnet__test_10.json",  # 56 KiB
    "256 KiB-1 MiB": "debug_traceBlockByHash/erigon-rpc-tests__mainnet__test_13.tar",  # 409 KiB
    "1-4 MiB": "trace_replayTransaction/erigon-rpc-tests__mainnet__test_10.tar",  # 1.5 MiB
    "over 4 MiB": "debug_traceTransaction/erigon-rpc-tests__mainnet__test_116.tar",  # 11.7 MiB
}

SERVER = """
    upstream replay {{
        server {LOOPBACK}:{replay_port};
        keepalive 16;
    }}

    # settings merged from server to location to if
    server {{
        listen {LOOPBACK}:{merged_port};

        rpcedge on;
        rpcedge_level 1;
        rpcedge_min_length 8k;

        location / {{
            proxy_pass http://replay;
        }}

        location /override/ {{
            rpcedge_min_length 1k;

            if ($http_x_rpcedge_off) {{
                rpcedge off;
            }}

            proxy_pass http://replay/;
        }}
    }}

    server {{
        listen {LOOPBACK}:{port};
        listen {LOOPBACK}:{h2_port} http2;
        # a slow reader's socket fills at once
        listen {LOOPBACK}:{slow_port} sndbuf=8k;

        rpcedge on;

        proxy_http_version 1.1;
        proxy_set_header Connection "";

        location / {{
            proxy_pass http://replay;
        }}

        location /unbuffered/ {{
            proxy_buffering off;
            proxy_pass http://replay/;
        }}

        location /level1/ {{
            rpcedge_level 1;
            proxy_pass http://replay/;
        }}

        location /level5/ {{
            rpcedge_level 5;
            proxy_pass http://replay/;
        }}

        location /gzipfirst/ {{
            rpcedge_encodings gzip br;
            proxy_pass http://replay/;
        }}

        location /off/ {{
            rpcedge off;
            proxy_pass http://replay/;
        }}

        # one-shot output larger than the filter's 32 output buffers
        location /big/ {{
            rpcedge_max_buffer 16m;
            proxy_pass http://replay/;
        }}

        location /static/ {{
            alias {static}/;
            types {{ application/json json; }}
        }}

        location /broken/ {{
            proxy_pass http://{LOOPBACK}:{dead_port}/;
        }}

        # body and header filters that run above rpcedge see identity bytes
        location /sub/ {{
            sub_filter '"jsonrpc":"2.0"' '"jsonrpc":"2.0","via":"nginx"';
            sub_filter_types application/json;
            sub_filter_once off;
            proxy_pass http://replay/;
        }}

        location /addition/ {{
            add_after_body /corpus/{bucket_small};
            addition_types application/json;
            proxy_pass http://replay/;
        }}

        # nginx's gzip beside rpcedge: one of them compresses, Vary goes out once
        location /gzip/ {{
            gzip on;
            gzip_vary on;
            gzip_min_length 20;
            gzip_types application/json;
            proxy_pass http://replay/;
        }}

        # a response rpcedge fails on is answered with an error page where rpcedge is off
        location /failover/ {{
            error_page 502 = /fallback/{bucket_1k_slug}.json;
            proxy_pass http://replay/;
        }}

        location /fallback/ {{
            rpcedge off;
            alias {static}/;
            types {{ application/json json; }}
        }}

        location = /status {{
            stub_status;
        }}

        location /notransform/ {{
            add_header Cache-Control no-transform;
            proxy_pass http://replay/;
        }}

        location /fcgi/ {{
            fastcgi_pass {LOOPBACK}:{fastcgi_port};
            fastcgi_param REQUEST_URI $request_uri;
        }}

        location = /empty.json {{
            default_type application/json;
            return 200 "";
        }}

        location = /missing.json {{
            error_page 404 /corpus/{bucket_1k};
            return 404;
        }}
    }}
"""


@pytest.fixture(scope="module")
def fastcgi(replay):
    upstream = FastCgi(recorded(replay, BUCKETS["16-256 KiB"]))
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def nginx(replay, fastcgi, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("nginx")
    static = prefix / "static"
    static.mkdir()
    for name, path in BUCKETS.items():
        (static / f"{slug(name)}.json").write_bytes(recorded(replay, path))
    ports = [free_port() for _ in range(4)]
    body = SERVER.format(LOOPBACK=LOOPBACK, replay_port=replay.port, port=ports[0], h2_port=ports[1],
                         slow_port=ports[2], merged_port=ports[3],
                         static=static, dead_port=free_port(), bucket_1k=BUCKETS["1-16 KiB"],
                         bucket_small=BUCKETS["under 1 KiB"], bucket_1k_slug=slug("1-16 KiB"),
                         fastcgi_port=fastcgi.port)
    server = start_nginx(prefix, body, ports)
    yield server
    server.stop()


def slug(name):
    return name.replace(" ", "-")


_recorded = {}


def recorded(replay, path):
    """The recorded body as the replay serves it, fetched directly (identity)."""
    if path not in _recorded:
        status, _, body = replay.request("GET", f"/corpus/{path}")
        assert status == 200
        _recorded[path] = body
    return _recorded[path]


def get(nginx, path, accept_encoding="gzip", headers=None, method="GET", port=None, **kw):
    return wire.request(port or nginx.port, path, method=method, headers=headers,
                        accept_encoding=accept_encoding, **kw)


def last_log(nginx, uri):
    """The access log fields (uri status mode ratio bytes_sent) of the last request for `uri`."""
    for _ in range(50):
        lines = [line.split() for line in nginx.access_log() if line.startswith(uri + " ")]
        if lines:
            return lines[-1]
        time.sleep(0.05)
    raise AssertionError(f"no access log line for {uri}")


# --- size buckets ------------------------------------------------------------------------------


@pytest.mark.parametrize("bucket", BUCKETS)
def test_every_size_bucket_arrives_byte_identical(nginx, replay, bucket):
    path = BUCKETS[bucket]
    original = recorded(replay, path)
    r = get(nginx, f"/corpus/{path}")
    assert r.status == 200 and r.complete
    assert r.header("vary") == "Accept-Encoding"
    if len(original) < 1024:
        assert r.header("content-encoding") is None
        assert r.header("content-length") == str(len(original))
        assert r.body == original
        assert last_log(nginx, f"/corpus/{path}")[2] == "small"
    elif len(original) <= MIB:
        assert r.header("content-encoding") == "gzip"
        assert r.header("content-length") == str(len(r.body)), "exact compressed Content-Length"
        assert not r.chunked
        assert gzip.decompress(r.body) == original
        assert last_log(nginx, f"/corpus/{path}")[2] == "oneshot"
    else:
        # Known length above max_buffer: streamed from the start, chunked.
        assert r.header("content-encoding") == "gzip"
        assert r.header("content-length") is None and r.chunked
        assert gzip.decompress(r.body) == original
        assert last_log(nginx, f"/corpus/{path}")[2] == "stream"


@pytest.mark.parametrize("coding", ["zstd", "br"])
@pytest.mark.parametrize("bucket", BUCKETS)
def test_every_size_bucket_arrives_whole_in_zstd_and_br(nginx, replay, bucket, coding):
    path = BUCKETS[bucket]
    original = recorded(replay, path)
    r = get(nginx, f"/corpus/{path}", accept_encoding=f"{coding}, gzip;q=0.5, deflate;q=0.5")
    assert r.status == 200 and r.complete and r.header("vary") == "Accept-Encoding"
    if len(original) < 1024:
        assert r.header("content-encoding") is None and r.body == original
        return
    assert r.header("content-encoding") == coding
    if len(original) <= MIB:
        assert r.header("content-length") == str(len(r.body)) and not r.chunked, "exact compressed Content-Length"
        assert len(r.body) < len(original)
    else:
        assert r.header("content-length") is None and r.chunked
    assert r.decoded() == original


@pytest.mark.parametrize("bucket", ["1-16 KiB", "16-256 KiB", "256 KiB-1 MiB"])
def test_static_files_are_compressed_like_proxied_ones(nginx, replay, bucket):
    original = recorded(replay, BUCKETS[bucket])
    r = get(nginx, f"/static/{slug(bucket)}.json")
    assert r.header("content-encoding") == "gzip"
    assert r.header("content-length") == str(len(r.body))
    assert gzip.decompress(r.body) == original
    assert r.header("etag").startswith('W/"'), "a static file's strong ETag is weakened"
    assert r.header("accept-ranges") is None


def test_fastcgi_responses_are_compressed_with_an_exact_length(nginx, replay):
    r = get(nginx, "/fcgi/anything")
    assert r.status == 200 and r.complete
    assert r.header("content-encoding") == "gzip"
    assert r.header("content-length") == str(len(r.body)), "FastCGI has no length: buffered, then exact"
    assert gzip.decompress(r.body) == recorded(replay, BUCKETS["16-256 KiB"])


def test_json_rpc_post_through_nginx(nginx, replay):
    """A recorded request, posted as a client would, answered by the replay through nginx."""
    path = BUCKETS["16-256 KiB"]
    request, _ = rc.read_pairs(CORPUS / path)[0]
    request = dict(request, id="rpcedge-7")
    network = rc.network_of(path)
    direct = replay.request("POST", f"/{network}", body=rc.compact(request),
                            headers={"Content-Type": "application/json"})[2]
    r = get(nginx, f"/{network}", method="POST", body=rc.compact(request),
            headers={"Content-Type": "application/json"})
    assert r.status == 200
    assert r.header("content-encoding") == "gzip" and r.header("content-length") == str(len(r.body))
    assert gzip.decompress(r.body) == direct
    assert json.loads(direct)["id"] == "rpcedge-7"


def test_chunked_body_ending_within_max_buffer_gets_an_exact_length(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/corpus/{path}", headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "4096"})
    assert r.header("content-encoding") == "gzip"
    assert not r.chunked
    assert r.header("content-length") == str(len(r.body))
    assert gzip.decompress(r.body) == recorded(replay, path)


def test_small_chunked_body_gets_its_own_exact_length(nginx, replay):
    path = BUCKETS["under 1 KiB"]
    r = get(nginx, f"/corpus/{path}", headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "10"})
    assert r.header("content-encoding") is None
    assert r.header("content-length") == str(len(recorded(replay, path)))
    assert r.body == recorded(replay, path)


def test_chunked_body_past_max_buffer_streams(nginx, replay):
    path = BUCKETS["1-4 MiB"]
    r = get(nginx, f"/corpus/{path}", headers={"X-Replay-Mode": "chunked"})
    assert r.header("content-encoding") == "gzip" and r.chunked
    assert gzip.decompress(r.body) == recorded(replay, path)


@pytest.mark.parametrize("coding", ["gzip", "zstd", "br"])
@pytest.mark.parametrize("prefix", ["", "/unbuffered"])
def test_a_trickling_body_reaches_the_client_chunk_by_chunk(nginx, replay, prefix, coding):
    path = BUCKETS["1-16 KiB"]
    original = recorded(replay, path)
    chunk = len(original) // 4 + 1
    r = get(nginx, f"{prefix}/corpus/{path}", accept_encoding=coding,
            headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": str(chunk),
                     "X-Replay-Chunk-Delay-Ms": "500"})
    assert r.header("content-encoding") == coding and r.chunked
    assert r.decoded() == original
    progress = r.decoded_over_time()
    # The upstream sends chunk i at about i * 500 ms (stream_delay is 100 ms): each chunk reaches
    # the client before the upstream can have sent the next one, so none was held for it. (That
    # bound, not chunk i's own time and a tenth of a second, leaves a loaded 2-CPU machine 0.4 s.)
    for i in range(4):
        wanted = min(len(original), (i + 1) * chunk)
        arrived = next((t for t, n in progress if n >= wanted), None)
        assert arrived is not None and arrived < (i + 1) * 0.5, (i, progress)


@pytest.mark.parametrize("prefix", ["/unbuffered", ""])
def test_a_small_flushed_answer_is_not_streamed(nginx, replay, prefix):
    """Unbuffered proxying (or X-Accel-Buffering: no) marks every buffer as a flush: a small
    answer still goes out whole, untouched, with its exact length, not as chunked gzip."""
    path = BUCKETS["under 1 KiB"]
    original = recorded(replay, path)
    r = get(nginx, f"{prefix}/corpus/{path}",
            headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "30", "X-Replay-Flush": "1"})
    assert r.status == 200 and r.complete and not r.chunked
    assert r.header("content-encoding") is None
    assert r.header("content-length") == str(len(original)) and r.body == original
    assert last_log(nginx, f"{prefix}/corpus/{path}")[2] == "small"


def test_a_flush_with_min_length_held_streams(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/unbuffered/corpus/{path}",
            headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "512", "X-Replay-Flush": "1"})
    assert r.header("content-encoding") == "gzip" and r.chunked
    assert gzip.decompress(r.body) == recorded(replay, path)
    assert last_log(nginx, f"/unbuffered/corpus/{path}")[2] == "stream"


def test_keep_alive_after_held_streamed_and_small_responses(nginx, replay):
    paths = [f"/corpus/{BUCKETS['16-256 KiB']}", f"/corpus/{BUCKETS['1-4 MiB']}",
             f"/corpus/{BUCKETS['under 1 KiB']}", f"/unbuffered/corpus/{BUCKETS['1-16 KiB']}",
             f"/static/{slug('1-16 KiB')}.json", f"/corpus/{BUCKETS['16-256 KiB']}"]
    responses = wire.keep_alive(nginx.port, paths)
    for path, r in zip(paths, responses):
        original = recorded(replay, path.split("/corpus/")[-1]) if "/corpus/" in path \
            else recorded(replay, BUCKETS["1-16 KiB"])
        assert r.status == 200 and r.decoded() == original, path
    assert responses[1].chunked and responses[0].header("content-length") is not None


def test_content_length_zero(nginx):
    r = get(nginx, "/empty.json")
    assert r.status == 200 and r.complete and r.body == b""
    assert r.header("content-length") == "0" and r.header("content-encoding") is None


@pytest.mark.parametrize("bucket, burst", [
    ("1-4 MiB", 1_200_000),  # the timer releases the tail while the client's socket is full
    ("over 4 MiB", 9_000_000),  # and the output buffers are all on their way too
])
def test_held_output_reaches_a_slow_client_without_waiting_for_the_upstream(nginx, replay, bucket, burst):
    """A burst streams (past max_buffer) and its compressed tail is released by the timer while
    the client's socket is full; the upstream then pauses for 3 s. Once the client reads, all of
    the burst must arrive at once, not with the upstream's next chunk."""
    path = BUCKETS[bucket]
    original = recorded(replay, path)
    r = wire.request(nginx.ports[2], f"/corpus/{path}", rcvbuf=4096, read_after=0.5, headers={
        "X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": str(burst), "X-Replay-Chunk-Delay-Ms": "3000"})
    assert r.complete and gzip.decompress(r.body) == original
    progress = r.decoded_over_time()
    # Less one partly filled upstream buffer (proxy_buffer_size), which nginx's event pipe keeps
    # until the upstream sends more, with rpcedge or without.
    arrived = next(t for t, n in progress if n >= burst - 4096)
    assert arrived < 2.0, f"the burst was whole only at {arrived:.2f} s (the upstream resumed at 3 s)"


def test_one_shot_output_past_the_output_buffers_reaches_a_paused_client(nginx, replay):
    """An 11.7 MiB answer compressed in one shot makes about 38 output buffers of 32 KiB: the
    filter hands 32 to the client's socket, then waits for it. The upstream is done by then, so
    nothing but the client's write events can move the rest."""
    path = BUCKETS["over 4 MiB"]
    original = recorded(replay, path)
    r = wire.request(nginx.ports[2], f"/big/corpus/{path}", rcvbuf=4096, read_after=1.0)
    assert r.status == 200 and r.complete
    assert r.header("content-length") == str(len(r.body)) and gzip.decompress(r.body) == original
    assert len(r.body) > 32 * 32768
    gaps = [later - earlier for (earlier, _), (later, _) in zip(r.arrivals, r.arrivals[1:])]
    assert max(gaps) < 1.0, f"the output stalled for {max(gaps):.2f} s"


def test_settings_merge_from_server_to_location_and_if(nginx, replay):
    merged = nginx.ports[3]
    small, medium = BUCKETS["1-16 KiB"], BUCKETS["16-256 KiB"]  # 4 KiB, 56 KiB
    level1 = get(nginx, f"/level1/corpus/{medium}")
    # Inherited from the server: level 1, min_length 8k.
    r = get(nginx, f"/corpus/{medium}", port=merged)
    assert r.header("content-encoding") == "gzip" and r.body == level1.body
    r = get(nginx, f"/corpus/{small}", port=merged)
    assert r.header("content-encoding") is None and r.body == recorded(replay, small)
    # The location lowers min_length and keeps the server's level.
    r = get(nginx, f"/override/corpus/{small}", port=merged)
    assert r.header("content-encoding") == "gzip"
    assert r.body == get(nginx, f"/level1/corpus/{small}").body
    # An if block turns it off.
    r = get(nginx, f"/override/corpus/{medium}", port=merged, headers={"X-Rpcedge-Off": "1"})
    assert r.header("content-encoding") is None and r.header("vary") is None
    assert r.body == recorded(replay, medium)


# --- what stays untouched ----------------------------------------------------------------------


def test_head_is_untouched(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/corpus/{path}", method="HEAD")
    assert r.status == 200 and r.complete and not r.raw
    assert r.header("content-encoding") is None
    assert r.header("content-length") == str(len(recorded(replay, path)))


@pytest.mark.parametrize("status", [204, 304])
def test_bodiless_statuses_are_untouched(nginx, status):
    r = get(nginx, f"/corpus/{BUCKETS['16-256 KiB']}", headers={"X-Replay-Status": str(status)})
    assert r.status == status and r.complete and not r.raw
    assert r.header("content-encoding") is None


@pytest.mark.parametrize("extra", [
    {"X-Replay-Status": "206", "X-Replay-Header": "Content-Range: bytes 0-99/1000"},
    {"X-Replay-Header": "Cache-Control: public, no-transform"},
    {"X-Replay-Header": "Content-Encoding: identity-but-not-really"},
    {"X-Replay-Header": "Content-Type: application/octet-stream"},
], ids=["206", "no-transform", "already-encoded", "other-type"])
def test_ineligible_responses_are_untouched(nginx, replay, extra):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/corpus/{path}", headers=extra)
    assert r.header("content-encoding") in (None, "identity-but-not-really")
    assert r.header("content-length") == str(len(recorded(replay, path)))
    assert r.body == recorded(replay, path)
    assert last_log(nginx, f"/corpus/{path}")[2] == "untouched"


def test_filters_above_rpcedge_see_identity_bytes(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    original = recorded(replay, path)
    sub = get(nginx, f"/sub/corpus/{path}")
    assert sub.header("content-encoding") == "gzip" and sub.complete
    assert gzip.decompress(sub.body) == original.replace(b'"jsonrpc":"2.0"', b'"jsonrpc":"2.0","via":"nginx"')
    added = get(nginx, f"/addition/corpus/{path}")
    assert added.complete
    assert added.decoded() == original + recorded(replay, BUCKETS["under 1 KiB"])
    assert "alert" not in nginx.error_log()


def test_add_header_no_transform_is_honoured(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/notransform/corpus/{path}")
    assert r.header("content-encoding") is None
    assert r.body == recorded(replay, path)


@pytest.mark.parametrize("bucket, accept, ranged", [
    ("under 1 KiB", "gzip", True),  # too small to compress: the range applies
    ("under 1 KiB", None, True),
    ("16-256 KiB", None, True),  # identity for this client: the range applies
    ("16-256 KiB", "gzip", False),  # compressed: the whole body, as nginx's gzip does
])
def test_range_requests_get_consistent_answers(nginx, replay, bucket, accept, ranged):
    original = recorded(replay, BUCKETS[bucket])
    r = get(nginx, f"/static/{slug(bucket)}.json", accept_encoding=accept, headers={"Range": "bytes=0-9"})
    assert r.complete
    if ranged:
        assert r.status == 206 and r.header("content-encoding") is None and r.body == original[:10]
        assert r.header("content-range") == f"bytes 0-9/{len(original)}"
    else:
        assert r.status == 200 and r.header("content-range") is None
        assert r.header("content-encoding") == "gzip" and r.decoded() == original


def test_rpcedge_off_leaves_responses_alone(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/off/corpus/{path}")
    assert r.header("content-encoding") is None and r.header("vary") is None
    assert r.body == recorded(replay, path)


# --- headers -----------------------------------------------------------------------------------


def test_vary_and_etag_rules(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    strong = get(nginx, f"/corpus/{path}", headers={"X-Replay-Header": ['ETag: "v1"', "Accept-Ranges: bytes"]})
    assert strong.header("etag") == 'W/"v1"'
    assert strong.header("accept-ranges") is None
    assert strong.header_count("vary") == 1

    identity = get(nginx, f"/corpus/{path}", accept_encoding=None, headers={"X-Replay-Header": 'ETag: "v1"'})
    assert identity.header("content-encoding") is None
    assert identity.header("etag") == '"v1"', "an identity response keeps its strong ETag"
    assert identity.header("vary") == "Accept-Encoding", "Vary even when identity was sent"

    weak = get(nginx, f"/corpus/{path}", headers={"X-Replay-Header": ['ETag: W/"v1"', "Vary: accept-encoding"]})
    assert weak.header("etag") == 'W/"v1"'
    assert weak.header_count("vary") == 1, "Vary already covers Accept-Encoding"

    # Not an entity tag: it cannot be weakened, so a compressed body goes without it.
    for malformed in ["v1", '"v1', 'W/v1']:
        r = get(nginx, f"/corpus/{path}", headers={"X-Replay-Header": f"ETag: {malformed}"})
        assert r.header("content-encoding") == "gzip" and r.header("etag") is None, malformed


@pytest.mark.parametrize("bucket, coding", [("under 1 KiB", "gzip"), ("16-256 KiB", "gzip"), ("16-256 KiB", None)])
def test_gzip_beside_rpcedge_sends_one_vary(nginx, replay, bucket, coding):
    """rpcedge compresses what it gates in; nginx's gzip may take what rpcedge leaves small."""
    path = BUCKETS[bucket]
    r = get(nginx, f"/gzip/corpus/{path}", accept_encoding=coding)
    assert r.complete and r.decoded() == recorded(replay, path)
    assert r.header_count("vary") == 1 and r.header("vary") == "Accept-Encoding"
    if coding and len(recorded(replay, path)) >= 1024:
        assert last_log(nginx, f"/gzip/corpus/{path}")[2] == "oneshot"


@pytest.mark.parametrize("accept,coding", [
    ("gzip", "gzip"),
    ("GZIP;q=1.0", "gzip"),
    ("deflate", "deflate"),
    ("gzip;q=0.5, deflate;q=0.9", "deflate"),
    ("br", "br"),
    ("zstd", "zstd"),
    ("gzip, deflate, br, zstd", "zstd"),
    ("zstd;q=0, br, gzip", "gzip"),
    ("gzip;q=0.9, br", "br"),
    ("identity;q=0", None),
    ("compress", None),
    ("gzip;q=0", None),
    ("*", "gzip"),
    ("*;q=0", None),
    ("gzip;q=0.5, identity;q=0.8", None),
    ("gzip;q=abc", None),
    ("", None),
    (None, None),
    (["br", "gzip"], "gzip"),
    (["br", "gzip;q=0.5"], "br"),
    (["compress", "gzip"], "gzip"),
])
def test_q_values(nginx, replay, accept, coding):
    path = BUCKETS["1-16 KiB"]
    headers = {"Accept-Encoding": accept} if isinstance(accept, list) else None
    r = get(nginx, f"/corpus/{path}", accept_encoding=None if isinstance(accept, list) else accept,
            headers=headers)
    assert r.header("content-encoding") == coding
    assert r.decoded() == recorded(replay, path)


@pytest.mark.parametrize("accept,coding", [
    ("gzip, deflate, br, zstd", "gzip"),
    ("br", "br"),
    ("zstd", None),
    ("zstd, deflate;q=0.5", None),
    ("zstd, br;q=0.1", "br"),
])
def test_the_encodings_directive_sets_what_is_made_and_in_which_order(nginx, replay, accept, coding):
    path = BUCKETS["16-256 KiB"]
    r = get(nginx, f"/gzipfirst/corpus/{path}", accept_encoding=accept)
    assert r.header("content-encoding") == coding
    assert r.header("vary") == "Accept-Encoding"
    assert r.decoded() == recorded(replay, path)


def test_level_directive_changes_the_bytes(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    five = get(nginx, f"/level5/corpus/{path}")
    one = get(nginx, f"/level1/corpus/{path}")
    assert gzip.decompress(five.body) == gzip.decompress(one.body) == recorded(replay, path)
    assert len(one.body) > len(five.body)


@pytest.mark.parametrize("bucket,level", [("1-16 KiB", 5), ("16-256 KiB", 5), ("256 KiB-1 MiB", 1)])
def test_level_auto_by_default_picks_the_level_by_size(nginx, replay, bucket, level):
    # compress::auto_level: level 5 below 256 KiB, level 1 above
    path = BUCKETS[bucket]
    auto = get(nginx, f"/corpus/{path}")
    fixed = get(nginx, f"/level{level}/corpus/{path}")
    assert auto.header("content-encoding") == "gzip"
    assert auto.body == fixed.body
    assert gzip.decompress(auto.body) == recorded(replay, path)


# --- HTTP/2 ------------------------------------------------------------------------------------


def test_http2_client(nginx, replay, tmp_path):
    for bucket in ["1-16 KiB", "1-4 MiB"]:
        path = BUCKETS[bucket]
        out = tmp_path / "body"
        result = subprocess.run(
            ["curl", "-sS", "--http2-prior-knowledge", "-H", "Accept-Encoding: gzip", "-D", "-",
             "-o", out, f"http://{LOOPBACK}:{nginx.ports[1]}/corpus/{path}"],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        head = result.stdout.lower()
        assert head.startswith("http/2 200")
        assert "content-encoding: gzip" in head
        body = out.read_bytes()
        if bucket == "1-16 KiB":
            assert f"content-length: {len(body)}" in head
        assert gzip.decompress(body) == recorded(replay, path)


# --- failures ----------------------------------------------------------------------------------


# (framing, bucket, where the upstream resets as a share of the body, whether the headers are out)
RESETS = {
    "length, held": ("length", "16-256 KiB", 0.5, False),
    "chunked, held": ("chunked", "16-256 KiB", 0.5, False),
    # a known length above max_buffer streams from the head
    "length, streaming": ("length", "1-4 MiB", 0.5, True),
    # a chunked body streams once it passes max_buffer (1 MiB of the 1.5 MiB)
    "chunked, streaming": ("chunked", "1-4 MiB", 0.9, True),
}
# Paced, so that nginx has read all the upstream sent before its reset (which drops whatever the
# reader had not read yet).
PACED = {"X-Replay-Chunk-Size": "131072", "X-Replay-Chunk-Delay-Ms": "20"}


@pytest.mark.parametrize("case", RESETS)
def test_an_upstream_reset_is_a_502_before_the_headers_and_a_reset_after(nginx, replay, case):
    mode, bucket, share, headers_out = RESETS[case]
    path = BUCKETS[bucket]
    original = recorded(replay, path)
    r = get(nginx, f"/corpus/{path}",
            headers={"X-Replay-Mode": mode, "X-Replay-Reset-After": str(int(len(original) * share)), **PACED})
    if headers_out:
        # What arrived is a valid but unfinished prefix, and its framing says so.
        assert r.status == 200 and r.header("content-encoding") == "gzip"
        assert not r.complete, "a truncated upstream body must not arrive as a complete response"
        inflater = zlib.decompressobj(wbits=31)
        assert original.startswith(inflater.decompress(r.body)) and not inflater.eof
    else:
        # Nothing had gone out: the client gets a whole error response instead.
        assert r.status == 502 and r.complete, (r.status, r.raw[:200])
        assert r.header("content-encoding") is None and r.header("connection") == "close"
    assert last_log(nginx, f"/corpus/{path}")[2] == "failed"
    assert get(nginx, f"/corpus/{BUCKETS['1-16 KiB']}").complete


def test_an_error_page_after_a_failure_is_served_where_rpcedge_is_off(nginx, replay):
    path = BUCKETS["16-256 KiB"]
    started = time.monotonic()
    r = get(nginx, f"/failover/corpus/{path}", headers={"X-Replay-Mode": "chunked", "X-Replay-Reset-After": "30000"})
    assert time.monotonic() - started < 5, "the request hung (a held-output bit left set)"
    # "error_page 502 =" answers with the fallback's own status
    assert r.status == 200 and r.complete
    assert r.header("content-encoding") is None and r.header("vary") is None, "rpcedge is off there"
    assert r.body == recorded(replay, BUCKETS["1-16 KiB"])


def test_an_upstream_down_gives_a_clean_error_page(nginx):
    r = get(nginx, "/broken/corpus/x")
    assert r.status == 502 and r.complete


def test_error_page_redirect_is_handled(nginx, replay):
    r = get(nginx, "/missing.json")
    assert r.status == 404 and r.complete
    assert r.decoded() == recorded(replay, BUCKETS["1-16 KiB"])
    assert r.header("content-length") == str(len(r.body))


def active_connections(nginx):
    """Connections nginx holds open, not counting the one that asks."""
    text = get(nginx, "/status", accept_encoding=None).body.decode()
    return int(text.split("Active connections:")[1].split()[0]) - 1


def test_client_aborts_leave_nginx_serving(nginx, replay):
    for path, delay in [(BUCKETS["over 4 MiB"], "0"), (BUCKETS["1-16 KiB"], "300")]:
        for _ in range(5):
            with socket.create_connection((LOOPBACK, nginx.port)) as sock:
                sock.sendall(f"GET /corpus/{path} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
                             f"X-Replay-Mode: chunked\r\nX-Replay-Chunk-Delay-Ms: {delay}\r\n\r\n".encode())
                sock.recv(1000)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    # Every aborted request is finished and its connection closed: none hangs or leaks.
    deadline = time.monotonic() + 10
    while active_connections(nginx) > 0:
        assert time.monotonic() < deadline, f"{active_connections(nginx)} connections left open"
        time.sleep(0.1)
    r = get(nginx, f"/corpus/{BUCKETS['16-256 KiB']}")
    assert r.complete and gzip.decompress(r.body) == recorded(replay, BUCKETS["16-256 KiB"])
    assert "alert" not in nginx.error_log()
    assert "signal" not in nginx.error_log(), "no worker crashed"


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize("directive,message", [
    ("rpcedge_level 13;", '"rpcedge_level" directive must be between 1 and 12, got 13'),
    ("rpcedge_stream_level 0;", '"rpcedge_stream_level" directive must be between 1 and 9, got 0'),
    ("rpcedge_max_buffer 300m;", '"rpcedge_max_buffer" directive must be between 0 and 268435456'),
    ("rpcedge_stream_delay 2m;", '"rpcedge_stream_delay" directive must be between 0 and 60000'),
    ("rpcedge_level fast;", '"rpcedge_level" directive must be auto or a number from 1 to 12, got "fast"'),
    ("rpcedge_level 0;", '"rpcedge_level" directive must be between 1 and 12, got 0'),
    ("rpcedge_types json;", 'invalid value "json" in "rpcedge_types"'),
    ("rpcedge_encodings zstd lz4;",
     'invalid value "lz4" in "rpcedge_encodings": "lz4" is not one of dcz, zstd, br, gzip, deflate'),
    ("rpcedge_encodings br gzip BR;", '"BR" is listed twice in "rpcedge_encodings"'),
    ("rpcedge_encodings gzip; rpcedge_encodings br;", '"rpcedge_encodings" directive is duplicate'),
    ("rpcedge_min_length 2m; rpcedge_max_buffer 1m;", '"rpcedge_min_length" must not exceed max_buffer'),
    ("rpcedge_transcode_max 9000m;", '"rpcedge_transcode_max" directive must be between 0 and 8589934592'),
    ("rpcedge_transcode_hold_max 3000m;",
     '"rpcedge_transcode_hold_max" directive must be between 0 and 2147483648'),
    ("rpcedge_transcode_budget lots;", '"rpcedge_transcode_budget" directive invalid value'),
    ("rpcedge_transcode maybe;", 'invalid value "maybe" in "rpcedge_transcode"'),
    ("rpcedge_beacon_network goerli;",
     '"rpcedge_beacon_network" directive must be off or one of mainnet, sepolia, hoodi, holesky, got "goerli"'),
    ("rpcedge_beacon_network hoodi; rpcedge_beacon_network hoodi;", '"rpcedge_beacon_network" directive is duplicate'),
    ("rpcedge_dictionary_min_length 65m;", '"rpcedge_dictionary_min_length" directive must be between 0 and 67108864'),
    ('location = /d { rpcedge_dictionary "/a\\"b"; }',
     'in "rpcedge_dictionary": match must be a path pattern of printable characters without quotes'),
    ('location = /d { rpcedge_dictionary *; }', 'invalid value "*" in "rpcedge_dictionary"'),
    ('location = /d { rpcedge_dictionary; rpcedge_dictionary; }', '"rpcedge_dictionary" directive is duplicate'),
])
def test_bad_values_fail_nginx_t_naming_the_directive(tmp_path, directive, message):
    conf = tmp_path / "nginx.conf"
    conf.write_text(main_conf(tmp_path, f"server {{ listen {LOOPBACK}:{free_port()}; rpcedge on; {directive} }}"))
    code, output = check_conf(conf, tmp_path)
    assert code != 0
    assert message in output, output


def test_shipped_configs_pass_nginx_t(tmp_path):
    for name in ["rpcedge.conf", "nginx.conf"]:
        conf = tmp_path / name
        conf.write_text(shipped_conf(name, tmp_path))
        code, output = check_conf(conf, tmp_path)
        assert code == 0, f"{name}: {output}"
