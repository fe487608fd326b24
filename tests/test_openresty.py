"""The OpenResty binding (resty.rpcedge over the core's shared library) in Debian's nginx with
libnginx-mod-http-lua and lua-resty-core, running the shipped example config: the same decisions
and bytes as the nginx module on the same requests."""

import gzip

import pytest

from testbed import replay_corpus as rc
from testbed import wire
from testbed.counters import scrape
from testbed.harness import CORPUS, REPO, SSZ_EXAMPLES, Process
from testbed.nginx_harness import LOOPBACK, NGINX_BIN, check_conf, free_port, start_nginx
from test_nginx_status import nginx  # noqa: F401 (a fixture: the module with rpcedge_status)

CORE_LIB = REPO / "target" / "release" / "librpcedge.so"
MEDIUM = "erigon_getLatestLogs/erigon-rpc-tests__mainnet__test_10.json"  # 56 KiB answer
SMALL = "eth_call/erigon-rpc-tests__arb-sepolia__test_13.json"  # 102 B answer
LARGE = "trace_replayTransaction/erigon-rpc-tests__mainnet__test_10.tar"  # 1.5 MiB answer


EXAMPLE_SETTINGS = """settings([[{"level": "auto", "transcode": true,
            "cache": {"cluster": "127.0.0.1:18090"}}]])"""


