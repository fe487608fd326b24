"""The response cache through real nginx, real Envoy (both adapters) and OpenResty (the Lua binding,
in its subrequest and proxy_pass forms): each asks the real daemon (rpcedge-cached) before the node
(the replay, which counts what reaches it), answers hits itself, stores misses behind the answer,
and fails open when the daemon is dead, stopped or slow. Every test runs through every host, and
one goes from one to another."""

import concurrent.futures
import gzip
import http.client
import json
import os
import signal
import socket
import threading
import time
import types
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from testbed import cache_cases as cc
from testbed import replay_corpus as rc
from testbed import wire
from testbed.cache_cases import start_proxy
from testbed.envoy_harness import ENVOY_HOSTS
from testbed.nginx_harness import free_port
from testbed.harness import LOOPBACK, REPO, SSZ_EXAMPLES, StandIn, one_request
from testbed.toxiproxy import Toxiproxy

# a store lands within this long of the answer's end (the bound)
VISIBLE_WITHIN = 1.0


CASES = {}
# the block the finality node places the trace's transaction in (in the namespace `late`)
TRACE_BLOCK = 1000


def case(name):
    if name not in CASES:
        CASES[name] = cc.find(getattr(cc, name))
    return CASES[name]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    networks = [case(name).network for name in ("block_by_hash", "receipt", "null_result", "error_answer",
                                                 "logs_by_hash", "logs_by_range")]
    placed = [(case("trace_by_transaction").request["params"][0], TRACE_BLOCK)]
    # the blocks whose answers the tests keep in `late`, by the hash the daemon pins them to
    pinned = [(final_block(name, found), found.response["result"]["hash" if name == "by_number" else "blockHash"])
              for name, found in (("receipt", case("receipt")), ("by_number", cc.find(by_number)))]
    # and one the node answers from another fork: the finality nodes give the block another hash
    pinned.append((final_block("by_number", forked_block()), "0x" + "ee" * 32))
    stack = cc.CacheStack(tmp_path_factory.mktemp("cache-stack"), networks, placed=placed, pinned=pinned)
    yield stack
    stack.stop()


@pytest.fixture(params=["nginx", *ENVOY_HOSTS, "openresty", "openresty-proxied"])
def proxies(request, tmp_path, stack):
    """Starts proxies of the test's host (or the one named), stopped after the test; the test
    begins with an empty daemon."""
    stack.fresh_daemon()
    started = []

    def start(host=request.param, stack=stack, **options):
        proxy = start_proxy(host, tmp_path / f"{host}-{len(started)}", stack, **options)
        started.append(proxy)
        return proxy

    start.host = request.param
    yield start
    for proxy in started:
        proxy.stop()


def post(port, case_, id_=1, accept_encoding="gzip", **json_args):
    return wire.request(port, case_.path, "POST", {"Content-Type": "application/json"},
                        case_.body(id_, **json_args), accept_encoding=accept_encoding)


def status(response):
    return response.header("x-rpcedge-cache")


def exact_length(proxy, response):
    """Whether the response carries its exact Content-Length. OpenResty's proxy_pass form sends
    its head before the node's body is in: what it compresses or merges there goes without one."""
    if proxy.host == "openresty-proxied" and response.header("content-length") is None:
        return status(response) != "HIT" and response.header("transfer-encoding") == "chunked"
    return int(response.header("content-length")) == len(response.body)


def wait_for_hit(port, case_, answered_at):
    """Asks until a HIT; the store must have landed within VISIBLE_WITHIN of `answered_at`."""
    while True:
        response = post(port, case_, id_="probe")
        if status(response) == "HIT":
            return response
        assert time.monotonic() - answered_at < VISIBLE_WITHIN, f"not stored in time: {status(response)}"
        time.sleep(0.02)


NOT_FINAL = 'refusals_total{reason="not_final"}'
FORKED = 'refusals_total{reason="forked"}'


def refused_as_not_final(stack, since, count, reason=NOT_FINAL):
    """Waits until the daemon has refused `count` stores as not final (or for `reason`) since it
    had refused `since`: each MISS's store came, and was refused. Exactly `count`: none came twice."""
    deadline = time.monotonic() + VISIBLE_WITHIN
    while (refused := stack.daemon.stats().get(reason, 0) - since) < count:
        assert time.monotonic() < deadline, f"{refused} of {count} stores refused in time"
        time.sleep(0.02)
    assert refused == count


def test_a_miss_is_answered_by_the_node_and_stored_then_hits_never_reach_it(proxies, stack):
    proxy = proxies()
    block = case("block_by_hash")
    before = stack.node_requests()
    miss = post(proxy.port, block, id_=7)
    answered_at = time.monotonic()
    assert (miss.status, status(miss)) == (200, "MISS")
    assert miss.decoded() == block.answer(7)
    assert stack.node_requests() == before + 1
    wait_for_hit(proxy.port, block, answered_at)

    asked = stack.node_requests()
    # another id, another layout of the same call: the same entry, the client's own id
    hit = post(proxy.port, block, id_="client-id", indent=2, sort_keys=True)
    assert (hit.status, status(hit)) == (200, "HIT")
    assert hit.header("content-encoding") == "gzip"
    assert int(hit.header("content-length")) == len(hit.body), "an exact Content-Length"
    assert gzip.decompress(hit.body) == block.answer("client-id")
    assert hit.header("content-type") == "application/json"
    assert hit.header("vary") == "Accept-Encoding"
    # a client without gzip gets the plain envelope
    plain = post(proxy.port, block, id_=3, accept_encoding=None)
    assert (status(plain), plain.header("content-encoding")) == ("HIT", None)
    assert plain.body == block.answer(3) and int(plain.header("content-length")) == len(plain.body)
    assert stack.node_requests() == asked, "hits never reach the node"
    if proxy.counters:
        counters = proxy.counters()
        assert counters["cache.responses.hit"] >= 3 and counters["cache.responses.miss"] >= 1, counters
        assert counters["cache.stores.taken"] >= 1, counters


