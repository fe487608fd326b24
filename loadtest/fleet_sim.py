"""`make fleet-sim`: the fleet tier with many hosts (issue 67). Each host, nginx with rpcedge
(every `--envoy-every`-th the native Envoy module instead) and its own cache daemon, has a loopback
address of its own (127.0.1.N); the Redis Cluster (three masters, a replica each) has its own
(127.0.2.N); one replay node, whose every recorded block is final, answers them all.

    .venv/bin/python loadtest/fleet_sim.py [--hosts 20] [--clients 16] [--herd-clients 200]

In turn, with the load spread over the hosts as a round-robin load balancer would:
- the load test's mix (1,000 requests, cacheable or not), `--clients` at a time: the node's
  requests per distinct cacheable call (the calls answered with a cache status other than
  BYPASS), every answer checked against the node's own;
- herds: `--herd-clients` clients at once for a block not yet stored, over every host: the node's
  requests per block;
- latency, one request at a time: a call a host has not been asked, stored by another (a fleet
  hit), then the same call at the same host again (a hit from its own daemon), p50 and p99;
- Redis's memory per entry (masters' used_memory over their keys; the replicas hold as much again);
- a master killed while the mix goes through the hosts again, each host asked what another was
  asked before: wrong answers (0 expected), and the node's requests against the keys the master
  held, whose slots had no master until its replica took over.

Latency between hosts (tc netem on loopback, by address) is not simulated: this machine's kernel
has no netem, and hosts that share one loopback connect from one source address, which a rule by
address pair cannot tell apart. The result says which held where it ran.
"""

import argparse
import collections
import concurrent.futures
import gzip
import http.client
import json
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

from testbed import cache_cases as cc
from testbed import provenance, scenarios
from testbed import replay_corpus as rc
from testbed.harness import CORPUS, REPO
from testbed.redis_cluster import RedisCluster
from testbed.stack import NETWORKS

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "fleet-sim"
RESULTS = LOADTEST / "results" / "fleet-sim.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/cache_cases.py",
            "testbed/redis_cluster.py"]
HOST_ADDRESS = "127.0.1.{}"
REDIS_ADDRESS = "127.0.2.{}"
FLEET_TIMEOUT = "200ms"
# the statuses of an answer the cache looked up; any other (BYPASS) went to the node as it came
LOOKED_UP = {"MISS", "HIT", "COALESCED"}


def latency_between_hosts():
    """Why the links between hosts carry no delay here: what `tc` says of netem in a namespace of
    its own (the machine's loopback is left alone)."""
    namespace = "rpcedge-netem-probe"
    if subprocess.run(["ip", "netns", "add", namespace], capture_output=True).returncode != 0:
        return "none: no network namespace could be made to ask tc (root and ip are needed)"
    try:
        probe = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True)
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    if probe.returncode != 0:
        return f"none: this kernel refuses netem ({probe.stderr.strip()})"
    return "none: the kernel has netem, but hosts sharing one loopback share one source address, so no rule by address pair"


class Fleet:
    """`hosts` hosts on one Redis Cluster, in front of one replay node."""

    def __init__(self, work, hosts, envoy_every):
        self.work = work
        self.cluster = RedisCluster(work / "cluster", masters=3, replicas=1,
                                    addresses=[REDIS_ADDRESS.format(n + 1) for n in range(6)])
        self.stack = None
        self.daemons, self.proxies = [], []
        try:
            self.stack = cc.CacheStack(work, NETWORKS)
            fleet = self.cluster.daemon_args(work, FLEET_TIMEOUT)
            for n in range(hosts):
                address = HOST_ADDRESS.format(n + 1)
                daemon = self.stack.another_daemon(f"db-{n + 1}", args=fleet, address=address)
                self.daemons.append(daemon)
                kind = "envoy-native" if envoy_every and n % envoy_every == envoy_every - 1 else "nginx"
                self.proxies.append(cc.start_proxy(kind, work / f"host-{n + 1}",
                                                   types.SimpleNamespace(replay=self.stack.replay, daemon=daemon),
                                                   address=address, cached_address=address))
        except BaseException:
            self.stop()
            raise

    def fleet_counters(self):
        """Every daemon's fleet counters, summed."""
        total = collections.Counter()
        for daemon in self.daemons:
            total.update({name: value for name, value in daemon.stats().items()
                          if name.startswith("fleet_") and isinstance(value, (int, float))})
        return total

    def stop(self):
        for proxy in self.proxies:
            proxy.stop()
        for daemon in self.daemons:
            daemon.process.stop()
        if self.stack:
            self.stack.stop()
        self.cluster.stop()