def openresty_conf(prefix, node_port, port, settings=None, cached_port=None, extra_locations=""):
    """The shipped OpenResty example in front of the node on `node_port`, listening on `port`
    (with the settings JSON `settings` in place of its own, and `extra_locations` before its
    first), its cache on the daemon at `cached_port` (none: a port where no daemon listens, so
    that lookups fail open at once), written under `prefix`: its path."""
    text = (REPO / "configs" / "openresty" / "nginx.conf").read_text()
    assert EXAMPLE_SETTINGS in text
    cached = f"127.0.0.1:{cached_port or free_port()}"
    text = text.replace(EXAMPLE_SETTINGS, f"settings([[{settings}]])" if settings
                        else EXAMPLE_SETTINGS.replace("127.0.0.1:18090", cached))
    for old, new in {
        "/opt/rpcedge/target/release/librpcedge.so": str(CORE_LIB),
        "/opt/rpcedge/": f"{REPO}/",
        "127.0.0.1:18545": f"127.0.0.1:{node_port}",
        "127.0.0.1:18082": f"127.0.0.1:{port}",
        "        location /__node/ {": extra_locations + "        location /__node/ {",
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    for temp in ("body", "proxy"):
        (prefix / temp).mkdir(parents=True)
    text = (f"daemon off;\nuser root;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log info;\n"
            + text.replace("http {\n", f"http {{\n    client_body_temp_path {prefix}/body;\n"
                           f"    proxy_temp_path {prefix}/proxy;\n    access_log off;\n", 1))
    conf = prefix / "nginx.conf"
    conf.write_text(text)
    return conf


def start_openresty(prefix, node_port, settings=None, cached_port=None, extra_locations=""):
    """OpenResty on `openresty_conf`: its port and process."""
    port = free_port()
    conf = openresty_conf(prefix, node_port, port, settings, cached_port, extra_locations)
    code, output = check_conf(conf, prefix)
    assert code == 0, output
    process = Process("openresty", [NGINX_BIN, "-p", prefix, "-c", conf, "-e", prefix / "error.log"],
                      prefix / "openresty.out")
    process.wait_for_port(port)
    return port, process


@pytest.fixture(scope="module")
def openresty(replay, tmp_path_factory):
    port, process = start_openresty(tmp_path_factory.mktemp("openresty"), replay.port)
    yield port
    process.stop()


@pytest.fixture(scope="module")
def module(replay, tmp_path_factory):
    """The nginx module in front of the same replay, for comparison."""
    port = free_port()
    server = start_nginx(tmp_path_factory.mktemp("module"), f"""
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        location / {{
            proxy_pass http://{LOOPBACK}:{replay.port};
        }}
    }}""", [port])
    yield port
    server.stop()


def post(port, path, accept_encoding, headers=None, prefix=""):
    request, _ = rc.read_pairs(CORPUS / path)[0]
    return wire.request(port, f"{prefix}/{rc.network_of(path)}", method="POST", body=rc.compact(request),
                        headers={"Content-Type": "application/json", **(headers or {})},
                        accept_encoding=accept_encoding)


# What must agree: the decisions, as headers.
COMPARED = ("content-encoding", "content-length", "vary", "etag", "accept-ranges", "content-type")


DECISIONS = [
    (MEDIUM, "gzip", {}),
    (MEDIUM, "deflate", {}),
    (MEDIUM, "zstd", {}),
    (MEDIUM, "gzip;q=0.9, deflate, br", {}),
    (LARGE, "br", {}),
    (MEDIUM, "gzip;q=0", {}),
    (MEDIUM, None, {}),
    (SMALL, "gzip", {}),
    (MEDIUM, "gzip", {"X-Replay-Header": ['ETag: "v1"', "Accept-Ranges: bytes"]}),
    (MEDIUM, "gzip", {"X-Replay-Header": "ETag: v1"}),
    (MEDIUM, "gzip", {"X-Replay-Header": "Vary: Origin"}),
    (MEDIUM, "gzip", {"X-Replay-Header": "Cache-Control: no-transform"}),
    (MEDIUM, "gzip", {"X-Replay-Header": "Content-Type: application/octet-stream"}),
    (MEDIUM, "gzip", {"X-Replay-Status": "404"}),
    (MEDIUM, "gzip", {"X-Replay-Mode": "chunked"}),
    (LARGE, "gzip", {}),
]
DECISION_IDS = ["gzip", "deflate", "zstd", "br", "br-streamed", "refused", "identity", "small", "strong-etag", "bad-etag", "vary", "no-transform",
                "other-type", "404", "chunked", "large"]


@pytest.mark.parametrize("path, accept, headers", DECISIONS, ids=DECISION_IDS)
def test_lua_decides_as_the_module_does(openresty, module, path, accept, headers):
    lua = post(openresty, path, accept, headers)
    native = post(module, path, accept, headers)
    assert lua.status == native.status and lua.complete and native.complete
    for name in COMPARED:
        if name == "content-length" and native.chunked:
            assert lua.header(name) is None and lua.chunked, "streamed, as the module does"
            continue
        assert lua.header(name) == native.header(name), name
    assert lua.decoded() == native.decoded()
    if not native.chunked:
        assert lua.body == native.body, "the same one-shot bytes"


@pytest.mark.parametrize("path, accept, headers", DECISIONS, ids=DECISION_IDS)
def test_the_proxy_pass_form_decides_as_the_module_does_and_streams_what_it_would_hold(openresty, module, path,
                                                                                      accept, headers):
    lua = post(openresty, path, accept, headers, prefix="/proxied")
    native = post(module, path, accept, headers)
    assert lua.status == native.status and lua.complete and native.complete
    for name in COMPARED:
        if name == "content-length" and (native.chunked or native.header("content-encoding")):
            # the head goes before the body is in: compressed means streamed, without a length
            assert lua.header(name) is None and lua.chunked
            continue
        assert lua.header(name) == native.header(name), name
    assert lua.decoded() == native.decoded()
    if not native.header("content-encoding"):
        assert lua.body == native.body, "left alone, as the module leaves it"


def direct(replay, path):
    request, _ = rc.read_pairs(CORPUS / path)[0]
    return replay.request("POST", f"/{rc.network_of(path)}", body=rc.compact(request))[2]


def test_lua_compresses_whole_bodies_with_an_exact_length(openresty, replay):
    r = post(openresty, MEDIUM, "gzip;q=0.9, deflate;q=0.5")
    assert r.status == 200 and r.complete
    assert r.header("content-encoding") == "gzip"
    assert r.header("content-length") == str(len(r.body))
    assert gzip.decompress(r.body) == direct(replay, MEDIUM)
    for coding in ("zstd", "br"):
        r = post(openresty, MEDIUM, f"gzip;q=0.9, {coding}")
        assert r.header("content-encoding") == coding
        assert r.header("content-length") == str(len(r.body))
        assert r.decoded() == direct(replay, MEDIUM)
    assert r.header("vary") == "Accept-Encoding"


def test_lua_negotiates_like_the_module(openresty, replay):
    assert post(openresty, MEDIUM, "deflate").header("content-encoding") == "deflate"
    assert post(openresty, MEDIUM, "gzip;q=0").header("content-encoding") is None
    assert post(openresty, MEDIUM, None).decoded() == direct(replay, MEDIUM)


def test_lua_leaves_small_bodies_alone(openresty, replay):
    r = post(openresty, SMALL, "gzip")
    assert r.header("content-encoding") is None
    assert r.body == direct(replay, SMALL)


def test_lua_keeps_cache_entries_in_its_own_storage_and_answers_hits_with_the_clients_id(openresty):
    import json
    from testbed import cache_cases as cc
    block = cc.find(cc.block_by_hash)
    path = f"/cached/{block.network}"
    headers = {"Content-Type": "application/json"}
    miss = wire.request(openresty, path, method="POST", body=block.body(1), headers=headers)
    assert (miss.status, miss.header("x-rpcedge-cache")) == (200, "MISS")
    assert miss.decoded() == block.answer(1)
    hit = wire.request(openresty, path, method="POST", body=block.body("again", indent=1), headers=headers)
    assert (hit.status, hit.header("x-rpcedge-cache"), hit.header("content-encoding")) == (200, "HIT", "gzip")
    assert int(hit.header("content-length")) == len(hit.body)
    assert gzip.decompress(hit.body) == block.answer("again")
    plain = wire.request(openresty, path, method="POST", body=block.body(5), headers=headers, accept_encoding=None)
    assert (plain.header("x-rpcedge-cache"), plain.body) == ("HIT", block.answer(5))
    # never cached: a method outside the table
    latest = cc.find(cc.not_in_the_table)
    for _ in range(2):
        response = wire.request(openresty, f"/cached/{latest.network}", method="POST",
                                body=json.dumps(latest.request).encode(), headers=headers)
        assert response.header("x-rpcedge-cache") == "BYPASS"


def test_a_client_that_asks_for_ssz_gets_the_witness_as_ssz(openresty):
    from test_transcode import SSZ, call, witness_json, witness_ssz

    block = "0x134ff8"
    r = wire.request(openresty, "/hoodi", method="POST", body=call("debug_executionWitness", [block], id=4),
                     headers={"Content-Type": "application/json", "Accept": SSZ})
    assert r.status == 200 and r.header("content-type") == SSZ
    assert r.body == witness_ssz(witness_json(block))
    assert int(r.header("content-length")) == len(r.body)
    assert (r.header("x-rpcedge-jsonrpc-id"), r.header("x-rpcedge-jsonrpc-version")) == ("4", "2.0")
    assert "Accept" in r.header("vary")


def test_lua_never_stores_a_call_the_node_reads_otherwise_and_keeps_the_nodes_cors_headers(tmp_path):
    """The binding's cache, in front of a node that reads requests as Go does and answers CORS as
    geth does: every spelling a Go node reads otherwise bypasses, and hits carry what the node
    gave each origin."""
    import json
    from testbed.go_node import GoNode
    from test_cache_security import A, CORS, SPELLINGS, by_hash, call

    node = GoNode("go", headers=CORS)
    port, process = start_openresty(tmp_path, node.port)
    try:
        def post(body, headers=()):
            return wire.request(port, "/cached/mainnet", method="POST", body=body,
                                headers={"Content-Type": "application/json", **dict(headers)})

        base = f'"jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":["{A}",false]'
        for spelling, member in SPELLINGS.items():
            assert post(call(f"{base},{member}")).header("x-rpcedge-cache") == "BYPASS", spelling
        for origin in ["https://a.example", None, "https://b.example"]:
            headers = {"Origin": origin} if origin else {}
            first = post(by_hash(A), headers)
            assert first.header("x-rpcedge-cache") == "MISS" and first.header("access-control-allow-origin") == origin
            hit = post(by_hash(A, id_=2), headers)
            assert hit.header("x-rpcedge-cache") == "HIT", origin
            assert json.loads(hit.decoded())["result"]["hash"] == A
            assert hit.header("access-control-allow-origin") == origin
            assert "origin" in hit.header("vary").lower()
    finally:
        process.stop()
        node.stop()


def test_lua_counts_what_the_module_and_envoy_count_under_their_names(openresty, nginx):
    import json
    from testbed import cache_cases as cc

    before = scrape(openresty)
    assert sorted(before) == sorted(scrape(nginx.port)), "the module's names"
    assert post(openresty, MEDIUM, "gzip").header("content-encoding") == "gzip"
    headers = {"Content-Type": "application/json"}
    null = cc.find(cc.null_result)
    r = wire.request(openresty, f"/cached/{null.network}", method="POST", body=null.body(), headers=headers)
    assert r.header("x-rpcedge-cache") == "MISS"
    batch = cc.batch_case()
    r = wire.request(openresty, f"/cached/{batch.network}", method="POST", body=json.dumps(batch.request).encode(),
                     headers=headers)
    assert r.header("x-rpcedge-cache") == "BYPASS"
    after = scrape(openresty)
    delta = {name: after[name] - before[name] for name in after if after[name] != before[name]}
    assert delta.pop("rpcedge_body_bytes_in") > delta.pop("rpcedge_body_bytes_out") > 0
    assert delta.pop("rpcedge_compress_time_us") > 0, "the one-shot gzip took time"
    assert delta == {
        "rpcedge_responses_oneshot": 1, "rpcedge_responses_small": 2,
        "rpcedge_cache_responses_miss": 1, "rpcedge_cache_stores_refused": 1, "rpcedge_cache_stores_refused_null": 1,
        # the first call's method is one the cache never keeps (the daemon form, at /)
        "rpcedge_cache_responses_bypass": 2, "rpcedge_cache_bypass_batch": 1, "rpcedge_cache_bypass_method": 1,
    }


@pytest.mark.parametrize("path, version", [
    ("/eth/v2/beacon/blocks/deneb:case_0", "deneb"),
    # a route whose node reads its query (the replay names the case there)
    ("/eth/v1/beacon/light_client/finality_update?case=electra:case_4", "electra"),
])
def test_a_beacon_get_reaches_the_node_as_the_client_sent_it_and_goes_out_as_ssz(openresty, replay, path, version):
    from test_transcode import SSZ, node_answer

    r = wire.request(openresty, path, headers={"Accept": f"{SSZ};q=1, application/json;q=0.9"})
    assert r.status == 200 and r.header("content-type") == SSZ
    assert r.body == node_answer(replay, path, ssz=True)
    assert int(r.header("content-length")) == len(r.body)
    assert r.header("eth-consensus-version") == version
    r = wire.request(openresty, path, headers={"Accept": "application/json"})
    assert r.status == 200 and r.decoded() == node_answer(replay, path, ssz=False)
    # HEAD: the head a GET gets, without its body
    head = wire.request(openresty, path, method="HEAD", headers={"Accept": "application/json"})
    assert head.status == 200 and head.body == b"" and head.header("content-type") == "application/json"


@pytest.mark.parametrize("address", ["tcp", "unix"])
def test_the_example_answers_from_rpcedge_cached_through_both_forms(tmp_path, address):
    """The shipped example in front of the cache stack's node, its daemon at a TCP address or on a
    unix socket: a call misses, is stored behind its answer, then hits through the subrequest
    location and the proxy_pass one (the same network's namespace), with the client's id."""
    import json
    import time
    from testbed import cache_cases as cc

    block = cc.find(cc.block_by_hash)
    socket_path = tmp_path / "cached.sock"
    (tmp_path / "stack").mkdir()
    stack = cc.CacheStack(tmp_path / "stack", [block.network], daemon_args=["--socket", socket_path])
    try:
        settings = None
        if address == "unix":
            settings = json.dumps({"level": "auto", "cache": {"cluster": f"unix:{socket_path}"}})
        port, process = start_openresty(tmp_path / "openresty", stack.replay.port, settings, stack.daemon.port)
        try:
            def post(prefix, id_):
                return wire.request(port, prefix + block.path, method="POST", body=block.body(id_),
                                    headers={"Content-Type": "application/json"})

            miss = post("", 1)
            assert (miss.status, miss.header("x-rpcedge-cache"), miss.decoded()) == (200, "MISS", block.answer(1))
            deadline = time.monotonic() + 5
            while post("", "probe").header("x-rpcedge-cache") != "HIT":
                assert time.monotonic() < deadline, "never stored"
                time.sleep(0.05)
            asked = stack.node_requests()
            for prefix in ("", "/proxied"):
                hit = post(prefix, f"id{prefix}")
                assert (hit.status, hit.header("x-rpcedge-cache"), hit.header("content-encoding")) == (200, "HIT", "gzip")
                assert int(hit.header("content-length")) == len(hit.body)
                assert gzip.decompress(hit.body) == block.answer(f"id{prefix}")
            assert stack.node_requests() == asked, "hits never reach the node"
            assert stack.daemon.stats()["stores_total"] == 1
        finally:
            process.stop()
    finally:
        stack.stop()


@pytest.mark.parametrize("cache, message", [
    ({}, "cache_cluster: rpcedge_cached is not a daemon's address"),
    ({"cluster": "127.0.0.1:0"}, "cache_cluster: 127.0.0.1:0 is not a daemon's address"),
    ({"cluster": "localhost"}, "cache_cluster: localhost is not a daemon's address"),
    # a name would need nginx's resolver for every lookup
    ({"cluster": "localhost:18090"}, "cache_cluster: localhost:18090 is not a daemon's address"),
    ({"cluster": "127.0.0.1:18090", "hot_bytes": 1 << 20}, "cache_hot_bytes: the Lua binding keeps no hot tier"),
    ({"clusters": ["127.0.0.1:18090", "127.0.0.1:18091"]}, "cache_clusters: sharding was retired"),
    ({"timeout_ms": 0}, "cache_timeout_ms: must be between"),
])
def test_a_bad_cache_section_stops_nginx_at_startup_naming_the_field(tmp_path, cache, message):
    # init_by_lua does not run under `nginx -t`: the settings are checked as nginx starts
    import json
    import subprocess
    conf = openresty_conf(tmp_path, free_port(), free_port(), json.dumps({"cache": cache}))
    started = subprocess.run([NGINX_BIN, "-p", tmp_path, "-c", conf, "-e", tmp_path / "error.log"],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and message in started.stderr, started.stderr


def test_a_client_asking_json_gets_json_from_the_cache_when_the_node_is_asked_for_ssz(tmp_path):
    """With transcode_upstream_ssz the example asks the node for SSZ (ask_upstream rewrites the
    request's Accept): the cache still answers each client in the form it asked for."""
    import json
    import time
    from testbed import cache_cases as cc
    from test_cache_hosts import BLINDED_BLOCKS, BLINDED_ROOT

    (tmp_path / "stack").mkdir()
    stack = cc.CacheStack(tmp_path / "stack", [])
    stack.finalize_slot(stack.BEACON_FINAL + 1)
    # a node with SSZ: nginx with rpcedge_transcode in front of the replay, which answers SSZ with
    # the Beacon-API envelope's members in headers
    node_port = free_port()
    node = start_nginx(tmp_path / "node", f"""
    server {{
        listen {LOOPBACK}:{node_port};
        rpcedge on;
        rpcedge_transcode on;
        location / {{ proxy_pass http://{LOOPBACK}:{stack.replay.port}; }}
    }}""", [node_port])
    settings = json.dumps({"level": "auto", "transcode": True, "transcode_upstream_ssz": True,
                           "cache": {"cluster": f"127.0.0.1:{stack.daemon.port}"}})
    port, process = start_openresty(tmp_path / "openresty", node_port, settings)
    path = BLINDED_BLOCKS + BLINDED_ROOT
    ssz = (SSZ_EXAMPLES / "real" / "signed-blinded-beacon-block-deneb.computed.ssz").read_bytes()
    try:
        def get(accept):
            return wire.request(port, path, headers={"Accept": accept}, accept_encoding=None)

        # the exchange asks the node for SSZ once it has seen an SSZ answer of the node carry the
        # Beacon-API envelope's members
        teach = wire.request(port, "/eth/v2/beacon/blocks/deneb:case_0", headers={"Accept": "application/octet-stream"})
        assert teach.status == 200 and teach.header("eth-consensus-finalized") is not None
        seen = []
        deadline = time.monotonic() + 5
        while not seen or seen[-1].header("x-rpcedge-cache") != "HIT":
            assert time.monotonic() < deadline, [r.header("x-rpcedge-cache") for r in seen]
            seen.append(get("application/json"))
            time.sleep(0.05)
        for r in seen:
            assert r.status == 200 and r.header("content-type") == "application/json", r.header("x-rpcedge-cache")
            assert json.loads(r.body)["version"] == "deneb"
        assert seen[0].header("x-rpcedge-cache") == "MISS"
        hit = get("application/octet-stream")
        assert (hit.header("x-rpcedge-cache"), hit.header("content-type")) == ("HIT", "application/octet-stream")
        assert hit.body == ssz
    finally:
        process.stop()
        node.stop()
        stack.stop()


def test_a_node_answer_cut_short_is_never_sent_or_kept_as_whole(tmp_path):
    """The node resets after part of its answer: the subrequest form answers 502, the proxy_pass
    form ends the response unfinished; neither is stored, and each counts an aborted exchange."""
    import time
    from testbed import cache_cases as cc

    blocks = cc.find_all(cc.block_by_hash, limit=2)  # one for each form
    (tmp_path / "stack").mkdir()
    stack = cc.CacheStack(tmp_path / "stack", [block.network for block in blocks])
    port, process = start_openresty(tmp_path / "openresty", stack.replay.port, cached_port=stack.daemon.port)

    try:
        cut = {"X-Replay-Chunk-Size": "256", "X-Replay-Chunk-Delay-Ms": "5", "Content-Type": "application/json"}
        for prefix, block in zip(("", "/proxied"), blocks):
            cut["X-Replay-Reset-After"] = str(len(block.answer(1)) // 2)
            before, stored = scrape(port), stack.daemon.stats().get("stores_total", 0)
            r = wire.request(port, prefix + block.path, method="POST", body=block.body(1), headers=cut)
            if prefix:
                assert r.status == 200 and not r.complete, "an unfinished answer, never a whole one"
            else:
                assert r.status == 502 and r.complete and block.answer(1)[:20] not in r.body
            deadline = time.monotonic() + 5
            while scrape(port)["rpcedge_responses_aborted"] != before["rpcedge_responses_aborted"] + 1:
                assert time.monotonic() < deadline, "not counted as aborted"
                time.sleep(0.05)
            time.sleep(0.3)  # a store, had one been made, would have landed
            assert stack.daemon.stats().get("stores_total", 0) == stored, prefix
            again = wire.request(port, prefix + block.path, method="POST", body=block.body(2),
                                 headers={"Content-Type": "application/json"})
            assert (again.status, again.header("x-rpcedge-cache")) == (200, "MISS"), prefix
            assert again.decoded() == block.answer(2)
            while stack.daemon.stats().get("stores_total", 0) != stored + 1:
                assert time.monotonic() < deadline + 5, "the whole answer is stored"
                time.sleep(0.05)
    finally:
        process.stop()
        stack.stop()


def test_stores_wait_out_timers_that_openresty_could_not_run(tmp_path, replay):
    """Each worker sends its stores through at most four timers. With lua_max_running_timers at 2
    and both taken by the config's own timers for 2 s, OpenResty cannot run those timers (it
    drops them): the misses of that time wait in the queue, and the next misses' timers, once
    there is room, store them all."""
    import concurrent.futures
    import threading
    import time
    from http.server import BaseHTTPRequestHandler
    from testbed import cache_cases as cc
    from testbed.harness import StandIn

    stored, lock = [], threading.Lock()

    class Daemon(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, status, headers=()):
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):
            self.answer(404, [("X-Rpcedge-Miss", "absent")])

        def do_PUT(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                stored.append(self.path)
            self.answer(204)

        def log_message(self, *args):
            pass

    daemon = StandIn(Daemon)
    calls = cc.find_all(cc.immutable, limit=16)
    port = free_port()
    busy = """
    lua_max_running_timers 2;
    init_worker_by_lua_block {
        for _ = 1, 2 do
            ngx.timer.at(0, function() ngx.sleep(2) end)
        end
    }
"""
    nginx = start_nginx(tmp_path, busy + cc.openresty_server(port, replay.port, daemon.port), [port],
                        modules=cc.LUA_MODULES, rpcedge=False, main=f"env RPCEDGE_LIB={CORE_LIB};")
    started = time.monotonic()
    try:
        def burst(sent):
            with concurrent.futures.ThreadPoolExecutor(len(sent)) as pool:
                answers = list(pool.map(lambda call: wire.request(
                    port, call.path, method="POST", body=call.body(1), headers={"Content-Type": "application/json"}),
                    sent))
            assert [a.header("x-rpcedge-cache") for a in answers] == ["MISS"] * len(sent)

        burst(calls[:8])
        assert time.monotonic() - started < 1.5, "the first burst came while the config's timers ran"
        time.sleep(0.5)
        assert "lua_max_running_timers are not enough" in (tmp_path / "error.log").read_text()
        assert stored == [], "nothing could be stored while every timer was taken"
        time.sleep(max(0.0, started + 3.5 - time.monotonic()))
        burst(calls[8:])
        deadline = time.monotonic() + 10
        while len(stored) < len(calls):
            assert time.monotonic() < deadline, f"{len(stored)} of {len(calls)} stored"
            time.sleep(0.05)
        assert len(set(stored)) == len(calls)
    finally:
        nginx.stop()
        daemon.stop()


def test_a_key_held_by_a_collected_handle_goes_to_the_next_lookup(tmp_path):
    """A location without rpcedge.log() whose request drops its cache while holding the key of a
    miss: the handle's finalizer leaves the key to the worker's next lookup, which releases it, so
    the next client of that key is told MISS at once rather than after lock_timeout (5 s here)."""
    import time
    from testbed import cache_cases as cc

    case = cc.find_all(cc.immutable, limit=1)[0]
    (tmp_path / "stack").mkdir()
    stack = cc.CacheStack(tmp_path / "stack", [case.network])
    # (the request ends holding the key: its cache dropped unreleased, and no log phase)
    leak = f"""
        location = /leak {{
            log_by_lua_block {{ }}
            content_by_lua_block {{
                require("resty.rpcedge").access(rpcedge_settings, "{case.network}")
                ngx.ctx.rpcedge_cache, ngx.ctx.rpcedge = nil, nil
                collectgarbage()
                collectgarbage()
                ngx.say("left")
            }}
        }}"""
    proxy = cc.start_proxy("openresty", tmp_path / "openresty", stack, extra=leak, settings={"lock_timeout_ms": 5000})
    headers = {"Content-Type": "application/json"}
    try:
        left = wire.request(proxy.port, "/leak", method="POST", body=case.body(1), headers=headers)
        assert left.status == 200 and left.body == b"left\n"
        started = time.monotonic()
        r = wire.request(proxy.port, case.path, method="POST", body=case.body(2), headers=headers)
        assert r.header("x-rpcedge-cache") == "MISS" and r.decoded() == case.answer(2)
        assert time.monotonic() - started < 2.5, "the key was released, not left to lock_timeout"
    finally:
        proxy.stop()
        stack.stop()


class EchoNode:
    """A node that answers each request with what it was asked: its Accept-Encoding, as JSON."""

    def __init__(self):
        import http.server
        import json
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"asked": self.headers.get("Accept-Encoding", "")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# what the client sent, as the phases after the node's request see it
SEES_CLIENT = 'ngx.header["X-Client-Accept-Encoding"] = ngx.var.http_accept_encoding'


def test_both_forms_ask_the_node_alone_for_identity_and_give_the_client_its_headers_back(tmp_path):
    import json

    node = EchoNode()
    port = free_port()
    conf = openresty_conf(tmp_path, node.port, port)
    text = conf.read_text()
    for old, new in {
        'exchange:respond(exchange:capture("/__node", rpcedge_namespace(ngx.var.uri)))':
            f'local res = exchange:capture("/__node", rpcedge_namespace(ngx.var.uri)) {SEES_CLIENT} exchange:respond(res)',
        'header_filter_by_lua_block { require("resty.rpcedge").header_filter() }':
            f'header_filter_by_lua_block {{ require("resty.rpcedge").header_filter() {SEES_CLIENT} }}',
    }.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    conf.write_text(text)
    process = Process("openresty", [NGINX_BIN, "-p", tmp_path, "-c", conf, "-e", tmp_path / "error.log"],
                      tmp_path / "openresty.out")
    try:
        process.wait_for_port(port)
        for form in ("", "/proxied"):
            # a JSON-RPC call: rpcedge's work, the node alone answers identity
            call = wire.request(port, f"{form}/", method="POST", body=b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}',
                                headers={"Content-Type": "application/json"}, accept_encoding="gzip, zstd")
            assert json.loads(call.decoded()) == {"asked": ""}, form
            assert call.header("x-client-accept-encoding") == "gzip, zstd", form
            # a page: asked as the client asked
            page = wire.request(port, f"{form}/index.html", accept_encoding="gzip, zstd")
            assert json.loads(page.decoded()) == {"asked": "gzip, zstd"}, form
            assert page.header("x-client-accept-encoding") == "gzip, zstd", form
    finally:
        process.stop()
        node.stop()


def test_an_http2_request_the_cache_does_not_answer_reaches_the_node_as_sent(tmp_path):
    """lua-nginx-module before 0.10.28 (Debian 12 has 0.10.23) makes no subrequest of an HTTP/2
    request, and the subrequest form answered such a miss 500: it goes to the node as the client
    sent it, neither compressed nor kept, its key let go; a hit still answers over HTTP/2."""
    import subprocess
    import time
    from testbed import cache_cases as cc

    block = cc.find(cc.block_by_hash)
    (tmp_path / "stack").mkdir()
    stack = cc.CacheStack(tmp_path / "stack", [block.network])
    try:
        port, process = start_openresty(tmp_path / "openresty", stack.replay.port, cached_port=stack.daemon.port)
        h2_port = free_port()
        conf = tmp_path / "openresty" / "nginx.conf"
        conf.write_text(conf.read_text().replace(f"listen 127.0.0.1:{port};",
                                                 f"listen 127.0.0.1:{port};\n        listen 127.0.0.1:{h2_port} http2;"))
        process.stop()
        process = Process("openresty", [NGINX_BIN, "-p", tmp_path / "openresty", "-c", conf],
                          tmp_path / "openresty" / "openresty.out")
        process.wait_for_port(h2_port)
        try:
            def over_h2(id_):
                result = subprocess.run(
                    ["curl", "-sS", "--http2-prior-knowledge", "-D", "-", "-o", tmp_path / "body",
                     "-H", "Content-Type: application/json", "-H", "Accept-Encoding: gzip",
                     "--data-binary", "@-", f"http://127.0.0.1:{h2_port}{block.path}"],
                    input=block.body(id_), capture_output=True, check=True, timeout=30)
                status, *lines = result.stdout.decode().strip().split("\r\n")
                headers = dict(line.split(": ", 1) for line in lines)
                return status.strip(), {name.lower(): value for name, value in headers.items()}, \
                    (tmp_path / "body").read_bytes()

            status, headers, body = over_h2(1)
            assert status == "HTTP/2 200", (status, (tmp_path / "openresty" / "error.log").read_text()[-2000:])
            untouched = "x-rpcedge-cache" not in headers
            if untouched:
                # a module that makes no subrequest of it: the node's answer, as it came
                assert "content-encoding" not in headers
                assert "makes no subrequest of an HTTP/2 request" in (tmp_path / "openresty" / "error.log").read_text()
            else:
                assert headers["x-rpcedge-cache"] == "MISS"  # lua-nginx-module 0.10.28 and later
            assert (gzip.decompress(body) if headers.get("content-encoding") else body) == block.answer(1)
            miss = wire.request(port, block.path, method="POST", body=block.body(2),
                                headers={"Content-Type": "application/json"})
            assert miss.decoded() == block.answer(2)
            # what went untouched was not kept
            assert miss.header("x-rpcedge-cache") in (("MISS",) if untouched else ("MISS", "HIT"))
            deadline = time.monotonic() + 5
            while stack.daemon.stats()["stores_total"] < 1:
                assert time.monotonic() < deadline, "never stored"
                time.sleep(0.05)
            status, headers, body = over_h2(3)
            assert (status, headers.get("x-rpcedge-cache"), gzip.decompress(body)) == ("HTTP/2 200", "HIT", block.answer(3))
        finally:
            process.stop()
    finally:
        stack.stop()