def by_number(request, response):
    params = request.get("params") or [None]
    return (request["method"] == "eth_getBlockByNumber" and isinstance(params[0], str)
            and params[0].startswith("0x") and int(params[0], 16) > 0 and isinstance(response.get("result"), dict))


def final_block(name, case_):
    """The block that must be final before `case_`'s answer is kept."""
    if name == "logs_by_range":
        return int(case_.request["params"][0]["toBlock"], 16)
    return int(case_.response["result"]["number" if name == "by_number" else "blockNumber"], 16)


@pytest.mark.parametrize("name", ["receipt", "by_number", "logs_by_range"])
def test_an_entry_is_stored_only_once_its_block_is_final(proxies, stack, name):
    # the namespace whose finality the test moves (finality never moves back)
    proxy = proxies(namespace=cc.CacheStack.LATE)
    receipt = cc.find(by_number) if name == "by_number" else case(name)
    # for a range of logs, the range's lower end is final: not enough
    block = final_block(name, receipt)
    stack.finalize_late(block - 1)
    since = stack.daemon.stats().get(NOT_FINAL, 0)
    for n in (1, 2):
        response = post(proxy.port, receipt)
        assert (response.status, status(response)) == (200, "MISS")
        assert response.decoded() == receipt.answer()
        refused_as_not_final(stack, since, n)
    stack.finalize_late(block)
    post(proxy.port, receipt)
    wait_for_hit(proxy.port, receipt, time.monotonic())


def forked_block():
    """A block by number whose answer the tests of `late` keep nowhere else."""
    taken = {final_block("receipt", case("receipt")), final_block("by_number", cc.find(by_number))}
    return next(found for found in cc.find_all(by_number) if final_block("by_number", found) not in taken)


def test_a_final_blocks_answer_from_another_fork_is_the_clients_and_never_kept(proxies, stack):
    """The node's answer names a final block by a hash that the finality nodes do not give it (a
    backend on a minority fork behind the node's address): each client gets it as the node sent
    it, and the daemon keeps none."""
    proxy = proxies(namespace=cc.CacheStack.LATE)
    forked = forked_block()
    stack.finalize_late(final_block("by_number", forked))
    since, asked = stack.daemon.stats().get(FORKED, 0), stack.node_requests()
    for n in (1, 2):
        response = post(proxy.port, forked)
        assert (response.status, status(response), response.decoded()) == (200, "MISS", forked.answer())
        refused_as_not_final(stack, since, n, reason=FORKED)
    assert stack.node_requests() - asked == 2


@pytest.mark.parametrize("name", ["logs_by_hash", "logs_by_range"])
def test_logs_by_hash_or_by_a_final_range_are_hits_and_at_a_tag_bypass(proxies, stack, name):
    proxy = proxies()
    logs = case(name)
    miss = post(proxy.port, logs)
    assert (miss.status, status(miss), miss.decoded()) == (200, "MISS", logs.answer())
    hit = wait_for_hit(proxy.port, logs, time.monotonic())
    assert hit.decoded() == logs.answer("probe")
    filter_ = {key: value for key, value in logs.request["params"][0].items() if key != "blockHash"}
    for moving in ({**filter_, "toBlock": "latest"}, {**filter_, "fromBlock": "0x0", "toBlock": "finalized"},
                   {key: value for key, value in filter_.items() if key != "toBlock"}):
        at_tag = cc.Case(logs.network, logs.method, {**logs.request, "params": [moving]}, logs.response)
        assert status(post(proxy.port, at_tag)) == "BYPASS", moving


def test_a_trace_by_transaction_is_stored_once_the_block_of_its_transaction_is_final(proxies, stack):
    proxy = proxies(namespace=cc.CacheStack.LATE)
    trace = case("trace_by_transaction")
    stack.finalize_late(TRACE_BLOCK - 1)
    since = stack.daemon.stats().get(NOT_FINAL, 0)
    for n in (1, 2):
        response = post(proxy.port, trace)
        assert (response.status, status(response), response.decoded()) == (200, "MISS", trace.answer())
        refused_as_not_final(stack, since, n)
    stack.finalize_late(TRACE_BLOCK)
    post(proxy.port, trace)
    hit = wait_for_hit(proxy.port, trace, time.monotonic())
    assert hit.decoded() == trace.answer("probe")


def test_an_entry_stored_through_one_host_is_a_hit_through_the_other(proxies, stack):
    first = proxies()
    other = proxies("envoy" if first.host == "nginx" else "nginx")
    block = case("block_by_hash")
    assert status(post(first.port, block)) == "MISS"
    hit = wait_for_hit(other.port, block, time.monotonic())
    assert gzip.decompress(hit.body) == block.answer("probe")


