"""End-to-end tests of the replay upstream (loadtest/replay) against the real corpus."""

import hashlib
import json
import math
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import pytest

from testbed import replay_corpus as rc
from testbed import wire
from testbed.harness import start_replay

# A few pairs of known shape, for the delivery tests.
SMALL = "eth_blockNumber/execution-apis__hive-testchain__simple-test.io"  # {"jsonrpc":"2.0","id":1,"result":"0x36"}
MEDIUM = "erigon_getBlockReceiptsByBlockHash/erigon-rpc-tests__mainnet__test_05.json"  # 248 KiB


def digest(data):
    return hashlib.sha256(data).hexdigest()


def live_ids_for(key, request):
    """Fresh ids for a request, chosen by its key (so requests with the same key get the same ones):
    integers, strings (non-ASCII too) and null, different from anything recorded."""
    seed = int(digest(key.encode())[:8], 16)
    ids = []
    for position in range(len(rc.calls(request))):
        kind = (seed + position) % 4
        ids.append([10**9 + seed + position, 10**9 + seed, f"live-{seed}-{position}-ü", None][kind])
    return ids


@dataclass
class PairCase:
    path: str
    index: int
    network: str
    placeholder: bool
    key: str
    request: bytes  # the recorded request, compact, with fresh ids
    expected: str  # digest of the answer to `request`
    expected_len: int
    recorded: str  # digest of the recorded response, compact
    recorded_len: int

    @property
    def origin(self):
        return f"{self.path}#{self.index}"


def pair_cases(corpus, path, flags):
    """The cases of one recording file (run in a worker process: the big files take seconds)."""
    cases = []
    for index, (request, response) in enumerate(rc.read_pairs(corpus / path)):
        key = rc.request_key(request)
        ids = live_ids_for(key, request)
        sent = rc.with_ids(request, ids)
        expected = rc.compact(rc.expected_answer(request, response, rc.live_ids_of(sent)))
        recorded = rc.compact(response)
        placeholder = index < len(flags) and flags[index]
        cases.append(PairCase(path, index, rc.network_of(path), placeholder, key, rc.compact(sent),
                              digest(expected), len(expected), digest(recorded), len(recorded)))
    return cases


def estimated_cost(path):
    """Relative work of reading a file: bzip2 tars inflate about sixty-fold."""
    return path.stat().st_size * (60 if path.suffix == ".tar" else 1)


def exchange(connection, method, path, body=None):
    connection.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    response = connection.getresponse()
    return response.status, response.getheader("x-replay-recording"), response.read()


def describe_difference(corpus, case, body, which):
    """Where a served body departs from the expectation (recomputed for this one pair)."""
    request, response = rc.read_pairs(corpus / case.path)[case.index]
    if which == "recorded":
        expected = rc.compact(response)
    else:
        expected = rc.compact(rc.expected_answer(request, response, rc.live_ids_of(json.loads(case.request))))
    at = next((i for i, (a, b) in enumerate(zip(body, expected)) if a != b), min(len(body), len(expected)))
    same_json = json.loads(body) == json.loads(expected) if body else False
    return (f"{case.origin} ({which}): {len(body)} bytes, expected {len(expected)}; first difference at {at}: "
            f"got {body[max(0, at - 40):at + 40]!r}, expected {expected[max(0, at - 40):at + 40]!r}"
            f"{' (same JSON when parsed: number text?)' if same_json else ''}")


