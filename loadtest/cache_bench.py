"""`make bench`, the cache's part: through each proxy (nginx, both Envoy adapters, OpenResty's Lua
binding in both its forms), the cacheable calls of the corpus's method mix answered as hits and as
misses, beside the same proxy serving the same bytes without rpcedge (nginx and OpenResty: a
static file, gzip_static for these gzip clients; Envoy: a direct_response, its rpcedge filter
removed). req/s and the proxy's CPU per request, the median of `--runs` runs per cell.
Then big answers (blocks by hash of 100 KiB and more) as hits to gzip, zstd, br and identity clients,
beside the same bytes without rpcedge, through nginx and the native Envoy module: the CPU of the
proxy and of the daemon per hit. Last, the load test's whole method mix with the cache warm
through nginx, beside bare nginx without compression (`warm`).

    .venv/bin/python loadtest/cache_bench.py [--seconds 5] [--runs 3] [--part mix|big|warm]

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
import random
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import bench
from bench import cpu_seconds, pinned
from testbed import cache_cases as cc
from testbed import provenance
from testbed import scenarios, variants, wire
from testbed.envoy_harness import render_config, replace_rpcedge_entry, start_envoy
from testbed.harness import LOOPBACK, REPO, free_port
from testbed.stack import NETWORKS
from testbed.wrk import run_wrk

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "cache"
RESULTS = LOADTEST / "results" / "cache.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/cache_cases.py",
            "testbed/variants.py", "testbed/scenarios.py", "testbed/wrk.py", "loadtest/wrk"]
SCRIPT = LOADTEST / "wrk" / "cache_mix.lua"
NAMESPACE = cc.CacheStack.LATE  # one namespace for every call, whose finality the run moves
CONNECTIONS = 16
# room in the hot tier for every call's entry (the make run configs give 32 MiB)
HOT_BYTES = 32 * 1024 * 1024
WARMUP_S = 2
MIX_CALLS = 48
# big answers: at least this long, and this many of them
BIG = 100 * 1024
BIG_CALLS = 4


def waits_for_finality(request, response):
    """A call of the mix that the cache keeps once its block is final (not block 0)."""
    params = request.get("params") or [None]
    by_number = request["method"] in ("eth_getBlockByNumber", "eth_getBlockReceipts") and \
        isinstance(params[0], str) and params[0].startswith("0x") and int(params[0], 16) > 0
    by_transaction = request["method"] in ("eth_getTransactionReceipt", "eth_getTransactionByHash")
    return (by_number or by_transaction) and isinstance(response.get("result"), dict) \
        and 512 <= cc.size(response) <= 1 << 20


def mix_calls():
    """The mix's calls (MIX_CALLS of them), and the (number, hash) of each block they name, which
    the stack's finality node must give for the daemon to keep them (cc.pinnable)."""
    calls, pins = cc.pinnable(cc.find_all(waits_for_finality, limit=2 * MIX_CALLS))
    if len(calls) < MIX_CALLS:
        sys.exit(f"the corpus has {len(calls)} calls that wait for finality and name a block no other names by "
                 f"another hash; {MIX_CALLS} are needed")
    return calls[:MIX_CALLS], pins


def big_answer(request, response):
    """A block by hash of at least BIG bytes: stored without waiting for finality."""
    return request["method"] == "eth_getBlockByHash" and isinstance(response.get("result"), dict) \
        and cc.size(response) >= BIG


def write_list(path, rows):
    """A request list for cache_mix.lua: method, path, decoded length, body."""
    path.write_text("".join(f"{method}\t{target}\t{length}\t{body}\n" for method, target, length, body in rows))
    return path


def wrk(port, request_list, expected, seconds, coding="gzip", header=None):
    stats, output = run_wrk(["-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s", "-s", SCRIPT,
                             f"http://{LOOPBACK}:{port}", "--", request_list, expected, coding,
                             *([header] if header else [])], seconds)
    checks = stats["checks"]
    broken = {name: checks[name] for name in ("bad_status", "bad_cache", "bad_body") if checks[name]}
    if broken or any(stats["errors"].values()):
        raise RuntimeError(f"broken answers {broken}, errors {stats['errors']}:\n{output}")
    return stats


