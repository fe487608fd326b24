"""`make bench`, the fleet tier's part: Redis memory per entry of the corpus's answers, and what a
fleet hit costs against a local hit, on a real Redis Cluster (3 masters, no replicas: a replica
holds a copy, so a cluster with one replica per master needs twice the memory measured here).

    .venv/bin/python loadtest/fleet_bench.py [--entries 20000] [--hits 30000] [--runs 3]

Memory: one daemon writes `--entries` entries (the corpus's recorded results up to 1 MiB, each
under its own key, the tail plain as a host sends it; the daemon compacts each as it keeps it, with
its zstd and brotli forms, and writes it to the fleet without them) to the fleet; the masters'
`used_memory` before and after, over the entries written, is what one entry costs, with Redis's
own overhead per key and the value's seal (key, kind, expiry, MAC: 77 bytes), against the
smallest form the daemon keeps of each (deflate, zstd or br).

Hits: daemon A writes `--hits` entries; daemon B then looks them up in `--runs` rounds, each a
share of the keys looked up twice: the first lookup of each is a fleet hit (B asks the cluster,
checks the value and keeps it), the second a local hit. The CPU time of B and of every Redis
process over each pass, per lookup; 16 keep-alive connections at a time (a client thread each), as
a proxy's workers would keep them. A fleet hit happens once per key and daemon, too few times for
a proxy's CPU, so the proxy's share is measured in the same run on the cache benchmark's calls,
repeated, for gzip, zstd, br and identity clients in interleaved rounds: nginx in front of the
daemon that stored them (entries with their zstd and brotli forms: a local hit) and nginx in front
of a daemon that got them from the fleet (without them: a fleet hit's share), and nginx's hot tier
(wrk, 16 connections). Proxy, daemon and Redis together, round by round: nginx's CPU per hit plus
the daemon's and Redis's per fleet (or local) hit; a hot-tier hit is nginx's and its daemon's
(idle) alone.

Hosts: three nginx hosts, each with its own daemon, in front of one replay node whose every
recorded block is final. The load test's method mix (1,000 requests, cacheable or not) goes
through host A once, then through B, then through C, one request at a time; each host's statuses
(X-Rpcedge-Cache) and the node's requests during its pass, with the daemons on one fleet and
without one.
"""

import argparse
import collections
import concurrent.futures
import hashlib
import http.client
import json
import random
import shutil
import statistics
import sys
import time
import types
from contextlib import ExitStack
from pathlib import Path

import cache_bench
from bench import CLOCK_TICKS, cpu_seconds
from cached_bench import workload
from testbed.cache_entry import PLAIN, layout
from testbed import cache_cases as cc
from testbed import provenance, scenarios, wire
from testbed.harness import CORPUS, LOOPBACK, REPO, start_cached
from testbed.redis_cluster import RedisCluster
from testbed.stack import NETWORKS

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "fleet"
RESULTS = LOADTEST / "results" / "fleet.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/cache_cases.py",
            "testbed/redis_cluster.py", "testbed/wrk.py", "loadtest/wrk"]
# /proc counts CPU time in clock ticks (10 ms): a pass of the daemon's that used fewer than this
# many is measured no closer than 4 %, and one that used none has no figure at all
MIN_CPU_TICKS = 25
CONNECTIONS = 16
# the clients of each coding a hit goes out in
CODINGS = ("gzip", "zstd", "br", "identity")


def answers(limit):
    """The corpus's recorded results up to 1 MiB, as entries with the tail plain as a host sends
    them, `limit` of them (round again if fewer)."""
    found = workload(limit=None, smallest=0, form=PLAIN)
    return [found[n % len(found)] for n in range(limit)]


def form_lengths(entry):
    """An entry's tail: its length, and the lengths of its forms by name ("deflate", "zstd", "br";
    "plain" for a tail kept plain)."""
    parts = layout(entry)
    forms = {"deflate" if parts.form else "plain": parts.data, "zstd": parts.zstd, "br": parts.br}
    return parts.length, {name: len(form) for name, form in forms.items() if form}


def key(n, run):
    return hashlib.sha256(f"fleet bench {run} {n}".encode()).hexdigest()


def fleet_args(cluster):
    return cluster.daemon_args(WORK, "200ms")


