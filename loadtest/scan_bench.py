"""`make bench`, the cache daemon's eviction: the hit rate of a hot set while a scan of cold keys
runs through the store, with the daemon's protected share (--protected-share 80, as it runs) and
first-in-first-out (--protected-share 0), side by side in one run, repeated.

    .venv/bin/python loadtest/scan_bench.py [--hot 1000] [--scan 200000] [--runs 2]

The workload, as a proxy would make it, on one keep-alive connection: a hot set of --hot keys
asked for 10 times a second in all (each in turn, in a shuffled order), a miss stored again as
the node's answer would be; and a scan of --scan cold keys, each stored once and never asked for
again (an indexer walking history), at SCAN_PER_S keys a second. Time is the workload's own: the
hot lookups come between the scan's stores at that ratio, so a run takes as long as its requests.
The store holds a quarter of the scan (--max-disk), its memtables small so that it flushes often.
A first pass asks for every hot key once (stored, then asked again) before the timed part: the
hit rate without a scan is that part's first --hot lookups, before the scan begins.
"""

import argparse
import http.client
import json
import random
import shutil
import statistics
import zlib

from testbed import provenance
from testbed.cache_entry import cache_entry
from testbed.harness import CACHED_BIN, LOOPBACK, REPO, start_cached

WORK = REPO / "build" / "bench" / "scan"
RESULTS = REPO / "loadtest" / "results" / "scan.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "Cargo.lock"]
HOT_PER_S = 10
SCAN_PER_S = 2000
# a result of random hex digits: what the daemon keeps (deflated) is about half of it
RESULT_BYTES = 2048
MODES = {"protected": 80, "fifo": 0}


def key(kind, n):
    return f"/v1/entries/{kind:08x}{n:056x}"


def run(mode, hot, scan, attempt, tail):
    db = WORK / f"db-{mode}-{attempt}"
    shutil.rmtree(db, ignore_errors=True)
    entry = cache_entry(tail)
    max_disk = scan * kept_bytes(tail) // 4
    daemon = start_cached(WORK, db, args=["--protected-share", str(MODES[mode]), "--max-disk", str(max_disk),
                                          "--memtable-size", str(max_disk // 16), "--flush-interval", "1s"])
    connection = http.client.HTTPConnection(LOOPBACK, daemon.port)

    def call(method, path, body=None):
        connection.request(method, path, body=body)
        response = connection.getresponse()
        response.read()
        return response.status

    def ask(n):
        if call("GET", key(1, n)) == 200:
            return True
        assert call("PUT", key(1, n), entry) == 204
        return False

    try:
        order = list(range(hot))
        random.Random(attempt).shuffle(order)
        for n in order:
            assert call("PUT", key(1, n), entry) == 204
        asked = [ask(n) for n in order]
        assert all(asked), "a hot key stored a moment ago missed"
        before = [ask(n) for n in order]
        during, stored, every = [], 0, SCAN_PER_S // HOT_PER_S
        while stored < scan:
            for _ in range(every):
                assert call("PUT", key(2, stored), entry) == 204
                stored += 1
            during.append(ask(order[len(during) % hot]))
        stats = daemon.stats()
    finally:
        connection.close()
        daemon.process.stop()
        shutil.rmtree(db, ignore_errors=True)
    return {"hit_rate_before": sum(before) / len(before), "hit_rate_during": sum(during) / len(during),
            "hot_lookups_during": len(during), "promotions": stats["promotions_total"], "max_disk": max_disk,
            "stored_bytes": stats["stored_bytes_total"], "file_bytes": stats["rocksdb_sst_bytes"] + stats["rocksdb_blob_bytes"]}


def kept_bytes(tail):
    """About what the store keeps of an entry with `tail`: its deflated form and the envelope."""
    return len(zlib.compress(tail, 6, -15)) + 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hot", type=int, default=1000)
    parser.add_argument("--scan", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    started = provenance.now()
    tail = b'"' + random.Random(0).randbytes(RESULT_BYTES // 2).hex().encode() + b'"}'
    rows = {mode: [] for mode in MODES}
    for attempt in range(args.runs):
        for mode in MODES:
            row = run(mode, args.hot, args.scan, attempt, tail)
            row["kept"] = row["hit_rate_during"] / row["hit_rate_before"]
            rows[mode].append(row)
            print(f"{mode:9} run {attempt + 1}: hot hit rate {row['hit_rate_before']:.3f} before the scan, "
                  f"{row['hit_rate_during']:.3f} during it ({row['kept']:.2f} kept), "
                  f"{row['promotions']} promotions", flush=True)
    lowest = {mode: min(row["kept"] for row in runs) for mode, runs in rows.items()}
    print(f"hit rate kept during the scan, lowest of {args.runs} runs: "
          + ", ".join(f"{mode} {kept:.2f}" for mode, kept in lowest.items()))
    RESULTS.write_text(json.dumps({
        "workload": {"hot": args.hot, "scan": args.scan, "hot_per_s": HOT_PER_S, "scan_per_s": SCAN_PER_S,
                     "entry_bytes": kept_bytes(tail)},
        "runs": rows,
        "median_kept": {mode: statistics.median(row["kept"] for row in runs) for mode, runs in rows.items()},
        "lowest_kept": lowest,
        "provenance": provenance.of_run(started, [CACHED_BIN]),
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
