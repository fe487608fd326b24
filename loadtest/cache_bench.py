"""`make bench`, the cache's part: through each proxy, the cacheable calls of the corpus's method
mix answered as hits and as misses, beside the same proxy serving the same bytes without rpcedge
(nginx: a static file, gzip_static for these gzip clients; Envoy: a direct_response, its rpcedge
filter removed). req/s and the proxy's CPU per request, the median of `--runs` runs per cell.

    .venv/bin/python loadtest/cache_bench.py [--seconds 5] [--runs 3]

The calls are ones whose entries wait for finality (blocks by number, receipts, transactions),
in one namespace whose finalized block the run moves: at block 0 every lookup misses and every
store is refused, so each request is a whole miss (lookup, the node, the store's PUT); once the
block passes them and each call has been stored, each is a hit: from the daemon, and then, with
the hot tier on, from the proxy's own memory. The proxy runs on a CPU of its
own (taskset); wrk (1 thread, 16 connections, Accept-Encoding: gzip), the replay node and the
daemon share the others. The replay answers in microseconds, where a real node takes
milliseconds for the same calls: a miss here is cheap.
"""

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOADTEST = Path(__file__).resolve().parent
sys.path.insert(0, str(LOADTEST.parent / "tests"))
sys.path.insert(0, str(LOADTEST))
import cache_cases as cc  # noqa: E402
import wire  # noqa: E402
from bench import cpu_seconds, split_cpus  # noqa: E402
from envoy_harness import EXAMPLE, render_config, replace_rpcedge_entry, start_envoy  # noqa: E402
from harness import LOOPBACK, REPO, free_port  # noqa: E402

WORK = REPO / "build" / "bench" / "cache"
RESULTS = LOADTEST / "results" / "cache.json"
SCRIPT = LOADTEST / "wrk" / "cache_mix.lua"
NAMESPACE = cc.CacheStack.LATE  # one namespace for every call, whose finality the run moves
CONNECTIONS = 16
# room in the hot tier for every call's entry (the make run configs give 32 MiB)
HOT_BYTES = 32 * 1024 * 1024
WARMUP_S = 2


def waits_for_finality(request, response):
    """A call of the mix that the cache keeps once its block is final (not block 0)."""
    params = request.get("params") or [None]
    by_number = request["method"] in ("eth_getBlockByNumber", "eth_getBlockReceipts") and \
        isinstance(params[0], str) and params[0].startswith("0x") and int(params[0], 16) > 0
    by_transaction = request["method"] in ("eth_getTransactionReceipt", "eth_getTransactionByHash")
    return (by_number or by_transaction) and isinstance(response.get("result"), dict) \
        and 512 <= cc.size(response) <= 1 << 20


def write_list(path, rows):
    """A request list for cache_mix.lua: method, path, decoded length, body."""
    path.write_text("".join(f"{method}\t{target}\t{length}\t{body}\n" for method, target, length, body in rows))
    return path


def wrk(port, request_list, expected, seconds):
    argv = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s", "-s", SCRIPT,
            f"http://{LOOPBACK}:{port}", "--", request_list, expected]
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=seconds + 60)
    result = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode != 0 or result is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    stats = json.loads(result[len("RESULT "):])
    checks = stats["checks"]
    broken = {name: checks[name] for name in ("bad_status", "bad_cache", "bad_body") if checks[name]}
    if broken or any(stats["errors"].values()):
        raise RuntimeError(f"broken answers {broken}, errors {stats['errors']}:\n{done.stdout}")
    return stats


def measure(pids, port, request_list, expected, seconds, runs):
    """Runs after a warm-up: req/s and the proxy's CPU microseconds per request, each run."""
    wrk(port, request_list, expected, WARMUP_S)
    time.sleep(0.5)
    results = []
    for _ in range(runs):
        before = cpu_seconds(pids)
        stats = wrk(port, request_list, expected, seconds)
        cpu = cpu_seconds(pids) - before
        results.append({"req_s": stats["requests"] / (stats["duration_us"] / 1e6),
                        "cpu_us": cpu / stats["requests"] * 1e6, "p50_us": stats["latency_us"]["50"],
                        "fail_open": stats["checks"]["fail_open"] / stats["requests"]})
    return results


def row(proxy, case, runs):
    return {
        "proxy": proxy, "case": case,
        "req_s": statistics.median(r["req_s"] for r in runs),
        "cpu_us": statistics.median(r["cpu_us"] for r in runs),
        "runs": runs,
    }


def store_all(port, calls):
    """Sends every call until each is a HIT."""
    for call in calls:
        deadline = time.monotonic() + 10
        while wire.request(port, call.path, "POST", {"Content-Type": "application/json"},
                           call.body(1)).header("x-rpcedge-cache") != "HIT":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{call.request} is never stored")
            time.sleep(0.05)