@dataclass(frozen=True)
class Cell:
    """What one case of a table measures: wrk at `port` with `request_list`, each answer's
    X-Rpcedge-Cache in `expected`, the CPU of `pids`."""
    pids: list
    port: int
    request_list: Path
    expected: str
    coding: str = "gzip"
    header: str = None

    def warm_up(self):
        wrk(self.port, self.request_list, self.expected, WARMUP_S, self.coding, self.header)
        time.sleep(0.5)

    def run(self, seconds, count=None):
        """One run: req/s and the CPU microseconds of `pids` per request (and how much `count()`
        grew per request, where given)."""
        before, counted = cpu_seconds(self.pids), count() if count else 0
        stats = wrk(self.port, self.request_list, self.expected, seconds, self.coding, self.header)
        cpu = cpu_seconds(self.pids) - before
        result = {"req_s": stats["requests"] / (stats["duration_us"] / 1e6),
                  "cpu_us": cpu / stats["requests"] * 1e6, "p50_us": stats["latency_us"]["50"],
                  "fail_open": stats["checks"]["fail_open"] / stats["requests"]}
        if count:
            result["counted_per_request"] = (count() - counted) / stats["requests"]
        return result


@dataclass(frozen=True)
class LoadMixCell:
    """A case of the warm mix: the load test's requests (bench.py's wrk script, every answer
    checked) at `port`, the CPU of `pids`."""
    pids: list
    port: int
    request_list: Path
    connections: int
    header: str

    def warm_up(self):
        bench.wrk(self.port, self.connections, self.request_list, "gzip", WARMUP_S, self.header)
        time.sleep(0.5)

    def run(self, seconds):
        before = cpu_seconds(self.pids)
        stats, output = bench.wrk(self.port, self.connections, self.request_list, "gzip", seconds, self.header)
        checks = stats["checks"]
        broken = {name: checks[name] for name in ("bad_status", "unknown", "bad_length", "bad_gzip", "bad_coding")
                  if checks[name]}
        if broken or any(stats["errors"].values()):
            raise RuntimeError(f"broken answers {broken}, errors {stats['errors']}:\n{output}")
        return {"req_s": stats["requests"] / (stats["duration_us"] / 1e6),
                "cpu_us": (cpu_seconds(self.pids) - before) / stats["requests"] * 1e6,
                "body_bytes": checks["body_bytes"] / checks["answered"],
                "cached": checks["cached"] / checks["answered"], "fail_open": 0}


def measure(pids, port, request_list, expected, seconds, runs, coding="gzip", header=None, count=None):
    """`runs` runs of one cell, one after another, after a warm-up."""
    cell = Cell(pids, port, request_list, expected, coding, header)
    cell.warm_up()
    return [cell.run(seconds, count) for _ in range(runs)]


def interleaved(cells, seconds, rounds):
    """The runs of each cell ({case: Cell or LoadMixCell}) in `rounds` rounds, each one run of every cell in
    turn, after a warm-up of each: a slow minute of this shared machine lands on one run of every
    case rather than on all runs of one, and a ratio of two cases is taken round by round, the
    n-th run of one over the n-th of the other (loadtest/goals.py). {case: [run, ...]}"""
    for cell in cells.values():
        cell.warm_up()
    runs = {case: [] for case in cells}
    order = list(cells)
    for round_number in range(rounds):
        # each round begins with another case: no case always runs first, or last
        shift = round_number % len(order)
        for case in order[shift:] + order[:shift]:
            runs[case].append(cells[case].run(seconds))
    return runs


def row(proxy, case, runs):
    return {
        "proxy": proxy, "case": case,
        "req_s": statistics.median(r["req_s"] for r in runs),
        "cpu_us": statistics.median(r["cpu_us"] for r in runs),
        "runs": runs,
    }


def post(port, call, coding="gzip"):
    return wire.request(port, call.path, "POST", {"Content-Type": "application/json"}, call.body(1),
                        accept_encoding=coding if coding != "identity" else None)


