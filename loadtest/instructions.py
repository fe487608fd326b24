"""Instructions per request under callgrind: the figure beside the wall-clock ones that this
shared, noisy machine cannot disturb (`make bench`; results in loadtest/results/instructions.json).

- The core's hot paths (shared-core/benches/hot_paths.rs): a whole untouched exchange, and a
  whole one-shot compression of a 34 KiB answer, instructions per exchange.
- The proxies: each variant of loadtest/variants.py named here, under callgrind, after a warm-up,
  serving requests of the `small` scenario (untouched answers) one after another on one
  connection: instructions per request of the whole proxy (all its threads), and the difference
  to the same proxy without rpcedge. Envoy's own code and V8's are counted as much as rpcedge's,
  which is the point: what a filter costs includes the host's machinery for it.

    .venv/bin/python loadtest/instructions.py [--requests 300] [--variants envoy,envoy-rpcedge-native-default]
"""

import argparse
import glob
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LOADTEST = Path(__file__).resolve().parent
sys.path.insert(0, str(LOADTEST.parent / "tests"))
sys.path.insert(0, str(LOADTEST))
import scenarios  # noqa: E402
import variants  # noqa: E402
from harness import CORPUS, LOOPBACK, REPO, corpus_description, start_replay  # noqa: E402

RESULTS = LOADTEST / "results" / "instructions.json"
WORK = REPO / "build" / "instructions"
CORE_PATHS = {"untouched": 2000, "one_shot_30k": 200}  # path: exchanges
PROXIES = ["nginx", "nginx-rpcedge-default", "envoy", "envoy-rpcedge-wasm-default", "envoy-rpcedge-native-default"]
WARMUP = 100  # requests before counting: V8 tiers the Wasm up, pools and caches fill


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


def proxy(variant, replay, requests, count):
    """Instructions per request of `variant` serving `requests` round and round."""
    for stale in glob.glob(str(WORK / f"{variant.name}.out*")):
        os.remove(stale)
    prefix = ("valgrind", "--tool=callgrind", "--trace-children=yes", "--smc-check=all-non-file",
              "--instr-atstart=no", f"--callgrind-out-file={WORK / variant.name}.out.%p")
    running = variants.start(variant, replay.port, WORK, prefix)
    try:
        def send(n):
            connection = http.client.HTTPConnection(LOOPBACK, running.port, timeout=300)
            for i in range(n):
                request = requests[i % len(requests)]
                connection.request("POST", f"/{request.network}", body=request.body.encode(),
                                   headers={"Content-Type": "application/json", "Accept-Encoding": "gzip"})
                response = connection.getresponse()
                response.read()
                assert response.status == 200, response.status
            connection.close()

        send(WARMUP)
        pid = str(running.cpu_pids[0])  # the nginx worker, or Envoy
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True)
        send(count)
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
        time.sleep(1)
    finally:
        running.stop()
    return round(callgrind_total(str(WORK / f"{variant.name}.out*")) / count)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests counted per proxy")
    parser.add_argument("--variants", default=",".join(PROXIES), help="comma-separated proxy variants")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    results = {"core": core_paths(), "proxies": {}, "requests": args.requests, "corpus": corpus_description()}
    replay = start_replay(WORK)
    try:
        requests = scenarios.write_lists(replay, CORPUS, WORK / "requests")["small"][1]
        known = {variant.name: variant for variant in variants.VARIANTS}
        for name in args.variants.split(","):
            results["proxies"][name] = proxy(known[name], replay, requests, args.requests)
            bare = results["proxies"].get(name.split("-")[0])
            over = "" if bare is None or name == name.split("-")[0] else f" ({results['proxies'][name] - bare:+,} over bare)"
            print(f"{name}: {results['proxies'][name]:,} instructions per untouched request{over}", flush=True)
    finally:
        replay.process.stop()
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