def test_every_recorded_pair_is_replayed(replay):
    """Every non-placeholder pair, sent with fresh ids to /<network>, gets its recorded answer
    (or, for a key an earlier file of the network recorded too, that earlier answer), and every
    pair's recorded body is served verbatim under /corpus/."""
    index = rc.index_rows(replay.corpus)
    files = rc.corpus_files(replay.corpus)
    first_in_network = {}  # (network, key) -> case answering it
    first_anywhere = {}  # key -> case answering it on /
    failures = []
    counts = dict(files=len(files), pairs=0, placeholders=0, shadowed=0, bytes=0)
    connection = replay.connection()
    with ProcessPoolExecutor(max_workers=2) as workers:
        # Biggest files first so that the workers finish together; checked in path order below
        # (first recording wins), which the small results make cheap to hold.
        pending = {}
        for path in sorted(files, key=lambda p: estimated_cost(replay.corpus / p), reverse=True):
            flags = [p["placeholder_response"] for p in index.get(path, {}).get("pairs", [])]
            pending[path] = workers.submit(pair_cases, replay.corpus, path, flags)
        for path in files:
            for case in pending.pop(path).result():
                status, origin, body = exchange(connection, "GET", f"/corpus/{case.path}?pair={case.index}")
                counts["bytes"] += len(body)
                if status != 200 or digest(body) != case.recorded:
                    failures.append(describe_difference(replay.corpus, case, body, "recorded") if status == 200 else
                                    f"GET /corpus/{case.origin}: status {status}")
                if case.placeholder:
                    counts["placeholders"] += 1
                    continue
                counts["pairs"] += 1
                answering = first_in_network.setdefault((case.network, case.key), case)
                first_anywhere.setdefault(case.key, case)
                counts["shadowed"] += answering is not case
                status, origin, body = exchange(connection, "POST", f"/{case.network}", case.request)
                counts["bytes"] += len(body)
                if status != 200 or origin != answering.origin:
                    failures.append(f"POST {case.origin}: status {status}, answered from {origin}, expected {answering.origin}")
                elif digest(body) != answering.expected:
                    failures.append(describe_difference(replay.corpus, case, body, "answer"))

    # On /, a key recorded by several networks gets the first recording in path order.
    networks_per_key = {}
    for network, key in first_in_network:
        networks_per_key.setdefault(key, set()).add(network)
    shared = [first_anywhere[key] for key, networks in networks_per_key.items() if len(networks) > 1]
    for case in shared:
        status, origin, body = exchange(connection, "POST", "/", case.request)
        if status != 200 or origin != case.origin or digest(body) != case.expected:
            failures.append(f"POST / {case.origin}: status {status}, answered from {origin}")
    connection.close()

    print(f"\nreplayed {counts['pairs']} pairs ({counts['shadowed']} answered by an earlier recording of the same key), "
          f"skipped {counts['placeholders']} placeholders, {len(shared)} keys checked on /, "
          f"{counts['bytes'] / 2**20:.0f} MiB received, from {counts['files']} files")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])
    assert counts["pairs"] > 0


# --- delivery ---------------------------------------------------------------------------------


def raw_exchange(replay, method, path, headers=(), body=b"", timeout=20):
    """One request on a fresh socket, read to the end of the connection (`wire.request`);
    `headers` are "Name: value" lines, repeats allowed."""
    by_name = {}
    for line in headers:
        name, _, value = line.partition(": ")
        by_name.setdefault(name, []).append(value)
    return wire.request(replay.port, path, method=method, headers=by_name, body=body,
                        accept_encoding=None, timeout=timeout)


def recorded_body(replay, path, index=0):
    return rc.compact(rc.read_pairs(replay.corpus / path)[index][1])


def test_chunked_mode_reassembles_to_the_same_bytes(replay):
    expected = recorded_body(replay, MEDIUM)
    length_mode = raw_exchange(replay, "GET", f"/corpus/{MEDIUM}")
    assert length_mode.header("content-length") == str(len(expected))
    assert length_mode.body == expected

    chunked = raw_exchange(replay, "GET", f"/corpus/{MEDIUM}", ["X-Replay-Mode: chunked"])
    assert chunked.header("transfer-encoding") == "chunked"
    assert chunked.header("content-length") is None
    assert chunked.complete and chunked.body == expected
    assert set(chunked.chunk_sizes[:-1]) == {16384}, "default frames are 16 KiB"

    request = rc.compact({"jsonrpc": "2.0", "id": "c", "method": "eth_blockNumber"})
    small = raw_exchange(replay, "POST", "/hive-testchain", ["X-Replay-Mode: chunked", "X-Replay-Chunk-Size: 7"], request)
    assert small.complete and small.body == b'{"jsonrpc":"2.0","id":"c","result":"0x36"}'
    assert small.chunk_sizes == [7] * 6


def test_trickled_chunks_arrive_spaced_by_the_delay(replay):
    body = recorded_body(replay, SMALL)
    chunk = math.ceil(len(body) / 4)
    response = raw_exchange(replay, "GET", f"/corpus/{SMALL}", [
        "X-Replay-Mode: chunked", f"X-Replay-Chunk-Size: {chunk}", "X-Replay-Chunk-Delay-Ms: 300", "X-Replay-Flush: 1"])
    assert response.complete and response.body == body
    assert len(response.chunk_sizes) == 4
    assert response.header("x-accel-buffering") == "no"
    # Reads separated by a pause: the first holds the head and chunk 1, then one per chunk.
    bursts = [response.arrivals[0][0]]
    for at, _ in response.arrivals[1:]:
        if at - bursts[-1] > 0.1:
            bursts.append(at)
    gaps = [later - earlier for earlier, later in zip(bursts, bursts[1:])]
    assert len(bursts) == 4, f"arrivals {response.arrivals}"
    assert all(gap >= 0.2 for gap in gaps), f"gaps {gaps}"
    assert bursts[0] < 0.2, "the first chunk must not wait for the delay"


def test_unknown_method_gets_a_prompt_json_rpc_error_with_its_id(replay):
    started = time.monotonic()
    status, headers, body = replay.request(
        "POST", "/mainnet", rc.compact({"jsonrpc": "2.0", "id": "q-1", "method": "eth_noSuchMethod", "params": [1]}))
    assert time.monotonic() - started < 2
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"jsonrpc": "2.0", "id": "q-1", "error": {
        "code": -32601, "message": "rpcedge-replay: no recording for eth_noSuchMethod"}}

    status, _, body = replay.request("POST", "/", b'[{"jsonrpc":"2.0","id":5,"method":"nope"},7]')
    answers = json.loads(body)
    assert status == 200 and [a["id"] for a in answers] == [5, None]
    assert [a["error"]["code"] for a in answers] == [-32601, -32600]