def ask(proxy, network, body, coding="gzip"):
    """One request on a fresh connection: (status, cache status, decoded body, seconds to the last
    byte)."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection(proxy.address, proxy.port, timeout=60)
    try:
        connection.request("POST", f"/{network}", body=body, headers={"Content-Type": "application/json",
                                                                       "Accept-Encoding": coding})
        response = connection.getresponse()
        data = response.read()
        took = time.perf_counter() - started
        if response.getheader("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        return response.status, response.getheader("X-Rpcedge-Cache") or "none", data, took
    finally:
        connection.close()


def call_key(request):
    return request.network, rc.request_key(json.loads(request.body))


def through_hosts(fleet, requests, expected, clients, shift, during=None):
    """Each request through host (its index + `shift`) mod hosts, `clients` at a time; `during`
    is called once a fifth of them are sent. (node requests, statuses, wrong answers, the calls
    asked of each host, the statuses of each call.)"""
    hosts = len(fleet.proxies)
    statuses, wrong, asked = collections.Counter(), [], collections.defaultdict(set)
    of_call = collections.defaultdict(collections.Counter)
    lock = threading.Lock()
    fired = threading.Event()

    def one(index):
        request = requests[index]
        if during and index >= len(requests) // 5 and not fired.is_set():
            with lock:
                if not fired.is_set():
                    during()
                    fired.set()
        host = (index + shift) % hosts
        status, cache, body, _ = ask(fleet.proxies[host], request.network, request.body.encode())
        right = status == 200 and json.loads(body) == expected[call_key(request)]
        with lock:
            statuses[cache] += 1
            asked[host].add(call_key(request))
            of_call[call_key(request)][cache] += 1
            if not right:
                wrong.append((host, request.network, request.body[:200], status, body[:200]))

    before = fleet.stack.node_requests()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(len(requests))))
    return fleet.stack.node_requests() - before, statuses, wrong, asked, of_call


def unanswered(counters):
    """Fleet rounds that did not answer (timed out, failed, or skipped by the open breaker): each
    sends its request to the node, as a daemon without the fleet would."""
    return sum(counters.get(f"fleet_{name}_total", 0) for name in ("timeouts", "errors", "skipped"))


def passed_by(statuses):
    """How many of the answers the cache did not look up: each went to the node."""
    return sum(count for status, count in statuses.items() if status not in LOOKED_UP)


def the_mix(fleet, requests, expected, clients):
    """The mix through the hosts: the node's requests per stored call. A request the cache passes
    by reaches the node each time, and so does a call the cache looks up but its store refuses
    (its block not final): the node's requests for those are each of their misses. Which calls
    were stored: each looked-up call asked once more through the first host, a HIT there (from
    its own daemon or the fleet). (The figures; the calls asked of each host; the calls stored;
    those refused.)"""
    counted = fleet.fleet_counters()
    node, statuses, wrong, asked, of_call = through_hosts(fleet, requests, expected, clients, shift=0)
    counted = {name: value for name, value in (fleet.fleet_counters() - counted).items()}
    looked_up = {key for key, seen in of_call.items() if LOOKED_UP & set(seen)}
    # a call looked up once and passed by once would blur both shares
    mixed = [key for key in looked_up if set(of_call[key]) - LOOKED_UP]
    time.sleep(1)  # what the hosts stored reaches the fleet from their queues
    first = {call_key(r): r for r in reversed(requests)}
    stored = set()
    for key in looked_up:
        request = first[key]
        asked[0].add(key)
        if ask(fleet.proxies[0], request.network, request.body.encode())[1] == "HIT":
            stored.add(key)
    refused = looked_up - stored
    passed, for_refused = passed_by(statuses), sum(of_call[key]["MISS"] for key in refused)
    for_stored = node - passed - for_refused
    return {"requests": len(requests), "statuses": dict(statuses), "wrong": len(wrong), "wrong_examples": wrong[:3],
            "node_requests": node, "bypassed": passed, "distinct_calls": len(of_call),
            "calls_both_bypassed_and_not": len(mixed), "stored_calls": len(stored), "refused_calls": len(refused),
            "node_requests_for_refused": for_refused, "node_requests_for_stored": for_stored,
            "node_requests_per_stored_call": for_stored / len(stored) if stored else None,
            "fleet_counters": counted, "fleet_rounds_unanswered": unanswered(counted),
            "stored_calls_missed_more_than_once": [dict(of_call[key]) for key in stored if of_call[key]["MISS"] > 1],
            }, asked, stored, refused


def herds(fleet, blocks, clients):
    """`clients` at once for each block, client n through host n mod hosts: the node's requests per
    block, the statuses, whether every answer was right."""
    rows = []
    for block in blocks:
        ready = threading.Barrier(clients)

        def one(id_):
            ready.wait()
            proxy = fleet.proxies[id_ % len(fleet.proxies)]
            status, cache, body, _ = ask(proxy, block.network, block.body(id_))
            return cache, status == 200 and body == block.answer(id_)

        before, counted = fleet.stack.node_requests(), fleet.fleet_counters()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            outcomes = list(pool.map(one, range(clients)))
        rows.append({"node_requests": fleet.stack.node_requests() - before,
                     "fleet_rounds_unanswered": unanswered(fleet.fleet_counters() - counted),
                     "statuses": dict(collections.Counter(cache for cache, _ in outcomes)),
                     "every_answer_right": all(right for _, right in outcomes)})
    return rows


def latencies(fleet, requests, asked, stored_calls, limit):
    """For up to `limit` stored calls, at a host never asked it: the first ask (a fleet hit) and
    the second (a hit from its own daemon), one at a time."""
    stored = {}
    for request in requests:
        if call_key(request) in stored_calls:
            stored.setdefault(call_key(request), request)
    hosts = len(fleet.proxies)
    fleet_hits, local_hits, statuses = [], [], collections.Counter()
    hits_before = fleet.fleet_counters()["fleet_hits_total"]
    for key, request in stored.items():
        host = next((h for h in range(hosts) if key not in asked[h]), None)
        if host is None:
            continue
        if len(fleet_hits) == limit:
            break
        asked[host].add(key)
        for times in (fleet_hits, local_hits):
            status, cache, _, took = ask(fleet.proxies[host], request.network, request.body.encode())
            statuses[f"{'fleet' if times is fleet_hits else 'local'} {cache}"] += 1
            if status == 200 and cache == "HIT":
                times.append(took * 1e3)
    return {"statuses": dict(statuses), "fleet_hits_counted": fleet.fleet_counters()["fleet_hits_total"] - hits_before,
            "fleet_hit_ms": spread(fleet_hits), "local_hit_ms": spread(local_hits)}


def spread(times):
    if not times:
        return None
    ordered = sorted(times)
    return {"count": len(ordered), "p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]}


def used_memory(cluster):
    used = {}
    for port in cluster.processes:
        info = cluster.cli(port, "info", "memory")
        used[port] = int(next(line for line in info.splitlines() if line.startswith("used_memory:")).split(":")[1])
    return used


def entries_on(cluster, port):
    """The entries a node holds (not the locks and answers of misses in flight)."""
    return int(cluster.cli(port, "eval", "return #redis.call('keys', 'rpcedge:*:e')", "0"))


def master_killed(fleet, requests, expected, clients, shift, refused):
    """The mix again, each request through a host that another was asked it through, while the
    master holding the most keys is killed a fifth of the way in; the node's requests besides
    those it gets whatever the fleet does (passed by, or `refused` by the store)."""
    killed = {}

    def kill():
        held = {port: entries_on(fleet.cluster, port) for port in fleet.cluster.masters()}
        port = max(held, key=held.get)
        killed.update(port=port, keys=held[port], at=time.monotonic())
        fleet.cluster.kill(port)

    counted = fleet.fleet_counters()
    node, statuses, wrong, _, of_call = through_hosts(fleet, requests, expected, clients, shift, during=kill)
    counted = fleet.fleet_counters() - counted
    besides = passed_by(statuses) + sum(of_call[key]["MISS"] for key in refused)
    ended = time.monotonic()
    fleet.cluster.wait_until_ok(timeout=60)
    return {"killed_master_keys": killed["keys"], "seconds_after_kill": ended - killed["at"],
            "statuses": dict(statuses), "wrong": len(wrong), "wrong_examples": wrong[:3],
            "node_requests": node, "node_requests_passed_by_or_refused": besides,
            "node_requests_for_stored": node - besides,
            "fleet_errors": counted["fleet_errors_total"], "fleet_timeouts": counted["fleet_timeouts_total"]}


def run(work, hosts, clients, herd_clients, herd_blocks, latency_calls, envoy_every):
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fleet = Fleet(work, hosts, envoy_every)
    try:
        requests = scenarios.mix_requests(fleet.stack.replay, CORPUS, list(scenarios.real_pairs(CORPUS)),
                                          random.Random(scenarios.SEED))
        expected = {}
        for request in requests:
            if call_key(request) not in expected:
                status, _, body = fleet.stack.replay.request("POST", f"/{request.network}", request.body.encode(),
                                                              {"Content-Type": "application/json"})
                expected[call_key(request)] = json.loads(body)
        used_before = used_memory(fleet.cluster)
        mix, asked, stored, refused = the_mix(fleet, requests, expected, clients)
        used_after = used_memory(fleet.cluster)
        masters = fleet.cluster.masters()
        entries = sum(entries_on(fleet.cluster, port) for port in masters)
        grown = sum(used_after[port] - used_before[port] for port in masters)
        mix_keys = {call_key(r) for r in requests}
        blocks = [b for b in cc.find_all(cc.block_by_hash, limit=herd_blocks + 50)
                  if b.network in NETWORKS and (b.network, rc.request_key(b.request)) not in mix_keys][:herd_blocks]
        out = {
            "hosts": hosts, "envoy_native_hosts": sum(p.host == "envoy-native" for p in fleet.proxies),
            "latency_between_hosts": latency_between_hosts(),
            "mix": mix,
            "memory": {"entries": entries, "used_memory_grown_on_masters": grown,
                       "bytes_per_entry": grown / entries if entries else None,
                       "replicas": "hold as much again"},
            "herds": {"clients": herd_clients, "blocks": herds(fleet, blocks, herd_clients)},
            "latency": latencies(fleet, requests, asked, stored, latency_calls),
        }
        out["master_killed"] = master_killed(fleet, requests, expected, clients, max(1, hosts // 2), refused)
        return out
    finally:
        fleet.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--envoy-every", type=int, default=5, help="every n-th host runs the native Envoy module")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--herd-clients", type=int, default=200)
    parser.add_argument("--herd-blocks", type=int, default=3)
    parser.add_argument("--latency-calls", type=int, default=300)
    args = parser.parse_args()
    started = provenance.now()
    results = run(WORK, args.hosts, args.clients, args.herd_clients, args.herd_blocks, args.latency_calls,
                  args.envoy_every)
    provenance.write(RESULTS, results, started)
    print(json.dumps(results, indent=1))
    print(f"results: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(main())
