"""The cache's settings, configured with one name in every host (nginx's directives, the Envoy
plugin's JSON): what `max_entry`, `max_request`, `chain_ttl_s` and `store_timeout_s` do through real
nginx and real Envoy (both adapters), in front of the real daemon (or, for the store's timeout, a
daemon that answers stores late), and the daemon's `--max-entry` in the hosts' terms."""

import json
import re
import time
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from testbed import cache_cases as cc
from testbed import wire
from testbed.envoy_harness import ADAPTERS, ENVOY_HOSTS, render_config, start_envoy
from testbed.harness import LOOPBACK, StandIn, free_port
from testbed.nginx_harness import check_conf, main_conf

CASES = {}


def case(name):
    if name not in CASES:
        CASES[name] = cc.find(chain if name == "chain" else getattr(cc, name))
    return CASES[name]


def chain(request, response):
    """A chain property, kept for `chain_ttl_s`."""
    return request["method"] == "eth_chainId" and "result" in response


# nginx serves its counters here, as the example config does
STATUS = """
        location = /rpcedge_status {
            rpcedge_status;
            rpcedge off;
            rpcedge_cache off;
        }"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = cc.CacheStack(tmp_path_factory.mktemp("cache-settings"), [case("block_by_hash").network,
                                                                       case("chain").network])
    yield stack
    stack.stop()


@pytest.fixture(params=["nginx", *ENVOY_HOSTS])
def proxy(request, tmp_path, stack):
    """Starts proxies of the test's host with the cache's `settings` (in front of `daemon` when
    given), stopped after the test; the test begins with an empty daemon."""
    stack.fresh_daemon()
    started = []

    def start(settings, daemon=None, **options):
        if request.param == "nginx":
            options["extra"] = STATUS
        where = stack if daemon is None else SimpleNamespace(replay=stack.replay, daemon=daemon)
        started.append(cc.start_proxy(request.param, tmp_path / str(len(started)), where, settings=settings,
                                      **options))
        return started[-1]

    yield start
    for started_proxy in started:
        started_proxy.stop()


def post(port, case_, id_=1):
    return wire.request(port, case_.path, "POST", {"Content-Type": "application/json"}, case_.body(id_),
                        accept_encoding="gzip")


def status(response):
    return response.header("x-rpcedge-cache")


def status_page(port):
    """The counters by name, as a status page prints them (nginx's, the Lua binding's)."""
    lines = wire.request(port, "/rpcedge_status", accept_encoding=None).body.decode().splitlines()
    return {re.match(r"(\w+)\{\}", sample).group(1): int(sample.split()[-1]) for sample in lines[1::2]}


def counters(proxy):
    """rpcedge's counters by their Prometheus names: nginx's status page, Envoy's stats."""
    if proxy.counters:
        return {"rpcedge_" + name.replace(".", "_"): value for name, value in proxy.counters().items()}
    return status_page(proxy.port)