@pytest.mark.parametrize("name", ["null_result", "error_answer", "at_tag", "not_in_the_table"])
def test_what_the_cache_never_takes_always_reaches_the_node(proxies, stack, name):
    proxy = proxies()
    sent = case(name)
    expected = "MISS" if name in ("null_result", "error_answer") else "BYPASS"
    for _ in range(3):
        before = stack.node_requests()
        response = wire.request(proxy.port, sent.path, "POST", {"Content-Type": "application/json"},
                                json.dumps(sent.request).encode())
        assert (response.status, status(response)) == (200, expected)
        assert json.loads(response.decoded()) == sent.response
        assert stack.node_requests() == before + 1
        time.sleep(0.1)


def batch_calls(network, count):
    """`count` calls of `network` the cache keeps at once (their blocks are final in the stack),
    and one it never keeps (a method it does not take), each with its answer alone."""
    kept = [c for c in cc.find_all(cc.immutable) if c.network == network][:count]
    never = [c for c in cc.find_all(cc.not_in_the_table) if c.network == network][:1]
    assert len(kept) == count and never, f"{network}: {len(kept)} kept, {len(never)} never kept"
    return kept, never[0]


def answer_with(case_, id_):
    return json.loads(case_.answer(id_))


def send_batch(proxy, network, calls, accept_encoding="gzip"):
    return wire.request(proxy.port, f"/{network}", "POST", {"Content-Type": "application/json"},
                        rc.compact(calls), accept_encoding=accept_encoding)


def test_a_batch_is_split_between_the_cache_and_the_node_and_answered_in_the_clients_order(proxies, stack):
    """What ethers v6 sends by default (`batchMaxCount` 100): the calls the cache holds are
    answered from it, only the others reach the node, and the client gets one array in its own
    order, each answer with its own id."""
    proxy = proxies()
    network = case("not_in_the_table").network
    kept, moving = batch_calls(network, 2)
    call = lambda case_, id_: {**case_.request, "id": id_}

    # none stored yet: the batch goes whole, and each answer is stored as if it came alone
    before = stack.node_requests()
    ids = [1, None]
    first = send_batch(proxy, network, [call(c, i) for c, i in zip(kept, ids)])
    assert (first.status, status(first)) == (200, "MISS")
    assert json.loads(first.decoded()) == [answer_with(c, i) for c, i in zip(kept, ids)]
    assert stack.node_requests() == before + 1
    answered_at = time.monotonic()
    for c in kept:
        wait_for_hit(proxy.port, c, answered_at)

    # partly stored: the node sees the call the cache never keeps and a notification; the client
    # gets its order
    before = stack.node_requests()
    notification = {k: v for k, v in moving.request.items() if k != "id"}
    partial = [call(kept[1], 5), call(moving, "m"), notification, call(kept[0], 6)]
    response = send_batch(proxy, network, partial)
    assert (response.status, status(response)) == (200, "MISS")
    assert exact_length(proxy, response), "an exact Content-Length"
    assert json.loads(response.decoded()) == [answer_with(kept[1], 5), answer_with(moving, "m"),
                                              answer_with(kept[0], 6)]
    assert stack.node_requests() == before + 1

    # every call stored: the node never sees the batch; gzip or plain, with an exact length
    before = stack.node_requests()
    whole = [call(c, i) for c, i in zip(kept, [9, "x"])]
    for accept_encoding in ("gzip", None):
        hit = send_batch(proxy, network, whole, accept_encoding=accept_encoding)
        assert (hit.status, status(hit)) == (200, "HIT")
        assert int(hit.header("content-length")) == len(hit.body)
        assert (hit.header("content-encoding") == "gzip") == (accept_encoding == "gzip")
        assert json.loads(hit.decoded()) == [answer_with(c, i) for c, i in zip(kept, [9, "x"])]
    assert stack.node_requests() == before, "a batch the cache answers whole never reaches the node"

    # past the limit (100 calls), or with an id twice: whole to the node, as it came
    for batch in ([call(kept[0], n) for n in range(101)], [call(kept[0], 1), call(kept[1], 1)]):
        before = stack.node_requests()
        response = send_batch(proxy, network, batch)
        assert (response.status, status(response)) == (200, "BYPASS")
        assert len(json.loads(response.decoded())) == len(batch)
        assert stack.node_requests() == before + 1
    if proxy.counters:
        counters = proxy.counters()
        assert counters["cache.responses.hit"] >= 2 and counters["cache.bypass.batch"] >= 2, counters


BLINDED_BLOCKS = "/eth/v1/beacon/blinded_blocks/"
# the real deneb blinded block the replay serves (its slot is 348241)
BLINDED_ROOT = "0x50b3798189636f067c5456a93df6ea6ba4ac71c02059a81e567134378e0b11a1"


def beacon_get(port, path, accept, accept_encoding="gzip"):
    return wire.request(port, path, "GET", {"Accept": accept}, accept_encoding=accept_encoding)


