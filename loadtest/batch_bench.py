"""`make bench`, batches: a batch of 20 receipts (what an indexer sends for a block's
transactions, or ethers v6 when a page asks for them at once; transactions by hash where the
corpus has fewer receipts) through each proxy, with the cache
off, with every call cached, and with half of them cached (the other half's blocks not yet final,
so that those calls go to the node on every request). req/s by wrk, and what the node saw: first
counted exactly over sequential batches, then per batch under the load. Twice: with the replay
answering at once, and with each call taking `--call-delay-ms` (5 ms) at the node, a batch's
calls one after another as geth runs them.

    .venv/bin/python loadtest/batch_bench.py [--seconds 5] [--runs 3] [--call-delay-ms 5]

The proxy runs on a CPU of its own; wrk (1 thread, 16 connections, Accept-Encoding: gzip, every
answer checked), the replay node and the daemon share the others.
"""

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

from bench import pinned
from cache_bench import measure, write_list
from testbed import cache_cases as cc
from testbed import provenance
from testbed import wire
from testbed.envoy_harness import ENVOY_HOSTS
from testbed.harness import REPO

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "batch"
RESULTS = LOADTEST / "results" / "batch.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/cache_cases.py",
            "testbed/wrk.py", "loadtest/wrk"]
NAMESPACE = cc.CacheStack.LATE  # finality moved by the run: half the calls final, then all
CALLS = 20
# batches sent one at a time, for the node's exact count
COUNTED = 50


def transaction_by_hash(request, response):
    result = response.get("result")
    return request["method"] == "eth_getTransactionByHash" and isinstance(result, dict) \
        and isinstance(result.get("blockNumber"), str)


def block_of(case):
    return int(case.response["result"]["blockNumber"], 16)


def receipts():
    """CALLS receipts, in block order; where the corpus has fewer, transactions by hash make up
    the rest. From every network: the batch goes to the replay's `/`, which answers from all.
    And the (number, hash) of each block they name, for the stack's finality node (cc.pinnable)."""
    calls, pins = cc.pinnable(cc.find_all(cc.receipt, limit=CALLS) + cc.find_all(transaction_by_hash, limit=CALLS))
    if len(calls) < CALLS:
        sys.exit(f"the corpus has {len(calls)} receipts and transactions by hash of blocks whose numbers "
                 f"no other names; {CALLS} are needed")
    return sorted(calls[:CALLS], key=block_of), pins


def batch_body(calls):
    return json.dumps([{**c.request, "id": i} for i, c in enumerate(calls, start=1)], separators=(",", ":"))


def send(port, calls, body):
    response = wire.request(port, "/", "POST", {"Content-Type": "application/json"}, body.encode())
    expected = [json.loads(c.answer(i)) for i, c in enumerate(calls, start=1)]
    if response.status != 200 or json.loads(response.decoded()) != expected:
        raise RuntimeError(f"a wrong batch answer ({response.status}): {response.decoded()[:200]!r}")
    return response


def store(port, calls, body, status):
    """Sends the batch until its answer's cache status is `status` (the stores it causes land
    after it is answered)."""
    deadline = time.monotonic() + 10
    while send(port, calls, body).header("x-rpcedge-cache") != status:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the batch is never {status}")
        time.sleep(0.05)


def node_calls(stack):
    status, _, body = stack.replay.request("GET", "/stats")
    assert status == 200
    stats = json.loads(body)
    return stats["rpc_requests"], stats["rpc_calls"]


