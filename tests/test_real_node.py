"""rpcedge in front of a real node: geth (`--dev`, a block a second, pinned in the Makefile) with
traffic of its own (value transfers, a contract that emits logs), through every host (nginx,
Envoy's Wasm filter and native module, OpenResty's two forms) with the cache daemon, whose
finality is geth's own `finalized` block. geth gzips whenever a request accepts gzip, and checks
the Host header: these configs carry no `proxy_set_header Accept-Encoding` (rpcedge asks for
identity itself) and send the Host the examples send.

Every answer is checked against geth asked directly: final blocks, receipts and logs MISS, then
HIT with geth's answer, in gzip and identity alike; nothing above geth's `finalized` and no tag
is ever a hit, and a block rewound and mined again (`debug_setHead`) is geth's new one; batches
are answered call by call as geth answers them."""

import base64
import gzip
import hashlib
import json
import os
import socket
import subprocess
import time
import types

import pytest
from Crypto.Hash import keccak

from testbed import cache_cases as cc
from testbed import wire
from testbed.envoy_harness import ENVOY_HOSTS
from testbed.geth_node import LOG_TOPIC, Geth
from testbed.harness import LOOPBACK, REPO, start_cached
from test_transcode import read_container

HOSTS = ["nginx", *ENVOY_HOSTS, "openresty", "openresty-proxied"]
# the examples' route for geth's chain, and so the cache's namespace
PATH = "/mainnet"
MIN_LENGTH = 1024
# the JS clients' script and packages (`make test` installs them)
CLIENTS = REPO / "tests" / "clients"


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """geth, with transactions and logs in blocks that geth has finalized."""
    geth = Geth(tmp_path_factory.mktemp("geth"), prefix=PATH)
    try:
        receipts = geth.traffic(transfers=4, logs=4)
        blocks = sorted({int(r["blockNumber"], 16) for r in receipts})
        geth.wait_final(blocks[-1])
        yield types.SimpleNamespace(geth=geth, receipts=receipts, blocks=blocks)
    finally:
        geth.stop()


@pytest.fixture(params=HOSTS)
def proxy(request, tmp_path, chain):
    """A proxy of the test's host before geth, with a daemon of its own that takes geth's
    finality."""
    daemon = start_cached(tmp_path, tmp_path / "db",
                          args=["--finality-upstream", f"mainnet={chain.geth.url}", *cc.QUICK_FINALITY])
    in_front = types.SimpleNamespace(replay=types.SimpleNamespace(port=chain.geth.port), daemon=daemon)
    options = {"transcode": True} if request.param.startswith("openresty") else {"hot": True, "transcode": True}
    proxy = cc.start_proxy(request.param, tmp_path / request.param, in_front, **options)
    yield proxy
    proxy.stop()
    daemon.process.stop()


def body(method, params, id_=1):
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()


def ask(proxy, method, params, id_=1, accept_encoding="gzip"):
    return wire.request(proxy.port, PATH, "POST", {"Content-Type": "application/json"}, body(method, params, id_),
                        accept_encoding=accept_encoding)


def status(response):
    return response.header("x-rpcedge-cache")


def direct(geth, method, params, id_=1):
    """geth's own answer, asked without Accept-Encoding."""
    return json.loads(geth.raw(body(method, params, id_))[2])


def whole(proxy, response, accept_encoding):
    """The answer as sent: 200, its exact length where it has one, gzip for a gzip client where
    it is worth it; its JSON."""
    assert response.status == 200, response.body[:300]
    if response.header("content-length") is not None:
        assert int(response.header("content-length")) == len(response.body)
    decoded = response.decoded()
    if accept_encoding == "gzip" and len(decoded) >= MIN_LENGTH:
        assert response.header("content-encoding") == "gzip"
    elif accept_encoding is None:
        assert response.header("content-encoding") is None
    return json.loads(decoded)


def final_calls(chain):
    receipt = next(r for r in chain.receipts if r["logs"])
    block = direct(chain.geth, "eth_getBlockByNumber", [receipt["blockNumber"], True])["result"]
    first, last = chain.blocks[0], chain.blocks[-1]
    return [
        ("eth_getBlockByNumber", [receipt["blockNumber"], True]),
        ("eth_getBlockByHash", [block["hash"], False]),
        ("eth_getTransactionReceipt", [receipt["transactionHash"]]),
        ("eth_getBlockReceipts", [receipt["blockNumber"]]),
        ("eth_getLogs", [{"fromBlock": hex(first), "toBlock": hex(last), "topics": [LOG_TOPIC]}]),
    ]