def wait_for(what, timeout=5.0):
    """Waits until `what()` holds."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.05)


def hit_soon(proxy, case_):
    """Asks until a HIT (the store lands behind the answer), with another id of the same length."""
    wait_for(lambda: status(post(proxy.port, case_, id_=2)) == "HIT")


def test_an_answer_over_max_entry_goes_to_the_client_and_is_not_stored(proxy, stack):
    block = case("block_by_hash")
    length = len(block.answer(1))
    over = proxy({"max_entry": length - 1})
    for _ in range(2):
        asked = stack.node_requests()
        response = post(over.port, block)
        # looked up (a miss), then the node's answer is too long to keep
        assert (response.status, status(response), response.decoded()) == (200, "BYPASS", block.answer(1))
        assert stack.node_requests() == asked + 1
    wait_for(lambda: counters(over).get("rpcedge_cache_bypass_answer") == 2)
    assert counters(over)["rpcedge_cache_stores_taken"] == 0
    assert stack.daemon.stats()["stores_total"] == 0

    at = proxy({"max_entry": length})
    assert status(post(at.port, block)) == "MISS"
    hit_soon(at, block)


def test_a_hit_goes_out_in_a_coding_the_location_makes(proxy, stack):
    """A browser's miss goes zstd; its hits go in the best coding the location makes (zstd, br or
    gzip), spliced from the forms the store keeps; where the location makes none that a hit
    splices, hits go plain, never in a coding the location does not make."""
    block = case("block_by_hash")
    browser = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate, br, zstd"}

    def ask(port, id_):
        return wire.request(port, block.path, "POST", browser, block.body(id_), accept_encoding=None)

    default = proxy({})
    miss = ask(default.port, 1)
    assert status(miss) == "MISS" and miss.header("content-encoding") == "zstd"
    wait_for(lambda: status(ask(default.port, 2)) == "HIT")
    locations = ((default, "zstd"), (proxy({}, encodings=["br", "gzip"]), "br"),
                 (proxy({}, encodings=["gzip"]), "gzip"), (proxy({}, encodings=["deflate"]), None))
    for location, coding in locations:
        hit = ask(location.port, 3)
        assert status(hit) == "HIT" and hit.header("content-encoding") == coding, (location.port, coding)
        assert int(hit.header("content-length")) == len(hit.body)
        assert json.loads(hit.decoded()) == dict(json.loads(miss.decoded()), id=3)


def test_a_bypass_says_its_reason_only_where_the_operator_asks(proxy, stack):
    moving, unlisted = case("at_tag"), case("not_in_the_table")
    quiet, telling = proxy({}), proxy({"status_reason": True})
    for started, reason in ((quiet, ""), (telling, "; reason=")):
        assert status(post(started.port, moving)) == f"BYPASS{reason and reason + 'moving'}"
        assert status(post(started.port, unlisted)) == f"BYPASS{reason and reason + 'method'}"
        # a status that is not a bypass has no reason (the second proxy's request may share the
        # first's answer while its store lands: COALESCED)
        assert status(post(started.port, case("block_by_hash"))) in ("MISS", "HIT", "COALESCED")
        wait_for(lambda: counters(started).get("rpcedge_cache_bypass_moving") == 1)
        assert counters(started)["rpcedge_cache_bypass_method"] == 1


def test_a_request_over_max_request_bypasses_the_cache(proxy, stack):
    block = case("block_by_hash")
    length = len(block.body(1))
    over = proxy({"max_request": length - 1})
    for _ in range(2):
        asked = stack.node_requests()
        response = post(over.port, block)
        assert (response.status, status(response), response.decoded()) == (200, "BYPASS", block.answer(1))
        assert stack.node_requests() == asked + 1
    wait_for(lambda: counters(over).get("rpcedge_cache_bypass_too_large") == 2)
    stats = stack.daemon.stats()
    assert stats["hits_total"] + stats["misses_total"] == 0, "the daemon was never asked"

    at = proxy({"max_request": length})
    assert status(post(at.port, block)) == "MISS"
    hit_soon(at, block)


def test_a_store_at_max_entry_is_taken_by_a_daemon_with_the_same_max_entry(proxy, stack):
    """The daemon adds the entry's envelope and kept head to its `--max-entry` itself."""
    block = case("block_by_hash")
    length = len(block.answer(1))
    default_args = stack.daemon_args
    stack.daemon_args = [*default_args, "--max-entry", str(length)]
    try:
        stack.fresh_daemon()
        at = proxy({"max_entry": length})
        assert status(post(at.port, block)) == "MISS"
        hit_soon(at, block)
        # (a probe before the store landed stores again)
        stats = stack.daemon.stats()
        assert stats["stores_total"] >= 1 and stats['refusals_total{reason="too_large"}'] == 0, stats
        assert counters(at)["rpcedge_cache_stores_refused"] == 0
    finally:
        stack.daemon_args = default_args


def test_a_chain_property_is_kept_for_chain_ttl(proxy, stack):
    chain_id = case("chain")
    short = proxy({"chain_ttl_s": 1})
    assert status(post(short.port, chain_id)) == "MISS"
    hit_soon(short, chain_id)
    # kept a second: the daemon says so once it has passed (the default keeps it an hour)
    wait_for(lambda: status(post(short.port, chain_id)) == "EXPIRED", timeout=4)


