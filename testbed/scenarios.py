"""The load test's scenarios: lists of real recorded JSON-RPC requests from the corpus, each
checked against the running replay upstream, written for loadtest/wrk/replay.lua.

Every request is a recorded request, sent as recorded (compact, its own id) to POST /<network>,
and the replay answers it with a real recorded body. Pairs are taken only when the recording is
real (no placeholder, no error, no batch) and the replay's answer is a 200 with a non-empty result
(no `"result":null`, `[]` or `{}`).

Scenarios:
- `mix`: what a public RPC endpoint serves (MIX_PER_MILLE below);
- `small`: answers under 1 KiB, below every variant's gate but Envoy's compressor (30 bytes): what
  a proxy costs on the answers it leaves untouched;
- one per size bucket, about 1 KiB, 30 KiB, 300 KiB and 3 MiB (SIZE_BUCKETS below), any method.
"""

import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from testbed import replay_corpus as rc

KiB, MiB = 1024, 1024 * 1024

# Requests per thousand in the mix. A public endpoint is mostly wallets and dapps reading state
# (eth_call above all, balances, the head block number, nonces, gas), with some blocks, receipts
# and logs from indexers and explorers, and few traces, which public endpoints ration. Only the
# shape matters here: small answers dominate the request count, large ones the bytes.
MIX_PER_MILLE = {
    "eth_call": 300,
    "eth_getBalance": 120,
    "eth_blockNumber": 120,
    "eth_getTransactionCount": 50,
    "eth_chainId": 40,
    "eth_getCode": 30,
    "eth_estimateGas": 30,
    "eth_getStorageAt": 20,
    "eth_feeHistory": 20,
    "eth_getTransactionReceipt": 80,
    "eth_getTransactionByHash": 40,
    "eth_getLogs": 60,
    "eth_getBlockByNumber": 50,
    "eth_getBlockByHash": 20,
    "eth_getBlockReceipts": 10,
    "trace_transaction": 4,
    "debug_traceTransaction": 4,
    "trace_block": 2,
}
# The mix leaves out the heavy tail beyond this (whole-block traces of tens of MiB), which would
# make a few seconds of load a lottery; the 3 MiB scenario covers big bodies.
MIX_LARGEST = 2 * MiB

# Compact recorded response sizes per bucket, [smallest, largest). The 1 KiB bucket starts at the
# 1 KiB gate of rpcedge and of nginx's gzip_min_length, so that every variant compresses in it.
SIZE_BUCKETS = {
    "1KiB": (1 * KiB, 1536),
    "30KiB": (24 * KiB, 40 * KiB),
    "300KiB": (240 * KiB, 400 * KiB),
    "3MiB": (2 * MiB, 4608 * KiB),
    # last, so that the other buckets draw the same requests from the seeded generator as before
    "small": (1, 1 * KiB),
}
BUCKET_PAIRS = 40  # at most this many distinct requests per bucket, spread over the methods

SEED = 5  # the lists are the same on every run


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    connections: int


SCENARIOS = [
    Scenario("small", "answers under 1 KiB, untouched", 32),
    Scenario("mix", "method mix", 32),
    Scenario("1KiB", "~1 KiB bodies", 32),
    Scenario("30KiB", "~30 KiB bodies", 32),
    Scenario("300KiB", "~300 KiB bodies", 16),
    # A handful of connections: each holds MiBs in every proxy and in wrk.
    Scenario("3MiB", "~3 MiB bodies", 4),
]


@dataclass(frozen=True)
class Pair:
    path: str  # relative to the corpus
    index: int
    network: str
    method: str
    resp_bytes: int  # compact recorded response, from index.jsonl


@dataclass(frozen=True)
class Request:
    network: str
    recording: str  # the replay's X-Replay-Recording for it
    answer_bytes: int  # length of the replay's answer
    body: str  # compact JSON


def real_pairs(corpus):
    """Every pair of index.jsonl that has a real, single, non-error recorded response."""
    for path, row in rc.index_rows(corpus).items():
        for index, flags in enumerate(row["pairs"]):
            if not (flags["placeholder_response"] or flags["error"] or flags["batch"]):
                yield Pair(path, index, row["network"], row["method"], flags["resp_bytes"])