@pytest.mark.parametrize("body", [b'{"jsonrpc":"2.0","id":1,', b"", b"\xff\xfe{}", b'{"a":1} x'])
def test_malformed_body_gets_a_parse_error(replay, body):
    status, _, answer = replay.request("POST", "/", body)
    answer = json.loads(answer)
    assert status == 200
    assert answer["id"] is None and answer["error"]["code"] == -32700


def test_routes_and_refusals(replay):
    assert replay.request("GET", "/healthz")[::2] == (200, b"ok")
    assert replay.request("POST", "/no-such-network", b"{}")[0] == 404
    assert replay.request("GET", "/")[0] == 405
    assert replay.request("GET", f"/corpus/{SMALL}?pair=9")[0] == 404
    assert replay.request("GET", "/corpus/no/such/file.json")[0] == 404
    assert replay.request("GET", f"/corpus/{SMALL}", headers={"X-Replay-Mode": "sideways"})[0] == 400


def test_status_and_extra_headers(replay):
    no_content = raw_exchange(replay, "GET", f"/corpus/{SMALL}", ["X-Replay-Status: 204"])
    assert no_content.status == 204 and no_content.body == b"" and no_content.complete

    status, headers, body = replay.request("GET", f"/corpus/{SMALL}", headers={"X-Replay-Status": "404"})
    assert status == 404 and body == recorded_body(replay, SMALL)

    extra = raw_exchange(replay, "GET", f"/corpus/{SMALL}", [
        "X-Replay-Header: Content-Encoding: gzip", "X-Replay-Header: ETag: \"abc\"",
        "X-Replay-Header: Content-Type: text/plain", "X-Replay-Header: Cache-Control: no-transform",
        "X-Replay-Header: Content-Range: bytes 0-9/100", "X-Replay-Status: 206"])
    assert extra.status == 206
    assert extra.header("content-encoding") == "gzip" and extra.header("etag") == '"abc"'
    assert extra.header_count("content-type") == 1, "replaces the replay's own Content-Type"
    assert extra.header("content-type") == "text/plain"
    assert extra.header("cache-control") == "no-transform"
    assert extra.header("content-range") == "bytes 0-9/100"
    assert extra.body == recorded_body(replay, SMALL)


def test_head_announces_the_get_length(replay):
    get = raw_exchange(replay, "GET", f"/corpus/{MEDIUM}")
    head = raw_exchange(replay, "HEAD", f"/corpus/{MEDIUM}")
    assert head.status == 200 and head.body == b""
    assert head.header("content-length") == get.header("content-length") == str(len(get.body))


@pytest.mark.parametrize("mode", ["length", "chunked"])
def test_reset_after_truncates_the_body(replay, mode):
    expected = recorded_body(replay, MEDIUM)
    response = raw_exchange(replay, "GET", f"/corpus/{MEDIUM}", [f"X-Replay-Mode: {mode}", "X-Replay-Reset-After: 1000"])
    assert not response.complete
    assert response.body == expected[:len(response.body)] and len(response.body) <= 1000
    if mode == "length":
        assert response.header("content-length") == str(len(expected)), "announces the full length"


def test_gzip_when_asked_answers_as_geth_does(tmp_path):
    """`--gzip-when-asked`: a request that accepts gzip gets its answer gzipped and chunked, as
    from geth; one that does not gets it as ever; /stats counts the gzipped ones."""
    node = start_replay(tmp_path, args=["--gzip-when-asked"])
    try:
        request = rc.compact({"jsonrpc": "2.0", "id": 3, "method": "eth_blockNumber", "params": []})
        plain = wire.request(node.port, "/hive-testchain", "POST", {"Content-Type": "application/json"}, request,
                             accept_encoding=None)
        gzipped = wire.request(node.port, "/hive-testchain", "POST", {"Content-Type": "application/json"}, request,
                               accept_encoding="gzip, deflate")
        assert plain.header("content-encoding") is None and plain.header("content-length") is not None
        assert gzipped.header("content-encoding") == "gzip" and gzipped.chunked
        assert gzipped.header("content-length") is None and gzipped.decoded() == plain.body
        assert json.loads(node.request("GET", "/stats")[2])["gzip_answers"] == 1
    finally:
        node.process.stop()


def test_sigterm_stops_it_cleanly(tmp_path):
    """A container's first process has no default action for SIGTERM: the replay handles it."""
    node = start_replay(tmp_path)
    node.process.proc.send_signal(signal.SIGTERM)
    assert node.process.proc.wait(timeout=10) == 0