def daemon(name, cluster):
    """A daemon on the fleet whose queue and store take every entry the benchmark writes."""
    return start_cached(WORK, WORK / name, name=name,
                        args=[*fleet_args(cluster), "--fleet-queue", "1GiB", "--max-disk", "8GiB"])


def used_memory(cluster):
    return sum(cluster.used_memory(port) for port in cluster.masters())


def wait_for_stores(cached, count, timeout=300):
    deadline = time.monotonic() + timeout
    while cached.stats()["fleet_stores_total"] < count:
        assert time.monotonic() < deadline, f"only {cached.stats()['fleet_stores_total']} of {count} stored"
        time.sleep(0.2)


def put_all(cached, entries, run):
    connection = http.client.HTTPConnection(LOOPBACK, cached.port, timeout=30)
    for n, body in enumerate(entries):
        connection.request("PUT", f"/v1/entries/{key(n, run)}", body)
        response = connection.getresponse()
        response.read()
        assert response.status == 204, response.status
    connection.close()


def memory(cluster, count):
    """Redis's memory per entry, against the smallest form the writer's store keeps of each entry
    (deflate, zstd or br: what the smallest hit a host sends is spliced from)."""
    entries = answers(count)
    writer = daemon("memory", cluster)
    try:
        before = used_memory(cluster)
        put_all(writer, entries, "memory")
        wait_for_stores(writer, count)
        after = used_memory(cluster)
        stats = writer.stats()
        kept = [form_lengths(body) for body in get_all(writer, [key(n, "memory") for n in range(count)])]
    finally:
        writer.process.stop()
    per_entry = (after - before) / count
    smallest = sum(min(forms.values()) for _, forms in kept) / count
    return {
        "entries": count,
        "answer_bytes_mean": sum(tail for tail, _ in kept) / count,
        "kept_form_bytes_mean": {name: sum(forms.get(name, 0) for _, forms in kept) / count
                                 for name in ("plain", "deflate", "zstd", "br")},
        "smallest_form_bytes_mean": smallest,
        "fleet_value_bytes_mean": stats["fleet_stored_bytes_total"] / count,
        "used_memory_bytes_per_entry": per_entry,
        "used_memory_to_smallest_form": per_entry / smallest,
        "used_memory_gib_per_million": per_entry * 1e6 / 2**30,
    }


def get_all(cached, keys):
    connection = http.client.HTTPConnection(LOOPBACK, cached.port, timeout=30)
    bodies = []
    for k in keys:
        connection.request("GET", f"/v1/entries/{k}")
        response = connection.getresponse()
        bodies.append(response.read())
        assert response.status == 200, response.status
    connection.close()
    return bodies


def lookups(cached, keys):
    """Looks each key up once, `CONNECTIONS` keep-alive connections at a time, as a proxy's
    workers would: (seconds, statuses)."""

    def look_up(part):
        connection = http.client.HTTPConnection(LOOPBACK, cached.port, timeout=30)
        statuses = []
        for k in part:
            connection.request("GET", f"/v1/entries/{k}")
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
        connection.close()
        return statuses

    parts = [keys[n::CONNECTIONS] for n in range(CONNECTIONS)]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONNECTIONS) as pool:
        statuses = [status for part in pool.map(look_up, parts) for status in part]
    return time.monotonic() - started, statuses