class LateStores(StandIn):
    """In the daemon's place: every lookup misses, and a store is answered (204) only `delay`
    seconds after it came."""

    def __init__(self, delay):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.answer(404, {"X-Rpcedge-Miss": "absent"})

            def do_PUT(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay)
                self.answer(204, {})

            def answer(self, code, headers):
                try:
                    self.send_response(code)
                    for name, value in {**headers, "Content-Length": "0"}.items():
                        self.send_header(name, value)
                    self.end_headers()
                except OSError:
                    pass  # the proxy gave up on the store

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.mark.parametrize("store_timeout_s, taken", [(1, False), (5, True)])
def test_a_store_waits_for_the_daemon_as_long_as_store_timeout(proxy, stack, store_timeout_s, taken):
    """The daemon deflates an entry before it answers: a store may take longer than a lookup
    (nginx's example location lets it)."""
    daemon = LateStores(delay=3)
    try:
        late = proxy({"store_timeout_s": store_timeout_s}, daemon=daemon, timeout_ms=1000)
        answered = time.monotonic()
        assert status(post(late.port, case("block_by_hash"))) == "MISS"
        outcome, other = ("taken", "failed") if taken else ("failed", "taken")
        wait_for(lambda: counters(late).get(f"rpcedge_cache_stores_{outcome}") == 1, timeout=8)
        waited = time.monotonic() - answered
        assert waited > 3 if taken else waited < 2.5, waited
        assert counters(late)[f"rpcedge_cache_stores_{other}"] == 0
    finally:
        daemon.stop()


@pytest.mark.parametrize("directive, message", [
    ("rpcedge_cache_max_request 17m;", "\"rpcedge_cache_max_request\" directive must be between 0 and 16777216"),
    ("rpcedge_cache_max_entry 65m;", "\"rpcedge_cache_max_entry\" directive must be between 0 and 67108864"),
    ("rpcedge_cache_chain_ttl 0;", "\"rpcedge_cache_chain_ttl\" directive must be between 1 and 86400, got 0"),
    ("rpcedge_cache_store_timeout 61s;", "\"rpcedge_cache_store_timeout\" directive must be between 1 and 60, got 61"),
    ("rpcedge_cache_store_timeout 500ms;", "invalid value"),
])
def test_nginx_refuses_a_cache_setting_out_of_the_cores_bounds(tmp_path, directive, message):
    conf = tmp_path / "nginx.conf"
    conf.write_text(main_conf(tmp_path, f"server {{ listen {LOOPBACK}:{free_port()}; {directive} }}"))
    code, output = check_conf(conf, tmp_path)
    assert code != 0 and message in output, output


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("settings, field", [
    ({"max_entry": 67108865}, "cache_max_entry"),
    ({"store_timeout_s": 0}, "cache_store_timeout_s"),
])
def test_envoy_refuses_a_cache_setting_out_of_the_cores_bounds(tmp_path, adapter, settings, field):
    text = render_config(free_port(), free_port(), free_port(), json.dumps({"cache": settings}), adapter=adapter)
    process = start_envoy(tmp_path, text)
    try:
        assert process.proc.wait(timeout=60) != 0
    finally:
        process.stop()
    assert any("invalid plugin configuration" in line and field in line
               for line in process.log.read_text().splitlines()), process.log_tail()


def test_lua_runs_its_own_storage_with_its_settings_cache_limits(replay, tmp_path):
    """rpcedge.cache(settings, ...) in the OpenResty example, the settings' cache section with
    `max_entry` just below the answer and `max_request` just below a longer spelling's body."""
    from test_openresty import start_openresty
    block = case("block_by_hash")
    # the daemon off: its limits apply to the shared dict
    limits = {"enabled": False, "max_entry": len(block.answer(1)) - 1, "max_request": len(block.body(1))}
    port, process = start_openresty(tmp_path, replay.port, json.dumps({"cache": limits}))
    try:
        # the answer, twice, over max_entry; then a longer spelling of the call over max_request
        for body in (block.body(1), block.body(1), block.body(1, indent=1)):
            response = wire.request(port, f"/cached/{block.network}", method="POST", body=body,
                                    headers={"Content-Type": "application/json"})
            assert (response.status, status(response), response.decoded()) == (200, "BYPASS", block.answer(1))
        counted = status_page(port)
        assert (counted["rpcedge_cache_bypass_answer"], counted["rpcedge_cache_bypass_too_large"]) == (2, 1)
    finally:
        process.stop()
