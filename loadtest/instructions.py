"""Instructions per request under callgrind: the figure beside the wall-clock ones that this
shared, noisy machine cannot disturb (`make bench`; results in loadtest/results/instructions.json).

- The core's hot paths (shared-core/benches/hot_paths.rs): a whole untouched exchange, and a
  whole one-shot compression of a 34 KiB answer, instructions per exchange.
- The proxies, on three paths: each variant under callgrind, after a warm-up, serving one request
  list round and round, one request after another on one connection: instructions per request of
  the whole proxy (all its threads), and the difference to the same proxy without rpcedge. Envoy's
  own code and V8's are counted as much as rpcedge's, which is the point: what a filter costs
  includes the host's machinery for it.
  - `untouched`: the `small` scenario, answers under 1 KiB that rpcedge leaves as they are;
  - `compressed`: the `30KiB` scenario, answers of 24-40 KiB that rpcedge compresses in one shot
    (above min_length, below max_buffer); the bare proxies pass them on uncompressed;
  - `hit`: the cacheable calls of cache_bench.py, every one a warm hit: nginx and both Envoy
    adapters with the cache on and its daemon (`-cache`: each hit asks the daemon; `-cache-hot`:
    answered from the proxy's hot tier); the bare proxies forward the same calls to the node.

    .venv/bin/python loadtest/instructions.py [--requests 300] [--paths untouched,compressed,hit]
        [--variants envoy,envoy-rpcedge-native-default,envoy-rpcedge-native-cache] [--runs 1]

`--variants` names variants of testbed/variants.py (untouched and compressed paths; on the hit
path only those without rpcedge, the reference) and the cache variants below (hit path only).
"""

import argparse
import glob
import http.client
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from cache_bench import HOT_BYTES, NAMESPACE, mix_calls, store_all
from testbed import cache_cases as cc
from testbed import provenance, scenarios, variants
from testbed.harness import CORPUS, LOOPBACK, REPO, corpus_description, start_replay

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results" / "instructions.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/variants.py",
            "testbed/scenarios.py"]
WORK = REPO / "build" / "instructions"
CORE_PATHS = {"untouched": 2000, "one_shot_30k": 200}  # path: exchanges
PROXIES = ["nginx", "nginx-rpcedge-default", "envoy", "envoy-rpcedge-wasm-default", "envoy-rpcedge-native-default"]
# The cache variants: name: (cc.start_proxy's host, hot tier). Compression at its defaults, as in
# the variants above.
CACHE_VARIANTS = {
    "nginx-rpcedge-cache": ("nginx", False),
    "envoy-rpcedge-wasm-cache": ("envoy", False),
    "envoy-rpcedge-native-cache": ("envoy-native", False),
    "nginx-rpcedge-cache-hot": ("nginx", True),
    "envoy-rpcedge-wasm-cache-hot": ("envoy", True),
    "envoy-rpcedge-native-cache-hot": ("envoy-native", True),
}
PATHS = {  # path: the request list it serves
    "untouched": "small",
    "compressed": "30KiB",
    "hit": "the cacheable calls of cache_bench.py",
}
WARMUP = 100  # requests before counting: V8 tiers the Wasm up, pools and caches fill
# Under callgrind the proxy runs tens of times slower than the daemon it asks: a lookup given the
# default 50 ms could time out and fail open (a miss). A longer wait changes nothing on a hit.
LOOKUP_TIMEOUT_MS = 2000


def callgrind_total(pattern):
    """The largest `summary:`/`totals:` of the callgrind files matching `pattern`: the part dumped
    while counting (each process and each dump writes a file of its own)."""
    total = 0
    for path in glob.glob(pattern):
        for line in open(path, errors="replace"):
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return total


def core_paths():
    build = subprocess.run(["cargo", "bench", "--offline", "-p", "rpcedge-core", "--bench", "hot_paths", "--no-run",
                            "--message-format=json"], cwd=REPO, capture_output=True, text=True, check=True)
    binary = next(json.loads(line)["executable"] for line in build.stdout.splitlines()
                  if '"executable":"' in line and "hot_paths" in line)
    figures = {}
    for path, exchanges in CORE_PATHS.items():
        out = WORK / f"core-{path}.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--toggle-collect=hot_paths::{path}",
                        f"--callgrind-out-file={out}", binary, "--bench", path, str(exchanges)],
                       check=True, capture_output=True)
        figures[path] = round(callgrind_total(str(out)) / exchanges)
        print(f"core {path}: {figures[path]:,} instructions per exchange", flush=True)
    return figures