def test_beacon_reads_by_root_and_by_final_slot_are_hits_in_json_and_ssz_from_one_entry(proxies, stack):
    proxy = proxies(namespace=stack.BEACON)
    real = SSZ_EXAMPLES / "real"
    ssz = (real / "signed-blinded-beacon-block-deneb.computed.ssz").read_bytes()
    # (its fee_recipient is checksummed; the JSON rendered from SSZ writes hex in lower case)
    data = json.loads((real / "signed-blinded-beacon-block-deneb.json").read_text().lower())
    slot = BLINDED_BLOCKS + str(stack.BEACON_FINAL + 1)
    beacon = lambda: stack.node_requests("beacon_requests")  # noqa: E731

    # a slot above the finalized one is answered by the node, and not kept (once the refused
    # store has landed: until then a miss shares the answer, COALESCED)
    before = beacon()
    for _ in range(2):
        assert status(beacon_get(proxy.port, slot, "application/json")) == "MISS"
        time.sleep(VISIBLE_WITHIN)
    assert beacon() == before + 2
    stack.finalize_slot(stack.BEACON_FINAL + 1)

    for path in (BLINDED_BLOCKS + BLINDED_ROOT, slot):
        before = beacon()
        miss = beacon_get(proxy.port, path, "application/json")
        answered_at = time.monotonic()
        assert (miss.status, status(miss)) == (200, "MISS"), path
        while status(beacon_get(proxy.port, path, "application/json")) != "HIT":
            assert time.monotonic() - answered_at < VISIBLE_WITHIN, f"{path} was not stored"
            time.sleep(0.02)
        asked = beacon()
        for accept, encoding in [("application/octet-stream", None), ("application/octet-stream", "gzip"),
                                 ("application/json", None), ("application/json", "gzip")]:
            hit = beacon_get(proxy.port, path, accept, accept_encoding=encoding)
            assert (hit.status, status(hit)) == (200, "HIT"), (path, accept, encoding)
            assert int(hit.header("content-length")) == len(hit.body), "an exact Content-Length"
            assert hit.header("content-encoding") == encoding
            assert hit.header("content-type") == accept
            assert "Accept" in hit.header("vary").split(", "), hit.header("vary")
            assert hit.header("eth-consensus-version") == "deneb"
            if accept == "application/octet-stream":
                assert hit.decoded() == ssz, "the node's block as SSZ"
            else:
                answer = json.loads(hit.decoded())
                assert (answer["version"], answer["execution_optimistic"], answer["finalized"]) == \
                    ("deneb", False, True)
                assert answer["data"] == data
        assert beacon() == asked, "hits never reach the node"
        assert asked == before + 1

    # head moves: never looked up
    head = beacon_get(proxy.port, BLINDED_BLOCKS + "head", "application/json")
    assert status(head) == "BYPASS"


class StandInNode(StandIn):
    """A node that answers every call with `case`'s recorded answer (the caller's id) after
    `delays[i]` seconds for its i-th request (the last delay after that), or with a 503 for the
    requests `failing` numbers; it counts what reaches it, and keeps the Accept-Encoding each
    request had (None: none). With `compresses` "asked", it gzips its answer for a request that
    accepts gzip, as geth and erigon do; with "always", for every request (a node or middlebox that
    compresses regardless)."""

    def __init__(self, case_, delays, failing=(), compresses=False):
        node = self
        self.requests = 0
        self.accept_encodings = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                accept_encoding = self.headers.get("Accept-Encoding")
                with node.lock:
                    number = node.requests
                    node.requests += 1
                    node.accept_encodings.append(accept_encoding)
                time.sleep(delays[min(number, len(delays) - 1)])
                if number in failing:
                    answer, status = b"overloaded\n", 503
                else:
                    answer, status = case_.answer(json.loads(body)["id"]), 200
                gzipped = compresses == "always" or (compresses == "asked" and "gzip" in (accept_encoding or ""))
                if gzipped:
                    answer = gzip.compress(answer)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    if gzipped:
                        self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except ConnectionError:
                    pass  # the proxy gave up on this request (its client went away)

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.fixture
def stand_in(proxies, stack):
    """Starts a proxy of the test's host in front of a stand-in node (`StandInNode`'s arguments)
    with the cache's `settings`, on the stack's daemon."""
    nodes = []

    def start(delays, failing=(), settings=None, compresses=False):
        node = StandInNode(case("block_by_hash"), delays, failing, compresses)
        nodes.append(node)
        return node, beside(node, settings)

    def beside(node, settings=None):
        """Another proxy of the host in front of `node`, on the same daemon."""
        return proxies(stack=types.SimpleNamespace(replay=node, daemon=stack.daemon), settings=settings)

    start.beside = beside
    yield start
    for node in nodes:
        node.stop()


def all_at_once(port, count):
    """`count` clients ask for the stack's block at once, each with its own id: their responses,
    in id order."""
    block, ready = case("block_by_hash"), threading.Barrier(count)

    def ask(id_):
        ready.wait()
        return post(port, block, id_=id_)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(ask, range(count)))


def test_concurrent_misses_of_one_key_send_the_node_one_request_and_share_its_answer(stand_in):
    node, proxy = stand_in(delays=[1.0])
    responses = all_at_once(proxy.port, 20)
    assert node.requests == 1, "the misses that came while the first was at the node waited for it"
    block = case("block_by_hash")
    for id_, response in enumerate(responses):
        assert response.status == 200 and response.decoded() == block.answer(id_), id_
        assert exact_length(proxy, response)
        # every one of these gzip clients gets it gzip, the holder's and the waiters' alike
        assert response.header("content-encoding") == "gzip", (id_, status(response))
    statuses = sorted(status(response) for response in responses)
    # the holder is the one MISS; a late comer may find the answer stored already
    assert statuses.count("MISS") == 1 and set(statuses) <= {"MISS", "COALESCED", "HIT"}, statuses
    assert statuses.count("COALESCED") >= 10, statuses
    if proxy.counters:
        assert proxy.counters()["cache.responses.coalesced"] == statuses.count("COALESCED")