def test_the_node_is_asked_for_identity_though_it_compresses_when_asked(chain):
    """What the rest relies on: geth gzips for a client that accepts it."""
    _, headers, _ = chain.geth.raw(body("eth_getBlockByNumber", [hex(chain.blocks[-1]), True]),
                                   {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip"


def test_final_blocks_receipts_and_logs_miss_then_hit_with_geths_answer(proxy, chain):
    for method, params in final_calls(chain):
        expected = direct(chain.geth, method, params, id_=7)
        assert expected.get("result") not in (None, []), (method, expected)
        first = ask(proxy, method, params, id_=7)
        assert status(first) == "MISS", (method, status(first))
        assert whole(proxy, first, "gzip") == expected, method
        deadline = time.monotonic() + 3
        while True:
            hit = ask(proxy, method, params, id_=8)
            if status(hit) == "HIT":
                break
            assert time.monotonic() < deadline, f"{method}: never stored ({status(hit)})"
            time.sleep(0.05)
        assert whole(proxy, hit, "gzip") == {**expected, "id": 8}, method
        plain = ask(proxy, method, params, id_=9, accept_encoding=None)
        assert status(plain) == "HIT" and whole(proxy, plain, None) == {**expected, "id": 9}, method


def test_nothing_above_finalized_and_no_tag_is_ever_a_hit_and_a_rewound_block_is_the_new_one(proxy, chain):
    geth = chain.geth
    finalized = geth.number("finalized")
    head = geth.wait(lambda: (n := geth.number("latest")) > finalized + 2 and n, "blocks above finalized")
    recent = hex(head)
    for _ in range(3):
        for params in ([recent, False], ["latest", False], ["finalized", False]):
            response = ask(proxy, "eth_getBlockByNumber", params)
            assert status(response) != "HIT", params
            answer = whole(proxy, response, "gzip")
            if params[0] == recent:
                assert answer == direct(geth, "eth_getBlockByNumber", params)
    before = direct(geth, "eth_getBlockByNumber", [recent, False])["result"]["hash"]
    # rewind past it (never below finalized) and let geth mine it again, with a later timestamp
    geth.call("debug_setHead", hex(head - 2))
    geth.wait(lambda: geth.number("latest") >= head
              and direct(geth, "eth_getBlockByNumber", [recent, False])["result"]["hash"] != before,
              "the rewound block mined again")
    again = ask(proxy, "eth_getBlockByNumber", [recent, False])
    assert status(again) != "HIT"
    answer = whole(proxy, again, "gzip")
    assert answer == direct(geth, "eth_getBlockByNumber", [recent, False]) and answer["result"]["hash"] != before


def test_a_batch_is_answered_call_by_call_as_geth_answers(proxy, chain):
    calls = final_calls(chain) + [("eth_blockNumber", []), ("eth_chainId", []),
                                  ("eth_getBalance", [chain.geth.account, hex(chain.blocks[-1])])]
    batch = [{"jsonrpc": "2.0", "id": n, "method": m, "params": p} for n, (m, p) in enumerate(calls)]
    expected = {n: direct(chain.geth, m, p, id_=n) for n, (m, p) in enumerate(calls)}
    # twice: the second time final calls come from the cache, the rest from geth
    for accept_encoding in ("gzip", None):
        response = wire.request(proxy.port, PATH, "POST", {"Content-Type": "application/json"},
                                json.dumps(batch).encode(), accept_encoding=accept_encoding)
        answers = whole(proxy, response, accept_encoding)
        assert [a["id"] for a in answers] == list(range(len(calls)))
        for answer in answers:
            n = answer["id"]
            if calls[n][0] == "eth_blockNumber":
                assert int(answer["result"], 16) >= int(expected[n]["result"], 16)
            else:
                assert answer == expected[n], calls[n]


def test_ethers_and_viem_batches_get_geths_results(proxy, chain):
    """ethers v6 (default batching) and viem (`batch: true`), as npm ships them: the same calls at
    once, in one batch each, every result equal to geth's."""
    receipt = next(r for r in chain.receipts if r["logs"])
    final = hex(chain.blocks[-1])
    url = f"http://127.0.0.1:{proxy.port}{PATH}"
    args = [url, str(chain.blocks[-1]), receipt["transactionHash"], chain.geth.account, LOG_TOPIC]
    expected = {
        "block": direct(chain.geth, "eth_getBlockByNumber", [final, True])["result"],
        "receipt": direct(chain.geth, "eth_getTransactionReceipt", [receipt["transactionHash"]])["result"],
        "logs": direct(chain.geth, "eth_getLogs", [{"fromBlock": "0x1", "toBlock": final,
                                                     "topics": [LOG_TOPIC]}])["result"],
        "balance": direct(chain.geth, "eth_getBalance", [chain.geth.account, final])["result"],
    }
    # twice: misses from geth, then hits from the cache
    for _ in range(2):
        run = subprocess.run(["node", CLIENTS / "batch_clients.mjs", *args], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        results = [json.loads(line) for line in run.stdout.splitlines()]
        assert [r["client"] for r in results] == ["ethers", "viem"]
        for result in results:
            for name, value in expected.items():
                assert result[name] == value, (result["client"], name)


def test_a_call_tracer_trace_is_geths_in_gzip_and_identity(proxy, chain):
    """debug_traceBlockByNumber with the callTracer over a block with transfers and log calls:
    decoded equal to geth's (a dev chain's blocks are small: the traces over max_buffer that
    stream are the concurrency test's, from the corpus)."""
    receipt = next(r for r in chain.receipts if r["logs"])
    params = [receipt["blockNumber"], {"tracer": "callTracer"}]
    expected = direct(chain.geth, "debug_traceBlockByNumber", params)
    assert expected.get("result"), expected
    for accept_encoding in ("gzip", None):
        response = ask(proxy, "debug_traceBlockByNumber", params, accept_encoding=accept_encoding)
        assert whole(proxy, response, accept_encoding) == expected


def websocket(port, path):
    """A WebSocket client's connection (RFC 6455, by hand: one text frame out, frames in)."""
    sock = socket.create_connection((LOOPBACK, port), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        assert data, f"closed during the handshake: {head!r}"
        head += data
    assert head.startswith(b"HTTP/1.1 101"), head
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert accept in head, head
    return sock


def ws_send(sock, message):
    payload, mask = json.dumps(message).encode(), os.urandom(4)
    length = len(payload)
    head = bytes([0x81]) + (bytes([0x80 | length]) if length < 126 else bytes([0x80 | 126]) + length.to_bytes(2, "big"))
    sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def ws_receive(sock):
    def exactly(n):
        data = b""
        while len(data) < n:
            more = sock.recv(n - len(data))
            assert more, "closed"
            data += more
        return data
    first, second = exactly(2)
    length = second & 0x7F
    if length == 126:
        length = int.from_bytes(exactly(2), "big")
    elif length == 127:
        length = int.from_bytes(exactly(8), "big")
    assert first & 0x0F == 1 and not second & 0x80, (first, second)
    return json.loads(exactly(length))


def test_a_websocket_subscription_passes_through_untouched(proxy, chain):
    """eth_subscribe newHeads over a WebSocket through the proxy, rpcedge on: the heads geth sends
    are geth's blocks."""
    if proxy.host == "openresty":
        pytest.skip("OpenResty's subrequest form cannot upgrade: its proxy_pass form carries WebSockets")
    sock = websocket(proxy.port, PATH)
    try:
        ws_send(sock, {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]})
        subscribed = ws_receive(sock)
        assert subscribed["id"] == 1 and subscribed["result"].startswith("0x"), subscribed
        for _ in range(2):
            head = ws_receive(sock)["params"]["result"]
            block = direct(chain.geth, "eth_getBlockByNumber", [head["number"], False])["result"]
            assert head["hash"] == block["hash"]
    finally:
        sock.close()


def h2c_post(port, path, body, accept_encoding):
    """One POST over HTTP/2 without TLS (prior knowledge): the response's headers and body."""
    import h2.config
    import h2.connection
    import h2.events

    with socket.create_connection((LOOPBACK, port), timeout=30) as sock:
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        headers = [(":method", "POST"), (":scheme", "http"), (":authority", f"{LOOPBACK}:{port}"), (":path", path),
                   ("content-type", "application/json"), ("content-length", str(len(body)))]
        if accept_encoding:
            headers.append(("accept-encoding", accept_encoding))
        connection.send_headers(1, headers)
        connection.send_data(1, body, end_stream=True)
        sock.sendall(connection.data_to_send())
        response, data = {}, b""
        while True:
            chunk = sock.recv(65536)
            assert chunk, "closed before the stream ended"
            for event in connection.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    response = {name.decode(): value.decode() for name, value in event.headers}
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    return response, data
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"stream reset: {event.error_code}")
            sock.sendall(connection.data_to_send())


@pytest.mark.parametrize("host", ["nginx", *ENVOY_HOSTS])
def test_an_http2_client_gets_geths_answers(host, tmp_path, chain):
    """HTTP/2 clients (prior knowledge, h2c) through nginx (`listen ... http2`, as the example's
    18443) and Envoy (its codec AUTO): a final block MISS then HIT, gzip with its exact length."""
    daemon = start_cached(tmp_path, tmp_path / "db",
                          args=["--finality-upstream", f"mainnet={chain.geth.url}", *cc.QUICK_FINALITY])
    in_front = types.SimpleNamespace(replay=types.SimpleNamespace(port=chain.geth.port), daemon=daemon)
    h2_port = cc.free_port()
    options = {"extra": f"listen {LOOPBACK}:{h2_port} http2;"} if host == "nginx" else {}
    proxy = cc.start_proxy(host, tmp_path / host, in_front, **options)
    h2_port = h2_port if host == "nginx" else proxy.port
    try:
        params = [hex(chain.blocks[-1]), True]
        expected = direct(chain.geth, "eth_getBlockByNumber", params)
        statuses = []
        for accept_encoding in ("gzip", "gzip", None):
            headers, data = h2c_post(h2_port, PATH, body("eth_getBlockByNumber", params), accept_encoding)
            assert headers[":status"] == "200"
            statuses.append(headers.get("x-rpcedge-cache"))
            if "content-length" in headers:
                assert int(headers["content-length"]) == len(data)
            if headers.get("content-encoding") == "gzip":
                data = gzip.decompress(data)
            else:
                assert accept_encoding is None or len(data) < MIN_LENGTH
            assert json.loads(data) == expected
            time.sleep(0.3)
        assert statuses[0] == "MISS" and statuses[-1] == "HIT", statuses
    finally:
        proxy.stop()
        daemon.process.stop()


def test_a_witness_asked_as_ssz_carries_headers_that_hash_to_geths_blocks(proxy, chain):
    """debug_executionWitness of a block with transactions, asked as SSZ: geth's witness (its
    headers JSON objects) goes out as the SSZ container, each header the RLP whose keccak-256 is
    that block's hash as geth gives it, the rest byte for byte geth's."""
    if proxy.host == "openresty-proxied":
        pytest.skip("the proxy_pass form sends the head before the body: transcoding is the subrequest form's")
    receipt = next(r for r in chain.receipts if r["logs"])
    params = [receipt["blockNumber"]]
    witness = direct(chain.geth, "debug_executionWitness", params)["result"]
    response = wire.request(proxy.port, PATH, "POST",
                            {"Content-Type": "application/json", "Accept": "application/octet-stream"},
                            body("debug_executionWitness", params), accept_encoding=None)
    assert response.status == 200 and response.header("content-type") == "application/octet-stream"
    assert int(response.header("content-length")) == len(response.body)
    state, codes, headers, keys = read_container(response.body, 4)
    for name, items in [("state", state), ("codes", codes), ("keys", keys)]:
        assert items == [bytes.fromhex(h[2:]) for h in witness.get(name) or []], name
    assert headers and len(headers) == len(witness["headers"])
    for rlp, header in zip(headers, witness["headers"]):
        block = direct(chain.geth, "eth_getBlockByNumber", [header["number"], False])["result"]
        assert keccak.new(data=rlp, digest_bits=256).hexdigest() == block["hash"][2:]