def store_all(port, calls):
    """Sends every call until each is a HIT."""
    for call in calls:
        deadline = time.monotonic() + 10
        while post(port, call).header("x-rpcedge-cache") != "HIT":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{call.request} is never stored")
            time.sleep(0.05)


def direct_response_config(upstream_port, listen_port, admin_port, hits, name=str):
    """The Envoy example without rpcedge, answering /static/<name(i)> with hit i's bytes and
    headers."""
    text = replace_rpcedge_entry(render_config(upstream_port, listen_port, admin_port), "")
    routes = "".join(
        f"              - match: {{path: \"/static/{name(i)}\"}}\n"
        f"                direct_response:\n"
        f"                  status: 200\n"
        f"                  body: {{inline_bytes: \"{base64.b64encode(hit.body).decode()}\"}}\n"
        f"                response_headers_to_add:\n"
        f"                - header: {{key: content-type, value: application/json}}\n"
        + (f"                - header: {{key: content-encoding, value: {hit.header('content-encoding')}}}\n"
           if hit.header("content-encoding") else "")
        for i, hit in enumerate(hits))
    anchor = "              routes:\n"
    assert text.count(anchor) == 1
    text = text.replace(anchor, anchor + routes)
    # direct_response bodies are limited to 4 KiB unless the route config says otherwise
    anchor = "          route_config:\n"
    return text.replace(anchor, anchor + "            max_direct_response_body_size_bytes: 4194304\n")


@contextmanager
def direct_response(stack, prefix, hits, name=str):
    """Envoy without rpcedge answering /static/<name(i)> with `hits`' bytes from direct_responses,
    while the block runs: (its pids, its port)."""
    port, admin = free_port(), free_port()
    text = direct_response_config(stack.replay.port, port, admin, hits, name)
    workdir = WORK / f"envoy-direct-{port}"
    workdir.mkdir(exist_ok=True)
    process = start_envoy(workdir, text, "envoy-direct", concurrency=1, argv_prefix=prefix)
    try:
        process.wait_for_port(port)
        yield [process.proc.pid], port
    finally:
        process.stop()


@contextmanager
def running(proxy):
    try:
        yield proxy
    finally:
        proxy.stop()


def mix(stack, prefix, args, results):
    """The method mix's cacheable calls: misses; then, in interleaved rounds, hits from the daemon
    and from the hot tier beside the same bytes without rpcedge; the proxy's CPU."""
    calls, _ = mix_calls()
    print(f"cache bench: {len(calls)} calls from {cc.CORPUS} ({', '.join(sorted({c.method for c in calls}))}), "
          f"{args.runs} x {args.seconds} s per cell", flush=True)
    rows = [("POST", c.path, len(c.answer(1)), c.body(1).decode()) for c in calls]
    mix_list = write_list(WORK / "mix.tsv", rows)
    static = write_list(WORK / "static.tsv", [("GET", f"/static/{i}", r[2], "-") for i, r in enumerate(rows)])
    files = WORK / "static"
    files.mkdir(exist_ok=True)
    for host in MIX_HOSTS:
        stack.fresh_daemon()
        options = {"namespace": NAMESPACE}
        if not host.startswith("envoy"):
            # nginx and OpenResty serve the same bytes themselves, from a location without rpcedge
            options["extra"] = static_location(rpcedge=host == "nginx")
        with ExitStack() as proxies:
            proxy = proxies.enter_context(running(cc.start_proxy(host, WORK / host, stack, argv_prefix=prefix,
                                                                 **options)))
            runs = measure(proxy.pids, proxy.port, mix_list, "MISS,COALESCED", args.seconds, args.runs)
            results.append(row(host, "miss", runs))
            stack.finalize_late(cc.FINAL)
            store_all(proxy.port, calls)
            # the bytes a hit sends, for the case without rpcedge
            hits = [post(proxy.port, c) for c in calls]
            assert all(h.decoded() == c.answer(1) for h, c in zip(hits, calls))
            cells = {"hit": Cell(proxy.pids, proxy.port, mix_list, "HIT")}
            if not host.startswith("openresty"):  # the Lua binding keeps no hot tier
                # the same hits, answered from the hot tier (the warm-up puts them there)
                hot = proxies.enter_context(running(cc.start_proxy(host, WORK / f"{host}-hot", stack,
                                                                   argv_prefix=prefix, hot=HOT_BYTES, **options)))
                cells["hit, hot tier"] = Cell(hot.pids, hot.port, mix_list, "HIT")
            if host.startswith("envoy"):
                pids, port = proxies.enter_context(direct_response(stack, prefix, hits))
                cells["direct_response"] = Cell(pids, port, static, "-")
            else:
                for i, (hit, call) in enumerate(zip(hits, calls)):
                    (files / str(i)).write_bytes(call.answer(1))
                    if hit.header("content-encoding") == "gzip":
                        (files / f"{i}.gz").write_bytes(hit.body)
                cells["static file (gzip_static)"] = Cell(proxy.pids, proxy.port, static, "-")
            for case, runs in interleaved(cells, args.seconds, args.runs).items():
                results.append(row(host, case, runs))
    print_rows(results)
    for host in MIX_HOSTS:
        by_case = {r["case"]: r for r in results if r["proxy"] == host}
        bare = next(by_case[case] for case in BARE if case in by_case)
        for hit in ("hit", "hit, hot tier"):
            if hit in by_case:
                print(f"{host} {hit}: hit/miss req/s {by_case[hit]['req_s'] / by_case['miss']['req_s']:.2f}x, "
                      f"hit CPU/{bare['case']} CPU {by_case[hit]['cpu_us'] / bare['cpu_us']:.2f}x")
    return len(calls)