def recorded_requests(corpus, pairs):
    """The recorded request of each pair, compact; each file is read once."""
    by_file = defaultdict(list)
    for pair in pairs:
        by_file[pair.path].append(pair)
    requests = {}
    for path, wanted in by_file.items():
        recorded = rc.read_pairs(Path(corpus) / path)
        for pair in wanted:
            requests[pair] = rc.compact(recorded[pair.index][0]).decode()
    return requests


def replay_answer(replay, network, body):
    """(recording, answer length) when the replay answers `body` with a real, non-empty result;
    None otherwise."""
    connection = replay.connection()
    try:
        connection.request("POST", f"/{network}", body=body.encode(), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read()
        recording = response.getheader("X-Replay-Recording")
    finally:
        connection.close()
    if response.status != 200 or recording is None:
        return None
    result = json.loads(answer).get("result")
    if result is None or result in ([], {}):
        return None
    return recording, len(answer)


def checked_requests(replay, corpus, pairs):
    """Request per pair, for the pairs the replay answers with a real body; one pair per distinct
    (network, request) so that a recording always answers with the same length."""
    checked, seen = {}, set()
    for pair, body in recorded_requests(corpus, pairs).items():
        key = (pair.network, rc.request_key(json.loads(body)))
        if key in seen:
            continue
        seen.add(key)
        answer = replay_answer(replay, pair.network, body)
        if answer is not None:
            checked[pair] = Request(pair.network, answer[0], answer[1], body)
    return checked


def mix_requests(replay, corpus, pairs, rng):
    """A thousand requests in MIX_PER_MILLE proportions, each method cycling through its own
    pairs in a shuffled order, the whole list shuffled."""
    candidates = [p for p in pairs if p.method in MIX_PER_MILLE and p.resp_bytes <= MIX_LARGEST]
    checked = checked_requests(replay, corpus, candidates)
    requests = []
    for method, count in MIX_PER_MILLE.items():
        usable = sorted((p for p in checked if p.method == method), key=lambda p: (p.path, p.index))
        if not usable:
            raise RuntimeError(f"the corpus has no usable {method} pair for the mix")
        rng.shuffle(usable)
        requests += [checked[usable[i % len(usable)]] for i in range(count)]
    rng.shuffle(requests)
    return requests


def bucket_requests(replay, corpus, pairs, smallest, largest, rng):
    """Up to BUCKET_PAIRS distinct requests whose answers fall in [smallest, largest), taken from
    each method in turn so that no one method fills the bucket."""
    candidates = [p for p in pairs if smallest <= p.resp_bytes < largest]
    checked = [r for r in checked_requests(replay, corpus, candidates).values()
               if smallest <= r.answer_bytes < largest]
    by_method = defaultdict(list)
    for request in checked:
        by_method[json.loads(request.body)["method"]].append(request)
    queues = [by_method[m] for m in sorted(by_method)]
    for queue in queues:
        rng.shuffle(queue)
    requests = []
    while len(requests) < BUCKET_PAIRS and any(queues):
        for queue in queues:
            if queue and len(requests) < BUCKET_PAIRS:
                requests.append(queue.pop())
    rng.shuffle(requests)
    if not requests:
        raise RuntimeError(f"the corpus has no usable pair of {smallest}..{largest} bytes")
    return requests


def write_list(path, requests):
    path.write_text("".join(f"{r.network}\t{r.recording}\t{r.answer_bytes}\t{r.body}\n" for r in requests))


def write_lists(replay, corpus, directory):
    """Writes <scenario>.tsv per scenario into `directory`; returns {scenario name: (path,
    requests)}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    pairs = list(real_pairs(corpus))
    lists = {"mix": mix_requests(replay, corpus, pairs, rng)}
    for name, (smallest, largest) in SIZE_BUCKETS.items():
        lists[name] = bucket_requests(replay, corpus, pairs, smallest, largest, rng)
    written = {}
    for name, requests in lists.items():
        path = directory / f"{name}.tsv"
        write_list(path, requests)
        written[name] = (path, requests)
    return written