def direct_response_config(upstream_port, listen_port, admin_port, hits):
    """The Envoy example without rpcedge, answering /static/<i> with hit i's bytes and headers."""
    text = replace_rpcedge_entry(render_config(upstream_port, listen_port, admin_port), "")
    routes = "".join(
        f"              - match: {{path: \"/static/{i}\"}}\n"
        f"                direct_response:\n"
        f"                  status: 200\n"
        f"                  body: {{inline_bytes: \"{base64.b64encode(hit.body).decode()}\"}}\n"
        f"                response_headers_to_add:\n"
        f"                - header: {{key: content-type, value: application/json}}\n"
        + (f"                - header: {{key: content-encoding, value: gzip}}\n"
           if hit.header("content-encoding") == "gzip" else "")
        for i, hit in enumerate(hits))
    anchor = "              routes:\n"
    assert text.count(anchor) == 1
    text = text.replace(anchor, anchor + routes)
    # direct_response bodies are limited to 4 KiB unless the route config says otherwise
    anchor = "          route_config:\n"
    return text.replace(anchor, anchor + "            max_direct_response_body_size_bytes: 4194304\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    proxy_cpu, other_cpus = split_cpus()
    os.sched_setaffinity(0, other_cpus)
    prefix = ("taskset", "-c", str(proxy_cpu)) if proxy_cpu is not None else ()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)

    calls = cc.find_all(waits_for_finality, limit=48)
    print(f"cache bench: {len(calls)} calls from {cc.CORPUS} ({', '.join(sorted({c.method for c in calls}))}), "
          f"{args.runs} x {args.seconds} s per cell, proxy on CPU {proxy_cpu}", flush=True)
    rows = [("POST", c.path, len(c.answer(1)), c.body(1).decode()) for c in calls]
    mix = write_list(WORK / "mix.tsv", rows)
    static = write_list(WORK / "static.tsv", [("GET", f"/static/{i}", r[2], "-") for i, r in enumerate(rows)])

    stack = cc.CacheStack(WORK, [])
    results = []
    try:
        for host in ("nginx", "envoy"):
            stack.fresh_daemon()
            files = WORK / "static"
            extra = (f"location /static/ {{ root {WORK}; gzip_static on; default_type application/json; "
                     "rpcedge off; rpcedge_cache off; }")
            options = {"namespace": NAMESPACE, "extra": extra} if host == "nginx" else {"namespace": NAMESPACE}
            proxy = cc.start_proxy(host, WORK / host, stack, argv_prefix=prefix, **options)
            try:
                runs = measure(proxy.pids, proxy.port, mix, "MISS", args.seconds, args.runs)
                results.append(row(host, "miss", runs))
                stack.finalize_late(cc.FINAL)
                store_all(proxy.port, calls)
                runs = measure(proxy.pids, proxy.port, mix, "HIT", args.seconds, args.runs)
                results.append(row(host, "hit", runs))
                # the bytes a hit sends, for the variants without rpcedge
                hits = [wire.request(proxy.port, c.path, "POST", {"Content-Type": "application/json"}, c.body(1))
                        for c in calls]
                assert all(h.decoded() == c.answer(1) for h, c in zip(hits, calls))
                if host == "nginx":
                    files.mkdir(exist_ok=True)
                    for i, (hit, call) in enumerate(zip(hits, calls)):
                        (files / str(i)).write_bytes(call.answer(1))
                        if hit.header("content-encoding") == "gzip":
                            (files / f"{i}.gz").write_bytes(hit.body)
                    runs = measure(proxy.pids, proxy.port, static, "-", args.seconds, args.runs)
                    results.append(row(host, "static file (gzip_static)", runs))
            finally:
                proxy.stop()
            # the same hits, answered from the hot tier (the warm-up puts them there)
            proxy = cc.start_proxy(host, WORK / f"{host}-hot", stack, argv_prefix=prefix, hot=HOT_BYTES, **options)
            try:
                runs = measure(proxy.pids, proxy.port, mix, "HIT", args.seconds, args.runs)
                results.append(row(host, "hit, hot tier", runs))
            finally:
                proxy.stop()
            if host == "envoy":
                port, admin = free_port(), free_port()
                text = direct_response_config(stack.replay.port, port, admin, hits)
                process = start_envoy(WORK / "envoy", text, "envoy-direct", concurrency=1, argv_prefix=prefix)
                try:
                    process.wait_for_port(port)
                    runs = measure([process.proc.pid], port, static, "-", args.seconds, args.runs)
                    results.append(row(host, "direct_response", runs))
                finally:
                    process.stop()
    finally:
        stack.stop()

    print(f"\n{'proxy':8} {'case':28} {'req/s':>9} {'CPU us/req':>11} {'ERROR':>7}")
    for r in results:
        fail_open = max(run["fail_open"] for run in r["runs"])
        print(f"{r['proxy']:8} {r['case']:28} {r['req_s']:9.0f} {r['cpu_us']:11.1f} {fail_open:7.2%}")
    for host in ("nginx", "envoy"):
        by_case = {r["case"]: r for r in results if r["proxy"] == host}
        bare = next(r for case, r in by_case.items() if not case.startswith(("hit", "miss")))
        for hit in ("hit", "hit, hot tier"):
            print(f"{host} {hit}: hit/miss req/s {by_case[hit]['req_s'] / by_case['miss']['req_s']:.2f}x, "
                  f"hit CPU/{bare['case']} CPU {by_case[hit]['cpu_us'] / bare['cpu_us']:.2f}x")
    RESULTS.write_text(json.dumps({"calls": len(calls), "seconds": args.seconds, "runs": args.runs,
                                   "proxy_cpu": proxy_cpu, "rows": results}, indent=1) + "\n")
    print(f"results: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