def proxy(name, start, calls, count, check):
    """Instructions per request of the proxy that `start(argv_prefix)` starts (returning its port,
    the pid to count and how to stop it), serving `calls` ((path, body) pairs) round and round.
    The callgrind files stay in WORK as <name>.out.<pid>, for callgrind_annotate."""
    for stale in glob.glob(str(WORK / f"{name}.out*")):
        os.remove(stale)
    prefix = ("valgrind", "--tool=callgrind", "--trace-children=yes", "--smc-check=all-non-file",
              "--instr-atstart=no", f"--callgrind-out-file={WORK / name}.out.%p")
    port, pid, stop = start(prefix)
    try:
        def send(n):
            connection = http.client.HTTPConnection(LOOPBACK, port, timeout=300)
            for i in range(n):
                path, body = calls[i % len(calls)]
                connection.request("POST", path, body=body,
                                   headers={"Content-Type": "application/json", "Accept-Encoding": "gzip"})
                response = connection.getresponse()
                response.read()
                assert response.status == 200, response.status
                check(response)
            connection.close()

        send(WARMUP)
        subprocess.run(["callgrind_control", "--instr=on", str(pid)], check=True, capture_output=True)
        send(count)
        subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
        time.sleep(1)
    finally:
        stop()
    return round(callgrind_total(str(WORK / f"{name}.out*")) / count)


def plain(variant, replay):
    """A variant of testbed/variants.py: the nginx worker's pid, or Envoy's."""
    def start(prefix):
        running = variants.start(variant, replay.port, WORK, prefix)
        return running.port, running.cpu_pids[0], running.stop
    return start


def cached(name, stack, calls):
    """A cache variant in front of the stack's node and a fresh daemon, once every call has been
    stored through it (a HIT once; not counted): the nginx worker's pid (the last of the proxy's),
    or Envoy's."""
    host, hot = CACHE_VARIANTS[name]
    options = {"hot": HOT_BYTES} if hot else {}

    def start(prefix):
        stack.fresh_daemon()
        # every block final at once: each call is kept the first time it is asked
        stack.finalize_late(cc.FINAL)
        running = cc.start_proxy(host, WORK / name, stack, argv_prefix=prefix, namespace=NAMESPACE,
                                 timeout_ms=LOOKUP_TIMEOUT_MS, **options)
        try:
            store_all(running.port, calls)
        except BaseException:
            running.stop()
            raise
        return running.port, running.pids[-1], running.stop
    return start


def expect(path, name):
    """What every answer of `name` on `path` must show, so that a figure is the path it claims:
    a cache variant's a HIT, rpcedge's compressed answers gzip, every other answer as it came."""
    encoding = "gzip" if path == "compressed" and name != name.split("-")[0] else None

    def check(response):
        if name in CACHE_VARIANTS:
            assert response.getheader("x-rpcedge-cache") == "HIT", f"{name}: {response.getheader('x-rpcedge-cache')}"
        else:
            got = response.getheader("Content-Encoding")
            assert got == encoding, f"{name} on {path}: Content-Encoding {got}"
    return check


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests counted per proxy")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths: " + ", ".join(PATHS))
    parser.add_argument("--variants", default=",".join(PROXIES + list(CACHE_VARIANTS)),
                        help="comma-separated proxy variants")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs per figure; with more than one the JSON keeps each and the figure is the median")
    args = parser.parse_args()
    started = provenance.now()
    paths, names = args.paths.split(","), args.variants.split(",")
    known = {variant.name: variant for variant in variants.VARIANTS}
    unknown = [n for n in names if n not in known and n not in CACHE_VARIANTS] + [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    WORK.mkdir(parents=True, exist_ok=True)
    results = {"core": core_paths(), "paths": {}, "requests": args.requests, "warmup": WARMUP,
               "corpus": corpus_description()}
    replay = start_replay(WORK)
    stack = None
    try:
        lists = scenarios.write_lists(replay, CORPUS, WORK / "requests")
        for path in paths:
            if path == "hit":
                calls, pins = mix_calls()
                requests = [(c.path, c.body(1)) for c in calls]
                (WORK / "cache").mkdir(exist_ok=True)
                stack = cc.CacheStack(WORK / "cache", [], pinned=pins)
                runs = [(n, plain(known[n], replay)) for n in names if n in known and not known[n].rpcedge]
                runs += [(n, cached(n, stack, calls)) for n in names if n in CACHE_VARIANTS]
            else:
                requests = [(f"/{r.network}", r.body.encode()) for r in lists[PATHS[path]][1]]
                runs = [(n, plain(known[n], replay)) for n in names if n in known]
            figures, repeats = {}, {}
            for name, start in runs:
                counted = [proxy(f"{path}-{name}", start, requests, args.requests, expect(path, name))
                           for _ in range(args.runs)]
                figures[name] = statistics.median_low(counted)
                if args.runs > 1:
                    repeats[name] = counted
                bare = figures.get(name.split("-")[0])
                over = "" if bare is None or name == name.split("-")[0] else f" ({figures[name] - bare:+,} over bare)"
                spread = "" if args.runs == 1 else f" [runs: {', '.join(f'{c:,}' for c in counted)}]"
                print(f"{path} {name}: {figures[name]:,} instructions per request{over}{spread}", flush=True)
            results["paths"][path] = {"requests": f"{PATHS[path]} ({len(requests)} distinct)", "proxies": figures}
            if repeats:
                results["paths"][path]["runs"] = repeats
    finally:
        replay.process.stop()
        if stack:
            stack.stop()
    provenance.write(RESULTS, results, started)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