# the proxies of the mix: OpenResty is the Lua binding, in its subrequest and proxy_pass forms
MIX_HOSTS = ("nginx", "envoy", "envoy-native", "openresty", "openresty-proxied")
# the cases that serve the same bytes without rpcedge
BARE = ("static file (gzip_static)", "direct_response")


def static_location(rpcedge=True):
    """Static files without rpcedge: /static/ as gzip_static serves them, and /static-zstd/ and
    /static-br/ holding a hit's own bytes, sent with its Content-Encoding. `rpcedge`: the server
    loads the module, whose directives these locations turn off (OpenResty's does not)."""
    off = "rpcedge off; rpcedge_cache off; " if rpcedge else ""
    coded = "".join(f"location /static-{coding}/ {{ root {WORK}; default_type application/json; "
                    f"add_header Content-Encoding {coding}; {off}}} "
                    for coding in ("zstd", "br"))
    return f"location /static/ {{ root {WORK}; gzip_static on; default_type application/json; {off}}} " + coded


def big(stack, prefix, args, results):
    """Big answers as hits, to gzip, zstd, br and identity clients, from the daemon and the hot
    tier, beside the same bytes without rpcedge: the CPU of the proxy and of the daemon per
    request."""
    calls = cc.find_all(big_answer, limit=BIG_CALLS)
    sizes = ", ".join(f"{len(c.answer(1)) // 1024} KiB" for c in calls)
    print(f"big answers: {len(calls)} blocks by hash ({sizes}), {args.runs} x {args.seconds} s per cell", flush=True)
    rows = [("POST", c.path, len(c.answer(1)), c.body(1).decode()) for c in calls]
    hit_list = write_list(WORK / "big.tsv", rows)
    name = "big-{}".format
    codings = ("gzip", "zstd", "br", "identity")

    def static_list(coding, hits=None):
        """The list of the same bytes as files: each where it is served as the hit came (a hit
        goes plain where its entry keeps no form for the client's coding)."""
        came = [hit.header("content-encoding") for hit in hits] if hits else [None] * len(rows)
        where = ["static" if c in (None, "gzip") else f"static-{c}" for c in came]
        return write_list(WORK / f"big-static-{coding}.tsv",
                          [("GET", f"/{w}/{name(i)}", r[2], "-") for i, (w, r) in enumerate(zip(where, rows))])

    for where in ("static", "static-zstd", "static-br"):
        (WORK / where).mkdir(exist_ok=True)
    for host in ("nginx", "envoy-native"):
        stack.fresh_daemon()
        daemon = [stack.daemon.process.proc.pid]
        options = {"namespace": NAMESPACE, "extra": static_location()} if host == "nginx" else {"namespace": NAMESPACE}
        with ExitStack() as proxies:
            proxy = proxies.enter_context(running(cc.start_proxy(host, WORK / f"big-{host}", stack,
                                                                 argv_prefix=prefix, **options)))
            store_all(proxy.port, calls)
            hits = {coding: [post(proxy.port, c, coding) for c in calls] for coding in codings}
            for coding in codings:
                assert all(h.decoded() == c.answer(1) for h, c in zip(hits[coding], calls))
                came = [h.header("content-encoding") or "identity" for h in hits[coding]]
                assert set(came) <= {coding, "identity"}, came
                print(f"{host}: hits to a {coding} client came as {', '.join(came)}", flush=True)
            if host == "nginx":
                for i, call in enumerate(calls):
                    (WORK / "static" / name(i)).write_bytes(call.answer(1))
                    (WORK / "static" / f"{name(i)}.gz").write_bytes(hits["gzip"][i].body)
                    for coding in ("zstd", "br"):
                        if hits[coding][i].header("content-encoding") == coding:
                            (WORK / f"static-{coding}" / name(i)).write_bytes(hits[coding][i].body)
            hot = proxies.enter_context(running(cc.start_proxy(host, WORK / f"big-{host}-hot", stack,
                                                               argv_prefix=prefix, hot=HOT_BYTES, **options)))
            cells = {}
            for coding in codings:
                cells[f"big hit, {coding}"] = Cell(proxy.pids + daemon, proxy.port, hit_list, "HIT", coding)
                cells[f"big hit, hot tier, {coding}"] = Cell(hot.pids + daemon, hot.port, hit_list, "HIT", coding)
                if host == "nginx":
                    cells[f"big static file, {coding}"] = Cell(proxy.pids + daemon, proxy.port,
                                                               static_list(coding, hits[coding]), "-", coding)
                else:
                    pids, port = proxies.enter_context(direct_response(stack, prefix, hits[coding], name))
                    cells[f"big direct_response, {coding}"] = Cell(pids + daemon, port, static_list("direct"), "-",
                                                                   coding)
            for case, runs in interleaved(cells, args.seconds, args.runs).items():
                results.append(row(host, case, runs))
    print_rows([r for r in results if r["case"].startswith("big")])
    for host in ("nginx", "envoy-native"):
        by_case = {r["case"]: r for r in results if r["proxy"] == host}
        bare = "static file" if host == "nginx" else "direct_response"
        for coding in codings:
            for hit in ("big hit", "big hit, hot tier"):
                ratio = by_case[f"{hit}, {coding}"]["cpu_us"] / by_case[f"big {bare}, {coding}"]["cpu_us"]
                print(f"{host} {hit}, {coding}: CPU/{bare} CPU {ratio:.2f}x")
    return len(calls)