def test_a_node_that_compresses_when_asked_is_asked_for_identity_and_its_answers_kept(stand_in):
    """geth and erigon gzip whenever the request accepts gzip: rpcedge removes Accept-Encoding
    towards the node by itself (no proxy_set_header in these configs), so the answer is kept, then
    hit, and every client gets what it asked for."""
    node, proxy = stand_in(delays=[0], compresses="asked")
    block = case("block_by_hash")
    first = post(proxy.port, block, id_=1)
    assert status(first) == "MISS" and first.decoded() == block.answer(1)
    assert first.header("content-encoding") == "gzip" and exact_length(proxy, first)
    assert node.accept_encodings == [None], "the node was asked for identity"
    hit = wait_for_hit(proxy.port, block, time.monotonic())
    assert hit.decoded() == block.answer("probe") and hit.header("content-encoding") == "gzip"
    plain = post(proxy.port, block, id_=2, accept_encoding=None)
    assert status(plain) == "HIT" and plain.header("content-encoding") is None
    assert plain.body == block.answer(2)
    assert node.requests == 1


def test_an_answer_gzipped_regardless_is_decoded_for_a_gzip_client_and_for_one_that_takes_no_coding(stand_in):
    """A node that gzips although asked for identity: a gzip client gets rpcedge's own answer (gzip
    with its exact length, decoded equal), every time (such answers are not kept: the cache holds
    the node's bytes); a client that takes no coding gets it decoded, not a coding it did not ask
    for (what may not be transformed, a HEAD, a range or no-transform, goes as it came); both are
    counted as upstream_encoded."""
    node, proxy = stand_in(delays=[0], compresses="always")
    block = case("block_by_hash")
    for id_ in (1, 2):
        response = post(proxy.port, block, id_=id_)
        assert response.status == 200 and response.decoded() == block.answer(id_), id_
        assert response.header("content-encoding") == "gzip" and exact_length(proxy, response), id_
        assert status(response) == "MISS", "not kept: the cache held the node's gzip"
    plain = post(proxy.port, block, id_=3, accept_encoding=None)
    assert plain.status == 200 and plain.header("content-encoding") is None and plain.complete
    assert plain.body == block.answer(3)
    assert node.accept_encodings == [None, None, None]
    if proxy.counters:
        assert proxy.counters()["upstream_encoded"] == 3


def test_a_failure_at_the_node_is_never_handed_to_the_misses_that_waited(stand_in):
    node, proxy = stand_in(delays=[1.0, 0.0], failing={0})
    responses = all_at_once(proxy.port, 6)
    block = case("block_by_hash")
    failed = [response for response in responses if response.status == 503]
    assert len(failed) == 1, "the holder's own client gets the node's failure"
    answered = [(id_, response) for id_, response in enumerate(responses) if response.status != 503]
    for id_, response in answered:
        assert (response.status, response.decoded()) == (200, block.answer(id_)), id_
        assert status(response) in {"MISS", "HIT"}, status(response)
    # released, each went to the node itself (or found the first of them stored)
    assert 2 <= node.requests <= 6


def test_a_holder_slower_than_the_lock_timeout_leaves_the_waiters_to_the_node(stand_in):
    node, proxy = stand_in(delays=[3.0, 0.0], settings={"lock_timeout_ms": 300})
    holder = concurrent.futures.ThreadPoolExecutor(1).submit(post, proxy.port, case("block_by_hash"), 99)
    time.sleep(0.2)
    started = time.monotonic()
    responses = all_at_once(proxy.port, 4)
    waited = time.monotonic() - started
    block = case("block_by_hash")
    for id_, response in enumerate(responses):
        assert (response.status, response.decoded()) == (200, block.answer(id_)), id_
    assert waited < 2.5, f"the waiters waited {waited:.1f}s, the holder's whole time"
    assert status(holder.result()) == "MISS" and holder.result().decoded() == block.answer(99)
    assert node.requests >= 2


def leave_while_the_node_answers(proxy, node, block):
    """A client asks `proxy` for `block` and goes away once its request has reached `node`."""
    body = block.body("gone")
    with socket.create_connection((LOOPBACK, proxy.port)) as gone:
        gone.sendall(b"POST %s HTTP/1.1\r\nHost: rpc\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (block.path.encode(), len(body), body))
        deadline = time.monotonic() + 2
        while node.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert node.requests == 1, "the holder's request reached the node"
    time.sleep(0.2)


def test_a_holder_whose_client_goes_away_releases_its_key_at_once(stand_in):
    # the default lock timeout (5 s): a key left held would make every other client of the daemon
    # wait for it. The next client comes through another proxy on the same daemon, so nothing on
    # the holder's side asks for the key again.
    node, proxy = stand_in(delays=[1.5, 0.0])
    other = stand_in.beside(node)
    block = case("block_by_hash")
    leave_while_the_node_answers(proxy, node, block)
    started = time.monotonic()
    response = post(other.port, block, id_=7)
    waited = time.monotonic() - started
    assert (response.status, response.decoded()) == (200, block.answer(7))
    assert waited < 2.5, f"the next client waited {waited:.1f}s for a key no one would answer"
    if proxy.host == "openresty":
        # nginx runs a subrequest to its end when its client goes: its answer is handed over
        assert (node.requests, status(response)) in ((1, "COALESCED"), (1, "HIT"))
    else:
        assert node.requests == 2


class PrefixedDaemon(StandIn):
    """The daemon one hop away, under /cache-api/ (as behind a router); anything else is a 404
    here, counted in `refused`."""

    def __init__(self, daemon_port):
        hop = self
        self.refused = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                status, headers, answer = 404, [], b""
                if self.path.startswith("/cache-api/"):
                    sent = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "host")}
                    status, headers, answer = one_request(http.client.HTTPConnection(LOOPBACK, daemon_port, timeout=30),
                                                          self.command, self.path.removeprefix("/cache-api"), body, sent)
                else:
                    hop.refused += 1
                self.send_response(status)
                for name, value in headers.items() if headers else ():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_PUT = do_POST = do_DELETE = forward

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def the_next_client_through_a_prefixed_hop(proxies, stack, node, before, extra=""):
    """nginx with the daemon one hop away under a prefix, which refuses the daemon's own paths (the
    worker's own release), and the location rewriting to it: `before(proxy, block)`, then the next
    client asks for the block. How many the hop refused, that client's answer and its wait."""
    hop = PrefixedDaemon(stack.daemon.port)
    under_the_prefix = lambda text: text.replace("rewrite ^/_rpcedge_cache(/.*)$ $1 break;",  # noqa: E731
                                                 "rewrite ^/_rpcedge_cache(/.*)$ /cache-api$1 break;")
    block = case("block_by_hash")
    try:
        proxy = proxies(stack=types.SimpleNamespace(replay=node, daemon=hop), cache_pass=under_the_prefix, extra=extra)
        before(proxy, block)
        started = time.monotonic()
        response = post(proxy.port, block, id_=7)
        return hop.refused, response, time.monotonic() - started
    finally:
        node.stop()
        hop.stop()