def case(stack, proxy, calls, body, statuses, args, delay_ms):
    """The node's exact count over sequential batches, then the runs under load; every answer
    right, with an X-Rpcedge-Cache of `statuses` (None: no such header)."""
    before = node_calls(stack)
    for _ in range(COUNTED):
        answer = send(proxy.port, calls, body)
        assert answer.header("x-rpcedge-cache") in statuses, answer.header("x-rpcedge-cache")
    requests, node = (after - earlier for after, earlier in zip(node_calls(stack), before))
    length = len(answer.decoded())
    request_list = write_list(WORK / "batch.tsv", [("POST", "/", length, body)])
    runs = measure(proxy.pids, proxy.port, request_list, ",".join(s or "-" for s in statuses), args.seconds,
                   args.runs, "gzip", f"X-Replay-Call-Delay-Ms: {delay_ms}", count=lambda: node_calls(stack)[1])
    return {"node_requests_per_batch": requests / COUNTED, "node_calls_per_batch": node / COUNTED,
            "node_calls_under_load": statistics.median(r["counted_per_request"] for r in runs),
            "req_s": statistics.median(r["req_s"] for r in runs),
            "cpu_us": statistics.median(r["cpu_us"] for r in runs), "runs": runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--call-delay-ms", type=int, default=5)
    args = parser.parse_args()
    started = provenance.now()

    proxy_cpu, prefix = pinned(WORK)
    calls, pins = receipts()
    body = batch_body(calls)
    # final up to the middle call's block: the calls of blocks up to it are cached, the others not
    final, last = block_of(calls[CALLS // 2 - 1]), block_of(calls[-1])
    cached = sum(block_of(c) <= final for c in calls)
    methods = collections.Counter(c.method for c in calls)
    print(f"batch bench: {', '.join(f'{n} {m}' for m, n in methods.items())} of "
          f"{', '.join(sorted({c.network for c in calls}))} in one batch ({len(body)} bytes); half cached: "
          f"{cached} of them; proxy on CPU {proxy_cpu}, {args.runs} x {args.seconds} s per cell", flush=True)

    stack = cc.CacheStack(WORK, [], pinned=pins)
    rows = []
    try:
        for host in ["nginx", *ENVOY_HOSTS]:
            for delay_ms in (0, args.call_delay_ms):
                proxy = cc.start_proxy(host, WORK / f"{host}-off", stack, argv_prefix=prefix, cache=False)
                try:
                    rows.append({"host": host, "call_delay_ms": delay_ms, "case": "cache off",
                                 **case(stack, proxy, calls, body, (None,), args, delay_ms)})
                finally:
                    proxy.stop()
                stack.fresh_daemon()
                proxy = cc.start_proxy(host, WORK / host, stack, argv_prefix=prefix, namespace=NAMESPACE)
                try:
                    # the first half's blocks final: those calls are stored by the first batch
                    stack.finalize_late(final)
                    store(proxy.port, calls, body, "MISS")
                    time.sleep(0.5)
                    rows.append({"host": host, "call_delay_ms": delay_ms, "case": "half cached",
                                 **case(stack, proxy, calls, body, ("MISS", "COALESCED"), args, delay_ms)})
                    stack.finalize_late(last)
                    store(proxy.port, calls, body, "HIT")
                    rows.append({"host": host, "call_delay_ms": delay_ms, "case": "all cached",
                                 **case(stack, proxy, calls, body, ("HIT",), args, delay_ms)})
                finally:
                    proxy.stop()
                print_rows(rows[-3:])
    finally:
        stack.stop()
    print_rows(rows)
    for host in ["nginx", *ENVOY_HOSTS]:
        for delay_ms in (0, args.call_delay_ms):
            by_case = {r["case"]: r for r in rows if r["host"] == host and r["call_delay_ms"] == delay_ms}
            print(f"{host}, node {delay_ms} ms per call: all cached / cache off "
                  f"{by_case['all cached']['req_s'] / by_case['cache off']['req_s']:.1f}x req/s, "
                  f"half cached {by_case['half cached']['req_s'] / by_case['cache off']['req_s']:.1f}x")
    provenance.write(RESULTS, {"calls": CALLS, "seconds": args.seconds, "runs": args.runs,
                               "proxy_cpu": proxy_cpu, "rows": rows}, started)
    print(f"results: {RESULTS.relative_to(REPO)}")


def print_rows(rows):
    print(f"\n{'host':12} {'node ms/call':>12} {'case':12} {'req/s':>8} {'CPU us/req':>11} "
          f"{'node calls/batch':>17} {'under load':>11}")
    for r in rows:
        print(f"{r['host']:12} {r['call_delay_ms']:12} {r['case']:12} {r['req_s']:8.0f} {r['cpu_us']:11.1f} "
              f"{r['node_calls_per_batch']:17.2f} {r['node_calls_under_load']:11.2f}", flush=True)


if __name__ == "__main__":
    main()