def warm(stack, prefix, args, results):
    """The load test's method mix (testbed/scenarios.py: single calls of every kind, cacheable
    or not) with the cache warm, through nginx with rpcedge's defaults and a hot tier as `make
    run` has them, beside bare nginx proxying to the node without compression: req/s, the proxy's
    CPU and the bytes of an answer; with the node answering at once and taking
    `--call-delay-ms` per call."""
    pairs = list(scenarios.real_pairs(cc.CORPUS))
    requests = scenarios.mix_requests(stack.replay, cc.CORPUS, pairs, random.Random(scenarios.SEED))
    request_list = WORK / "load-mix.tsv"
    scenarios.write_list(request_list, requests)
    connections = next(s.connections for s in scenarios.SCENARIOS if s.name == "mix")
    print(f"warm mix: the load test's mix, {len(requests)} requests, {connections} connections, "
          f"{args.runs} x {args.seconds} s per cell", flush=True)

    for delay_ms in (0, args.call_delay_ms):
        header = f"X-Replay-Call-Delay-Ms: {delay_ms}"
        stack.fresh_daemon()
        with ExitStack() as proxies:
            bare = proxies.enter_context(running(variants.start(
                next(v for v in variants.VARIANTS if v.name == "nginx"), stack.replay.port, WORK / "warm", prefix)))
            proxy = proxies.enter_context(running(cc.start_proxy("nginx", WORK / "warm-nginx", stack,
                                                                 argv_prefix=prefix, hot=HOT_BYTES)))
            # warm: every cacheable answer stored, then kept in the hot tier by the warm-up below
            bench.wrk(proxy.port, connections, request_list, "gzip", WARMUP_S)
            cells = {"bare nginx": LoadMixCell(list(bare.cpu_pids), bare.port, request_list, connections, header),
                     "nginx + rpcedge, cache warm": LoadMixCell(proxy.pids, proxy.port, request_list, connections,
                                                                header)}
            for name, runs in interleaved(cells, args.seconds, args.runs).items():
                results.append(warm_row(name, delay_ms, runs))
    print(f"\n{'warm mix':30} {'node ms/call':>12} {'req/s':>8} {'CPU us/req':>11} {'B/answer':>9} {'cached':>7}")
    for r in (r for r in results if r["case"].startswith("warm mix")):
        print(f"{r['proxy']:30} {r['call_delay_ms']:12} {r['req_s']:8.0f} {r['cpu_us']:11.1f} {r['body_bytes']:9.0f} "
              f"{r['cached']:7.1%}", flush=True)
    for delay_ms in (0, args.call_delay_ms):
        bare, warm_ = (next(r for r in results if r["case"] == f"warm mix, node {delay_ms} ms" and r["proxy"] == name)
                       for name in ("bare nginx", "nginx + rpcedge, cache warm"))
        print(f"node {delay_ms} ms per call: nginx + rpcedge / bare nginx: "
              f"{warm_['req_s'] / bare['req_s']:.2f}x req/s, {warm_['body_bytes'] / bare['body_bytes']:.2f}x the bytes",
              flush=True)
    return len(requests)


