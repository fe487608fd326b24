"""`make bench`, the herd: `--clients` clients ask through one proxy, all at once, for the same
block that is not yet stored (a block by hash, another each round), as when a block is finalized
and every indexer asks for it. Counted: the requests that reach the node (the replay, which
counts them), each client's cache status and the coding its answer came in (every client takes
gzip), and the bytes they got; every answer is checked against the recording with the client's
own id. Each host runs twice, with coalescing on (the default
`lock_timeout_ms`) and off (0), on a fresh daemon. nginx runs 2 workers, Envoy 2 worker threads:
the daemon holds the key for all of them.

    .venv/bin/python loadtest/herd_bench.py [--clients 200] [--rounds 5]

The replay answers in microseconds; a real node takes milliseconds for a block, which keeps the
holder at the node longer and so only gives the others more time to join it.
"""

import argparse
import collections
import concurrent.futures
import json
import shutil
import sys
import threading
from pathlib import Path

from testbed import cache_cases as cc
from testbed import provenance, wire
from testbed.envoy_harness import ENVOY_HOSTS
from testbed.harness import REPO

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "herd"
RESULTS = LOADTEST / "results" / "herd.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/cache_cases.py"]


def herd(port, case, clients):
    """`clients` gzip clients' requests for `case` at once: (each client's status and the coding
    its answer came in, e.g. "COALESCED gzip"; the body bytes they got; every answer right)."""
    ready = threading.Barrier(clients)

    def ask(id_):
        ready.wait()
        response = wire.request(port, case.path, "POST", {"Content-Type": "application/json"}, case.body(id_))
        right = response.status == 200 and response.decoded() == case.answer(id_)
        coding = response.header("content-encoding") or "identity"
        return f"{response.header('x-rpcedge-cache')} {coding}", len(response.body), right

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        outcomes = list(pool.map(ask, range(clients)))
    statuses = collections.Counter(status for status, _, _ in outcomes)
    return statuses, sum(size for _, size, _ in outcomes), all(right for _, _, right in outcomes)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    started = provenance.now()
    blocks = cc.find_all(cc.block_by_hash, limit=args.rounds)
    if len(blocks) < args.rounds:
        sys.exit(f"the corpus has {len(blocks)} blocks by hash; {args.rounds} are needed")
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    stack = cc.CacheStack(WORK, sorted({block.network for block in blocks}))
    rows = []
    try:
        for host in ["nginx", *ENVOY_HOSTS]:
            for lock_timeout_ms in (5000, 0):
                # each run asks for the same blocks, from an empty store
                stack.fresh_daemon()
                proxy = cc.start_proxy(host, WORK / f"{host}-{lock_timeout_ms}", stack, workers=2,
                                       settings={"lock_timeout_ms": lock_timeout_ms})
                try:
                    node, statuses, body_bytes, right = [], collections.Counter(), 0, True
                    for block in blocks:
                        before = stack.node_requests()
                        counted, size, all_right = herd(proxy.port, block, args.clients)
                        node.append(stack.node_requests() - before)
                        statuses.update(counted)
                        body_bytes += size
                        right &= all_right
                finally:
                    proxy.stop()
                row = {"host": host, "lock_timeout_ms": lock_timeout_ms, "clients": args.clients,
                       "node_requests_per_round": node, "statuses": dict(statuses), "body_bytes": body_bytes,
                       "every_answer_right": right}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        stack.stop()
    provenance.write(RESULTS, {"rows": rows}, started)
    print(f"written to {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
