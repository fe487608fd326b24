"""Many exchanges at once through every host (nginx, Envoy's Wasm filter and native module,
OpenResty's two forms), with the cache daemon and its hot tier: streamed traces over max_buffer,
herds of misses of one block (one holder, the rest coalesced), hits, batches, gzip and identity
clients, round after round. Every answer is checked against the node's recording: its status, its
decoded body, its exact length where it has one, gzip wherever a gzip client's answer is worth
compressing. A filter that dies under this (Envoy's Wasm VM, whose panic left every later request
a 503) fails the rounds after it."""

import concurrent.futures
import json
import threading

import pytest

from testbed import cache_cases as cc
from testbed import wire
from testbed.envoy_harness import ENVOY_HOSTS

HOSTS = ["nginx", *ENVOY_HOSTS, "openresty", "openresty-proxied"]
ROUNDS = 8
MIN_LENGTH = 1024


@pytest.fixture(scope="module")
def cases():
    # blocks of one network, which a batch may mix
    network = cc.find(cc.block_by_hash).network
    blocks = cc.find_all(cc.block_by_hash)
    return {"traces": cc.streamed_traces(), "blocks": [b for b in blocks if b.network == network][:ROUNDS]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, cases):
    networks = [case.network for case in cases["traces"] + cases["blocks"]]
    stack = cc.CacheStack(tmp_path_factory.mktemp("concurrency-stack"), networks)
    yield stack
    stack.stop()


@pytest.fixture(params=HOSTS)
def proxy(request, tmp_path, stack):
    stack.fresh_daemon()
    # the Lua binding keeps no hot tier of its own
    options = {} if request.param.startswith("openresty") else {"hot": True}
    proxy = cc.start_proxy(request.param, tmp_path / request.param, stack, **options)
    yield proxy
    proxy.stop()


def check(proxy, response, expected, accept_encoding, what):
    """The answer is the node's, whole: decoded equal, its exact length where it has one, gzip
    for a gzip client where it is worth compressing."""
    assert response.status == 200, (what, response.status, response.body[:200])
    if response.header("content-length") is not None:
        assert int(response.header("content-length")) == len(response.body), what
    assert response.decoded() == expected, what
    if accept_encoding == "gzip" and len(expected) >= MIN_LENGTH:
        assert response.header("content-encoding") == "gzip", (what, response.header("x-rpcedge-cache"))
    assert response.header_count("vary") <= 1, what


def test_streams_herds_hits_and_batches_at_once_every_answer_whole(proxy, cases):
    traces, blocks = cases["traces"], cases["blocks"]
    jobs = []
    for round_ in range(ROUNDS):
        # a new block each round: its herd of misses, then hits of the blocks before it
        herd, earlier = blocks[round_ % len(blocks)], blocks[:round_ % len(blocks)]
        trace = traces[round_ % len(traces)]
        round_jobs = [("trace", trace, 1, "gzip" if round_ % 2 == 0 else None)]
        round_jobs += [("herd", herd, id_, "gzip" if id_ < 4 else None) for id_ in range(5)]
        round_jobs += [("hit", block, 7, "gzip") for block in earlier[-2:]]
        round_jobs.append(("batch", [herd, *earlier[-2:]], 0, "gzip"))
        jobs.append(round_jobs)

    def run(job, ready):
        kind, case, id_, accept_encoding = job
        ready.wait()
        if kind == "batch":
            body = json.dumps([{**c.request, "id": at} for at, c in enumerate(case)]).encode()
            expected = b"[" + b",".join(c.answer(at) for at, c in enumerate(case)) + b"]"
            path = case[0].path
        else:
            body, expected, path = case.body(id_), case.answer(id_), case.path
        response = wire.request(proxy.port, path, "POST", {"Content-Type": "application/json"}, body,
                                accept_encoding=accept_encoding, timeout=120)
        return job, response, expected

    for number, round_jobs in enumerate(jobs):
        ready = threading.Barrier(len(round_jobs))
        with concurrent.futures.ThreadPoolExecutor(len(round_jobs)) as pool:
            for job, response, expected in pool.map(lambda job: run(job, ready), round_jobs):
                kind, case, id_, accept_encoding = job
                if kind == "batch":
                    assert json.loads(response.decoded()) == json.loads(expected), (number, kind)
                    assert response.status == 200
                else:
                    check(proxy, response, expected, accept_encoding, (number, kind, case.method, id_))