def warm_row(proxy, delay_ms, runs):
    return {**row(proxy, f"warm mix, node {delay_ms} ms", runs), "call_delay_ms": delay_ms,
            "body_bytes": statistics.median(r["body_bytes"] for r in runs),
            "cached": statistics.median(r["cached"] for r in runs)}


def print_rows(results):
    print(f"\n{'proxy':12} {'case':32} {'req/s':>9} {'CPU us/req':>11} {'ERROR':>7}")
    for r in results:
        fail_open = max(run["fail_open"] for run in r["runs"])
        print(f"{r['proxy']:12} {r['case']:32} {r['req_s']:9.0f} {r['cpu_us']:11.1f} {fail_open:7.2%}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--part", choices=PARTS, help="one part only (default: all)")
    parser.add_argument("--call-delay-ms", type=int, default=5, help="the slow node's time per call (warm mix)")
    args = parser.parse_args()
    started = provenance.now()

    proxy_cpu, prefix = pinned(WORK)
    print(f"proxy on CPU {proxy_cpu}", flush=True)

    # the warm mix's calls are kept in their networks' namespaces, where every block is final
    stack = cc.CacheStack(WORK, NETWORKS if args.part in (None, "warm") else [],
                          pinned=mix_calls()[1] if args.part in (None, "mix") else ())
    results, counted = [], {}
    try:
        for part, run in PARTS.items():
            if args.part in (None, part):
                counted[part] = run(stack, prefix, args, results)
    finally:
        stack.stop()
    if args.part is None:
        provenance.write(RESULTS, {"calls": counted, "seconds": args.seconds, "runs": args.runs,
                                   "proxy_cpu": proxy_cpu, "rows": results}, started)
        print(f"results: {RESULTS.relative_to(REPO)}")


PARTS = {"mix": mix, "big": big, "warm": warm}


if __name__ == "__main__":
    main()
