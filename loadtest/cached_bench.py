"""`make bench`, the cache daemon's part: the same write workload through rpcedge-cached with the
WAL off (as it runs) and on, side by side, repeated; the disk bytes each wrote (write_bytes of
/proc/<pid>/io, counted when pages are dirtied) and its puts/s.

    .venv/bin/python loadtest/cached_bench.py [--seconds 8] [--runs 3]

The workload: real recorded answers from the corpus (results of 1 KiB up to 1 MiB), each sent as a
host would once it is deflated (the daemon checks and keeps a deflated tail as it came), by wrk
(loadtest/wrk/cache_put.lua: 2 threads, 8 keep-alive connections) for a fixed time, each under a
key of its own. Deflated values are written at least once
either way (to SST or blob files at flush), so WAL off can at best halve the bytes.
"""

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from testbed import provenance
from testbed import replay_corpus as rc
from testbed.cache_entry import DEFLATED, cache_entry
from testbed.harness import CORPUS, LOOPBACK, REPO, corpus_description, start_cached
from testbed.wrk import run_wrk

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "cached"
RESULTS = LOADTEST / "results" / "cached.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "Cargo.lock", "testbed/cache_entry.py", "testbed/wrk.py", "loadtest/wrk"]
SCRIPT = LOADTEST / "wrk" / "cache_put.lua"
ENTRIES = WORK / "entries.bin"
FLUSH_S = 2


def workload(limit=4000, smallest=1024, form=DEFLATED):
    """Entries from the corpus's recorded results of `smallest` bytes up to 1 MiB, at most `limit`
    (None: all), their tails in `form`."""
    entries = []
    for relative in rc.corpus_files(CORPUS):
        if (CORPUS / relative).stat().st_size > 4 << 20:
            continue  # whole-chain traces: slow to parse here, and beyond the 1 MiB taken
        for _, response in rc.read_pairs(CORPUS / relative):
            result = response.get("result") if isinstance(response, dict) else None
            if result is None:
                continue
            text = json.dumps(result, separators=(",", ":")).encode()
            if smallest <= len(text) <= 1 << 20:
                entries.append(cache_entry(text + b"}", form))
                if len(entries) == limit:
                    return entries
    return entries


def io_write_bytes(pid):
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["write_bytes"])


def run(wal, seconds, attempt, entry_mean):
    db = WORK / f"db-{'wal' if wal else 'nowal'}-{attempt}"
    shutil.rmtree(db, ignore_errors=True)
    daemon = start_cached(WORK, db, args=["--flush-interval", f"{FLUSH_S}s", *(["--wal"] if wal else [])])
    pid = daemon.process.proc.pid
    before = io_write_bytes(pid)
    result, output = run_wrk(["-t2", "-c8", f"-d{seconds}s", "-s", SCRIPT, f"http://{LOOPBACK}:{daemon.port}",
                              "--", ENTRIES], seconds)
    assert result["refused"] == 0, output
    # The flush after the last put is part of the cost: without the WAL it is where the bytes go.
    time.sleep(FLUSH_S + 1)
    written = io_write_bytes(pid) - before
    daemon.process.stop()
    shutil.rmtree(db, ignore_errors=True)
    # wrk sends the entries round and round, so their mean size is the payload's
    payload = result["stored"] * entry_mean
    return {"puts_s": result["stored"] / result["seconds"], "payload_bytes": payload, "disk_bytes": written}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    started = provenance.now()
    WORK.mkdir(parents=True, exist_ok=True)
    entries = workload()
    ENTRIES.write_bytes(b"".join(b"%010d" % len(entry) + entry for entry in entries))
    entry_mean = sum(map(len, entries)) / len(entries)
    print(f"{len(entries)} entries from {corpus_description()}, {entry_mean / 1024:.1f} KiB each on average",
          flush=True)
    rows = {"off": [], "on": []}
    for attempt in range(args.runs):
        for wal in (False, True):
            row = run(wal, args.seconds, attempt, entry_mean)
            row["bytes_per_payload_byte"] = row["disk_bytes"] / row["payload_bytes"]
            rows["on" if wal else "off"].append(row)
            print(f"WAL {'on ' if wal else 'off'}: {row['puts_s']:8.0f} puts/s, "
                  f"{row['bytes_per_payload_byte']:.2f} disk bytes per payload byte", flush=True)
    median = {wal: {field: statistics.median(r[field] for r in runs) for field in runs[0]}
              for wal, runs in rows.items()}
    ratios = {
        "disk_bytes_per_payload_byte": median["off"]["bytes_per_payload_byte"] / median["on"]["bytes_per_payload_byte"],
        "puts_s": median["off"]["puts_s"] / median["on"]["puts_s"],
    }
    print(f"WAL off / WAL on (medians of {args.runs}): disk bytes per payload byte "
          f"{ratios['disk_bytes_per_payload_byte']:.2f}x, puts/s {ratios['puts_s']:.2f}x")
    provenance.write(RESULTS, {"runs": rows, "median": median, "off_over_on": ratios}, started)


if __name__ == "__main__":
    main()