def hits(cluster, count, rounds):
    """Daemon B's and Redis's CPU per lookup of what daemon A wrote: in each of `rounds` rounds,
    a share of the keys looked up twice, the first a fleet hit (B asks the cluster, opens the
    value, keeps the entry), the second a local hit, side by side."""
    entries = answers(count)
    writer, reader = daemon("hits-a", cluster), daemon("hits-b", cluster)
    try:
        put_all(writer, entries, "hits")
        wait_for_stores(writer, count)
        keys = [key(n, "hits") for n in range(count)]
        redis_pids = [process.proc.pid for process in cluster.processes.values()]
        out, too_short = {"fleet_hit": {"runs": []}, "local_hit": {"runs": []}}, []
        for share in (keys[n::rounds] for n in range(rounds)):
            for name in ("fleet_hit", "local_hit"):
                cpu_before = cpu_seconds([reader.process.proc.pid]), cpu_seconds(redis_pids)
                elapsed, statuses = lookups(reader, share)
                cpu_after = cpu_seconds([reader.process.proc.pid]), cpu_seconds(redis_pids)
                assert statuses == [200] * len(share), f"{name}: {sorted(set(statuses))}"
                ticks = round((cpu_after[0] - cpu_before[0]) * CLOCK_TICKS)
                if ticks < MIN_CPU_TICKS:
                    wanted = -(-count * MIN_CPU_TICKS * 3 // (2 * max(ticks, 1)))
                    too_short.append(f"--hits {count} is too few to measure in {rounds} rounds: a round's "
                                     f"{name.replace('_', ' ')}s took {ticks} clock ticks of the daemon's CPU, "
                                     f"under the {MIN_CPU_TICKS} a figure needs; about --hits {wanted} would do")
                daemon_us = (cpu_after[0] - cpu_before[0]) / len(share) * 1e6
                redis_us = (cpu_after[1] - cpu_before[1]) / len(share) * 1e6
                out[name]["runs"].append({"lookups_per_s": len(share) / elapsed, "daemon_cpu_us": daemon_us,
                                          "redis_cpu_us": redis_us, "cpu_us": daemon_us + redis_us})
        for name in ("fleet_hit", "local_hit"):
            out[name]["cpu_us"] = statistics.median(run["cpu_us"] for run in out[name]["runs"])
        stats = reader.stats()
        assert stats["fleet_hits_total"] == count, stats["fleet_hits_total"]
        out["fleet_round_trip_us_mean"] = stats["fleet_round_trip_microseconds_total"] / stats["fleet_round_trips_total"]
        for message in dict.fromkeys(too_short):
            print(message, file=sys.stderr)
        if too_short:
            out["too_short"] = list(dict.fromkeys(too_short))
        return out
    finally:
        writer.process.stop()
        reader.process.stop()


def proxy_share(cluster, seconds, runs):
    """nginx's CPU per hit from its daemon, for each coding's clients, in interleaved rounds: in
    front of daemon A, which stored the calls and keeps them with their zstd and brotli forms (a
    local hit), and in front of daemon B, which got them from the fleet without those forms (the
    proxy's share of a fleet hit, and of B's local hits after it); and nginx's and A's together
    for a hit from nginx's hot tier (gzip)."""
    (WORK / "proxy").mkdir()
    calls, pins = cache_bench.mix_calls()
    stack = cc.CacheStack(WORK / "proxy", NETWORKS, pinned=pins, daemon_args=fleet_args(cluster))
    try:
        stack.finalize_late(cc.FINAL)
        rows = [("POST", c.path, len(c.answer(1)), c.body(1).decode()) for c in calls]
        hits = cache_bench.write_list(WORK / "proxy-hits.tsv", rows)
        b = stack.another_daemon("db-b")
        with ExitStack() as proxies:
            def nginx(name, cached, **options):
                return proxies.enter_context(cache_bench.running(cc.start_proxy(
                    "nginx", WORK / name, types.SimpleNamespace(replay=stack.replay, daemon=cached),
                    namespace=cache_bench.NAMESPACE, **options)))
            proxies.callback(b.process.stop)
            local = nginx("local", stack.daemon)
            cache_bench.store_all(local.port, calls)
            wait_for_stores(stack.daemon, len(calls))
            from_fleet = nginx("from-fleet", b)
            cache_bench.store_all(from_fleet.port, calls)
            assert b.stats()["fleet_hits_total"] == len(calls), b.stats()["fleet_hits_total"]
            hot = nginx("hot", stack.daemon, hot=cache_bench.HOT_BYTES)
            cells = {"hot_tier_hit": cache_bench.Cell(hot.pids + [stack.daemon.process.proc.pid], hot.port, hits,
                                                      "HIT")}
            for coding in CODINGS:
                cells[f"local_hit {coding}"] = cache_bench.Cell(local.pids, local.port, hits, "HIT", coding)
                cells[f"fleet_hit {coding}"] = cache_bench.Cell(from_fleet.pids, from_fleet.port, hits, "HIT", coding)
            measured = cache_bench.interleaved(cells, seconds, runs)
        return {case: cache_bench.row("nginx", case, runs) for case, runs in measured.items()}
    finally:
        stack.stop()


def together(hits_out, proxy_out):
    """Proxy, daemon and Redis per request, for each coding's clients: a fleet hit (nginx in front
    of the daemon that got the entry from the fleet, plus that daemon's and Redis's share of a
    fleet hit) against a local hit (nginx in front of the daemon that stored it, plus a local
    hit's share), round by round; and a hot-tier hit."""
    if "too_short" in hits_out:
        return {"too_short": hits_out["too_short"]}
    out = {"hot_tier_hit_cpu_us": proxy_out["hot_tier_hit"]["cpu_us"], "codings": {}}
    daemon = {name: [run["cpu_us"] for run in hits_out[name]["runs"]] for name in ("fleet_hit", "local_hit")}
    for coding in CODINGS:
        proxy = {name: [run["cpu_us"] for run in proxy_out[f"{name} {coding}"]["runs"]]
                 for name in ("fleet_hit", "local_hit")}
        if len(daemon["fleet_hit"]) != len(proxy["fleet_hit"]):
            raise ValueError(f"{len(daemon['fleet_hit'])} rounds of the daemon's, {len(proxy['fleet_hit'])} of nginx's")
        # the daemon's n-th round with nginx's n-th: each part's rounds interleaved, the two paired
        totals = {name: [p + d for p, d in zip(proxy[name], daemon[name])] for name in proxy}
        out["codings"][coding] = {
            "fleet_hit_cpu_us": statistics.median(totals["fleet_hit"]),
            "local_hit_cpu_us": statistics.median(totals["local_hit"]),
            "ratio_rounds": [f / local for f, local in zip(totals["fleet_hit"], totals["local_hit"])],
        }
    return out


def hosts(cluster):
    out = {}
    for mode, daemon_args in (("without the fleet", []), ("with the fleet", fleet_args(cluster))):
        directory = WORK / mode.replace(" ", "-")
        directory.mkdir()
        stack = cc.CacheStack(directory, NETWORKS, daemon_args=daemon_args)
        daemons = [stack.daemon, stack.another_daemon("db-b"), stack.another_daemon("db-c")]
        proxies = []
        try:
            requests = scenarios.mix_requests(stack.replay, CORPUS, list(scenarios.real_pairs(CORPUS)),
                                              random.Random(scenarios.SEED))
            for name, cached in zip("ABC", daemons):
                proxy = cc.start_proxy("nginx", directory / name, types.SimpleNamespace(replay=stack.replay, daemon=cached))
                proxies.append(proxy)
                before = stack.node_requests()
                statuses = collections.Counter()
                for request in requests:
                    response = wire.request(proxy.port, f"/{request.network}", "POST",
                                            {"Content-Type": "application/json"}, request.body.encode(),
                                            accept_encoding="gzip")
                    assert response.status == 200, response.status
                    statuses[response.header("x-rpcedge-cache") or "none"] += 1
                fleet = {k: v for k, v in cached.stats().items() if k.startswith("fleet_") and v}
                out.setdefault(mode, {})[name] = {"node_requests": stack.node_requests() - before,
                                                  "statuses": dict(statuses), "daemon_fleet_counters": fleet}
                # what A stored reaches the fleet from its queue before B asks
                time.sleep(1)
        finally:
            for proxy in proxies:
                proxy.stop()
            for cached in daemons[1:]:
                cached.process.stop()
            stack.stop()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--hits", type=int, default=30000,
                        help="entries looked up, each once as a fleet hit and once as a local hit, a share of them "
                        f"in each of --runs rounds; enough for each round's pass to take {MIN_CPU_TICKS} clock ticks "
                        "of the daemon's CPU (a local hit takes about 40 us)")
    parser.add_argument("--seconds", type=int, default=5, help="each wrk run of the proxy's share")
    parser.add_argument("--runs", type=int, default=3, help="rounds, of the hits and of the proxy's share")
    args = parser.parse_args()
    started = provenance.now()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    cluster = RedisCluster(WORK / "cluster", masters=3, replicas=0)
    try:
        results = {"memory": memory(cluster, args.entries), "hits": hits(cluster, args.hits, args.runs),
                   "proxy": proxy_share(cluster, args.seconds, args.runs), "hosts": hosts(cluster),
                   "date": time.strftime("%Y-%m-%d")}
        results["together"] = together(results["hits"], results["proxy"])
    finally:
        cluster.stop()
    provenance.write(RESULTS, results, started)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