@pytest.mark.parametrize("proxies", ["nginx"], indirect=True)
def test_a_release_the_daemon_would_not_take_at_once_is_left_to_the_next_lookup(proxies, stack):
    """nginx: the worker's own release goes to the daemon's own path, which a daemon one hop away
    under a prefix refuses; the key is then released by the worker's next lookup, through the
    location."""
    node = StandInNode(case("block_by_hash"), delays=[1.5, 0.0])
    refused, response, waited = the_next_client_through_a_prefixed_hop(
        proxies, stack, node, lambda proxy, block: leave_while_the_node_answers(proxy, node, block))
    assert refused >= 1, "the worker sent no release of its own"
    assert (response.status, response.decoded()) == (200, case("block_by_hash").answer(7))
    assert waited < 2.5, f"the next client waited {waited:.1f}s for a key no one would answer"
    assert node.requests == 2


@pytest.mark.parametrize("proxies", ["nginx"], indirect=True)
def test_a_holder_an_error_page_took_elsewhere_is_released_where_its_lookup_went(proxies, stack):
    """nginx: a miss whose node failed ends in an error_page's location, which names an
    rpcedge_cache_pass of its own; the release the daemon (one hop away under a prefix) refuses
    is left to the next lookup through the location that looked up, not the one it ended in."""
    node = StandInNode(case("block_by_hash"), delays=[0.0], failing=(0,))
    error_page = """
        proxy_intercept_errors on;
        error_page 503 = /overloaded;
        location = /overloaded {
            rpcedge_cache_pass /_rpcedge_elsewhere;
            return 503 "overloaded\\n";
        }"""
    failed = []

    def fail_then_wait(proxy, block):
        failed.append(post(proxy.port, block, id_=1))
        time.sleep(1.0)  # the worker's release has been refused: the key waits for a lookup

    refused, response, waited = the_next_client_through_a_prefixed_hop(proxies, stack, node, fail_then_wait, error_page)
    assert (failed[0].status, failed[0].decoded()) == (503, b"overloaded\n")
    assert refused >= 1, "the worker sent no release of its own"
    assert (response.status, response.decoded()) == (200, case("block_by_hash").answer(7))
    assert waited < 2.5, f"the next client waited {waited:.1f}s for a key no one would answer"
    assert node.requests == 2


@pytest.mark.parametrize("proxies", list(ENVOY_HOSTS), indirect=True)
def test_a_client_that_leaves_during_its_lookup_leaves_the_key_to_the_next_request(proxies, stack, tmp_path):
    # Envoy drops the answer to a lookup whose stream is gone: had the daemon made that request
    # the key's holder, the next client would wait the whole lock timeout (5 s) for nothing. The
    # request releases the key by the name its lookup gave, whether its lookup or its release
    # reaches the daemon first. The lookups and the release cross a link that delays them.
    node = StandInNode(case("block_by_hash"), delays=[0.0, 0.0])
    with Toxiproxy(tmp_path) as toxiproxy:
        try:
            daemon = types.SimpleNamespace(port=toxiproxy.link("daemon", stack.daemon.port))
            proxy = proxies(stack=types.SimpleNamespace(replay=node, daemon=daemon))
            toxiproxy.add("daemon", "latency", stream="upstream", latency=600)
            block = case("block_by_hash")
            body = block.body("gone")
            with socket.create_connection((LOOPBACK, proxy.port)) as gone:
                gone.sendall(b"POST %s HTTP/1.1\r\nHost: rpc\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (block.path.encode(), len(body), body))
                time.sleep(0.2)
            time.sleep(1.0)  # its lookup and its release have reached the daemon
            toxiproxy.reset()
            started = time.monotonic()
            response = post(proxy.port, block, id_=7)
            waited = time.monotonic() - started
        finally:
            node.stop()
    assert (response.status, response.decoded()) == (200, block.answer(7))
    assert waited < 2.5, f"the next client waited {waited:.1f}s for a key no one would answer"
    assert node.requests == 1, "the client that left never reached the node"


@pytest.mark.parametrize("proxies", ["openresty-proxied"], indirect=True)
def test_a_holder_sent_to_an_error_page_leaves_the_key_to_the_next_request(proxies, stack):
    """OpenResty: an error_page that sends the holder elsewhere wipes ngx.ctx; the log phase still
    finds its cache (by $request_id) and releases the key."""
    node = StandInNode(case("block_by_hash"), delays=[0.0], failing={0})
    try:
        proxy = proxies(stack=types.SimpleNamespace(replay=node, daemon=stack.daemon),
                        extra="proxy_intercept_errors on;\n        error_page 503 = @down;\n"
                              "        location @down { return 503 \"down\\n\"; }")
        block = case("block_by_hash")
        down = post(proxy.port, block, id_=1)
        assert (down.status, down.body) == (503, b"down\n")
        started = time.monotonic()
        response = post(proxy.port, block, id_=2)
        waited = time.monotonic() - started
        assert (response.status, status(response), response.decoded()) == (200, "MISS", block.answer(2))
        assert waited < 2.5, f"the next client waited {waited:.1f}s for a key no one would answer"
        assert node.requests == 2
    finally:
        node.stop()


def raw_block_by_number(request, response):
    params = request.get("params") or [None]
    return (request["method"] == "debug_getRawBlock" and isinstance(params[0], str) and params[0].startswith("0x")
            and int(params[0], 16) > 0 and isinstance(response.get("result"), str) and cc.size(response) >= 512)


def test_a_client_that_asks_for_ssz_of_a_result_the_cache_holds_goes_to_the_node(proxies, stack):
    # the cache holds JSON; the SSZ of a result with a transcoding schema comes from the node's answer
    proxy = proxies()
    raw = cc.find(raw_block_by_number)
    post(proxy.port, raw, id_=1)
    wait_for_hit(proxy.port, raw, time.monotonic())
    before = stack.node_requests()
    ssz_client = wire.request(proxy.port, raw.path, "POST",
                              {"Content-Type": "application/json", "Accept": "application/octet-stream"}, raw.body(2))
    assert (ssz_client.status, status(ssz_client)) == (200, "BYPASS")
    assert stack.node_requests() == before + 1
    json_client = post(proxy.port, raw, id_=3)
    assert status(json_client) == "HIT"


def test_requests_that_are_not_json_rpc_calls_pass_through(proxies, stack):
    proxy = proxies()
    response = wire.request(proxy.port, "/healthz", "GET")
    assert (response.status, status(response)) == (200, "BYPASS")
    malformed = wire.request(proxy.port, "/mainnet", "POST", body=b'{"jsonrpc":"2.0","method":')
    assert status(malformed) == "BYPASS" and malformed.status in (200, 400)


def big_block(request, response):
    """A block by hash whose answer the daemon keeps plain beside its stream (64 KiB and more)."""
    return request["method"] == "eth_getBlockByHash" and isinstance(response.get("result"), dict) \
        and cc.size(response) >= 64 * 1024


def test_a_big_answer_hits_in_either_coding_from_the_daemon_and_from_the_hot_tier(proxies, stack):
    try:
        big = cc.find(big_block)
    except LookupError:
        pytest.skip("no block of 64 KiB or more in this corpus")
    proxy = proxies()
    assert status(post(proxy.port, big)) == "MISS"
    wait_for_hit(proxy.port, big, time.monotonic())
    ports = [proxy.port]
    if not proxy.host.startswith("openresty"):
        hot = proxies(hot=True)
        ports += [hot.port, hot.port]
    # the daemon's hits, then the hot tier's: the first of each coding fills it
    for port in ports:
        for coding in ("gzip", None):
            hit = post(port, big, id_=5, accept_encoding=coding)
            assert (hit.status, status(hit), hit.header("content-encoding")) == (200, "HIT", coding)
            assert int(hit.header("content-length")) == len(hit.body), "an exact Content-Length"
            assert hit.decoded() == big.answer(5)


def test_the_cache_off_adds_nothing(proxies, stack):
    proxy = proxies(cache=False)
    response = post(proxy.port, case("block_by_hash"))
    assert response.status == 200 and status(response) is None


def answered_in(response):
    """Seconds from sending to the last byte of the response's body."""
    total = response.head_length + len(response.raw)
    return next(seconds for seconds, received in response.arrivals if received >= total)


def wait_until_stopped(pid, timeout=10):
    """SIGSTOP stops each thread as it next leaves the kernel: until then one may still answer."""
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")
    while not all((task / "stat").read_text().rpartition(")")[2].split()[0] == "T" for task in tasks.iterdir()):
        assert time.monotonic() < deadline, f"{pid} did not stop"
        time.sleep(0.01)


@pytest.mark.parametrize("failure", ["killed", "stopped"])
def test_a_dead_or_stopped_daemon_costs_at_most_the_timeout(proxies, stack, failure):
    proxy = proxies(timeout_ms=100)
    block = case("block_by_hash")
    pid = stack.daemon.process.proc.pid
    if failure == "killed":
        stack.daemon.process.stop()
    else:
        os.kill(pid, signal.SIGSTOP)
        wait_until_stopped(pid)
    try:
        for id_ in range(3):
            response = post(proxy.port, block, id_=id_)
            assert (response.status, status(response)) == (200, "ERROR")
            assert response.decoded() == block.answer(id_)
            # the node answers in microseconds: all of the wait is the lookup's
            assert answered_in(response) < 1.0
        # and nothing of the failed lookup holds a kept-alive connection afterwards
        import http.client
        connection = http.client.HTTPConnection(LOOPBACK, proxy.port, timeout=30)
        try:
            for id_ in range(3):
                started = time.monotonic()
                connection.request("POST", block.path, block.body(id_), {"Content-Type": "application/json"})
                answer = connection.getresponse()
                assert (answer.status, answer.headers["X-Rpcedge-Cache"]) == (200, "ERROR")
                assert answer.read() == block.answer(id_)
                assert time.monotonic() - started < 1.0, f"request {id_} on one connection"
        finally:
            connection.close()
    finally:
        if failure == "stopped":
            os.kill(pid, signal.SIGCONT)
        else:
            stack.start_daemon(port=stack.daemon.port)


def test_the_hot_tier_answers_a_hit_again_while_the_daemon_is_stopped(proxies, stack):
    if proxies.host.startswith("openresty"):
        pytest.skip("the Lua binding keeps no hot tier")
    proxy = proxies(timeout_ms=1000, hot=True)
    block, receipt = case("block_by_hash"), case("receipt")
    assert status(post(proxy.port, block, id_=1)) == "MISS"
    wait_for_hit(proxy.port, block, time.monotonic())
    # the daemon's hit is now in the hot tier (with the Wasm filter, in each worker that asked: ask
    # enough times, on as many connections, that both of its two workers have)
    for id_ in range(32):
        assert status(post(proxy.port, block, id_=id_)) == "HIT"
    pid = stack.daemon.process.proc.pid
    os.kill(pid, signal.SIGSTOP)
    wait_until_stopped(pid)
    try:
        asked = stack.node_requests()
        for id_ in range(4):
            hit = post(proxy.port, block, id_=f"hot-{id_}")
            assert (hit.status, status(hit)) == (200, "HIT")
            assert gzip.decompress(hit.body) == block.answer(f"hot-{id_}")
            assert int(hit.header("content-length")) == len(hit.body)
            # no lookup waits for the stopped daemon (its timeout is 1 s)
            assert answered_in(hit) < 0.5
        plain = post(proxy.port, block, id_=5, accept_encoding=None)
        assert (status(plain), plain.body) == ("HIT", block.answer(5))
        assert stack.node_requests() == asked, "hot hits never reach the node"
        # a key the hot tier does not hold still asks the daemon, and fails open
        other = post(proxy.port, receipt, id_=9)
        assert (other.status, status(other), other.decoded()) == (200, "ERROR", receipt.answer(9))
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("directive, message", [
    ("rpcedge_cache_timeout 0;", "\"rpcedge_cache_timeout\" directive must be between 1 and 60000"),
    # sharding is retired (README, "Moving from shards")
    ("rpcedge_cache_shards 2;", "unknown directive \"rpcedge_cache_shards\""),
    ("rpcedge_cache_pass _rpcedge_cache;", "must be the URI of an internal location"),
    ("rpcedge_cache_hot 16m;", "must be name:size"),
    ("rpcedge_cache_hot hot:64k;", "rpcedge_cache_hot zone \"hot\" is too small"),
    ("rpcedge_cache_hot hot:lots;", "is too small or not a size"),
    # the client's Host would choose where answers are kept
    ("rpcedge_cache_namespace $host;", "takes a plain string, not variables"),
    ("rpcedge_cache_namespace \"\";", "must not be empty"),
])
def test_nginx_refuses_a_bad_cache_directive(tmp_path, directive, message):
    from testbed.nginx_harness import check_conf, main_conf
    conf = tmp_path / "nginx.conf"
    conf.write_text(main_conf(tmp_path, f"server {{ listen {LOOPBACK}:{free_port()}; {directive} }}"))
    code, output = check_conf(conf, tmp_path)
    assert code != 0 and message in output, output


def test_hits_decode_in_curl_python_and_go(proxies, stack, tmp_path):
    """The usual consumers of RPC endpoints: curl --compressed (which takes zstd and br where
    built with them, as Debian's is: it gets zstd), Python's gzip, Go's net/http (gzip)."""
    import subprocess
    proxy = proxies()
    block = case("block_by_hash")
    post(proxy.port, block)
    wait_for_hit(proxy.port, block, time.monotonic())
    url = f"http://{LOOPBACK}:{proxy.port}{block.path}"

    python = post(proxy.port, block, id_=11)
    assert (status(python), python.header("content-encoding")) == ("HIT", "gzip")
    assert gzip.decompress(python.body) == block.answer(11)

    curl = subprocess.run(["curl", "-sS", "--compressed", "-D", tmp_path / "curl-headers", "-H",
                           "Content-Type: application/json", "--data-binary", "@-", url],
                          input=block.body(12), capture_output=True, timeout=30, check=True)
    headers = (tmp_path / "curl-headers").read_text().lower()
    features = subprocess.run(["curl", "-V"], capture_output=True, text=True, check=True).stdout.lower()
    coding = "zstd" if " zstd" in features else "gzip"
    assert "x-rpcedge-cache: hit" in headers and f"content-encoding: {coding}" in headers
    assert curl.stdout == block.answer(12)

    go = subprocess.run(["go", "run", REPO / "tests" / "clients" / "gzip_client.go", url],
                        input=block.body(13), capture_output=True, timeout=300,
                        env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "off"})
    assert go.returncode == 0, go.stderr
    assert b"decoded=true cache=HIT" in go.stderr, go.stderr
    assert go.stdout == block.answer(13)
