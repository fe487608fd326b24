"""`make fleet-sim`: the fleet tier with many hosts (issue 67). Each host, nginx with rpcedge
(every `--envoy-every`-th the native Envoy module instead) and its own cache daemon, has a loopback
address of its own (127.0.1.N); the Redis Cluster (three masters, a replica each) has its own
(127.0.2.N); one replay node, whose every recorded block is final, answers them all. One more
nginx host on the fleet, outside the round-robin, only asks which calls were stored.

    .venv/bin/python loadtest/fleet_sim.py [--hosts 20] [--clients 16] [--herd-clients 200]

In turn, with the load spread over the hosts as a round-robin load balancer would:
- herds: `--herd-clients` clients at once for a block not yet stored (by hash or number, or its
  receipts), over every host: the node's requests per block;
- the load test's mix (1,000 requests, cacheable or not), `--clients` at a time: the node's
  requests per call a store kept (the herds' blocks, which it asks too, already were), every
  answer checked against the node's own. A request the cache passes by (BYPASS, or no lookup at
  all) reaches the node each time, and so does each miss of a call the stores refuse (its block
  not final); which calls were stored, the probe host says once the hosts' write queues are empty
  (a HIT there, from the fleet or, where the fleet did not answer, its own store after a second
  ask);
- latency, one request at a time: a stored call at a host never asked it (a fleet hit), then the
  same call there again (a hit from its own daemon), p50 and p99, the hosts taken in turn;
- Redis's memory per entry: each entry's as Redis counts it (MEMORY USAGE), beside its value's
  bytes (a replica holds the same again);
- a master killed while the mix goes through the hosts twice more, each request through a host
  other than the one asked it before: wrong answers (0 expected), how long the cluster took to
  let a replica take over, and the stored calls the node was asked for (each counted once, and
  its requests) against the entries the master held, whose slots had no master until then.

Latency between hosts (tc netem on loopback, by address) is not simulated: where this was
written the kernel has no netem, and hosts that share one loopback connect from one source
address, which a rule by address pair cannot tell apart. The result says what held where it ran.
"""

import argparse
import collections
import concurrent.futures
import gzip
import http.client
import json
import os
import random
import shutil
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
            "testbed/redis_cluster.py", "testbed/scenarios.py", "testbed/harness.py", "testbed/nginx_harness.py",
            "testbed/envoy_harness.py"]
HOST_ADDRESS = "127.0.1.{}"
REDIS_ADDRESS = "127.0.2.{}"
FLEET_TIMEOUT = "200ms"
# the sim never moves finality: its daemons need not ask for it ten times a second
FINALITY_POLL = "5s"
# an answer's statuses: looked up in the cache, and passed by it; any other (ERROR, EXPIRED, none)
# went to the node without the cache as well
LOOKED_UP = {"MISS", "HIT", "COALESCED"}
BYPASS = "BYPASS"


def latency_between_hosts():
    """Why the links between hosts carry no delay: what `tc` says of netem in a network namespace
    made for the question (the machine's own loopback is left alone)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return "none: asking tc for netem needs root, ip and tc"
    namespace = f"rpcedge-netem-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", namespace], capture_output=True).returncode != 0:
        return "none: no network namespace could be made to ask tc"
    try:
        probe = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True)
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    if probe.returncode != 0:
        return f"none: this kernel refuses netem ({probe.stderr.strip()})"
    return "none: the kernel has netem, but hosts sharing one loopback share one source address, so no rule by address pair"


class Fleet:
    """`hosts` hosts and the probe host on one Redis Cluster, in front of one replay node."""

    def __init__(self, work, hosts, envoy_every):
        self.cluster = RedisCluster(work / "cluster", masters=3, replicas=1,
                                    addresses=[REDIS_ADDRESS.format(n + 1) for n in range(6)])
        self.stack, self.probe = None, None
        self.daemons, self.proxies = [], []
        try:
            self.stack = cc.CacheStack(work, NETWORKS, finality_poll=FINALITY_POLL)
            for n in range(hosts + 1):
                kind = "envoy-native" if envoy_every and n < hosts and n % envoy_every == envoy_every - 1 else "nginx"
                self.start_host(work, n, kind)
        except BaseException:
            self.stop()
            raise
        # the last host started asks which calls were stored, outside the round-robin
        self.probe = self.proxies.pop()

    def start_host(self, work, n, kind):
        address = HOST_ADDRESS.format(n + 1)
        daemon = self.stack.another_daemon(f"db-{n + 1}", args=self.cluster.daemon_args(work, FLEET_TIMEOUT),
                                           address=address)
        self.daemons.append(daemon)
        self.proxies.append(cc.start_proxy(kind, work / f"host-{n + 1}",
                                           types.SimpleNamespace(replay=self.stack.replay, daemon=daemon),
                                           address=address, cached_address=address))

    def fleet_counters(self):
        """Every daemon's fleet counters (not its gauges), summed."""
        total = collections.Counter()
        for daemon in self.daemons:
            total.update({name: value for name, value in daemon.stats().items()
                          if name.startswith("fleet_") and "_total" in name})
        return total

    def drain(self, timeout=60):
        """Until every daemon's fleet write queue is empty."""
        deadline = time.monotonic() + timeout
        while any(daemon.stats().get("fleet_queue_bytes", 0) for daemon in self.daemons):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet's write queues did not empty in {timeout} s")
            time.sleep(0.2)

    def stop(self):
        for proxy in [*self.proxies, *filter(None, [self.probe])]:
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


class Pass:
    """What a pass of requests through the hosts saw: the node's requests, each answer's status,
    the wrong answers, which calls each host was asked, and each call's statuses."""

    def __init__(self):
        self.node_requests = 0
        self.statuses = collections.Counter()
        self.wrong = []
        self.asked = collections.defaultdict(set)
        self.of_call = collections.defaultdict(collections.Counter)

    def went_to_node_anyway(self, refused=()):
        """Answers that reached the node whatever the fleet did: not looked up, or misses of calls
        the stores refuse."""
        return (sum(n for status, n in self.statuses.items() if status not in LOOKED_UP)
                + sum(self.of_call[key]["MISS"] for key in refused))


def through_hosts(fleet, requests, expected, clients, route, before=None):
    """Each request (n, request) through host `route(n)`, `clients` at a time; `before` is called
    once, just before the request a fifth of the way in is sent."""
    seen, lock = Pass(), threading.Lock()

    def one(index):
        request = requests[index]
        if before and index == len(requests) // 5:
            before()
        host = route(index)
        status, cache, body, _ = ask(fleet.proxies[host], request.network, request.body.encode())
        right = status == 200 and json.loads(body) == expected[call_key(request)]
        with lock:
            seen.statuses[cache] += 1
            seen.asked[host].add(call_key(request))
            seen.of_call[call_key(request)][cache] += 1
            if not right:
                seen.wrong.append([host, request.network, request.body[:200], status, body[:200].decode(errors="replace")])

    node_before = fleet.stack.node_requests()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(len(requests))))
    seen.node_requests = fleet.stack.node_requests() - node_before
    return seen


def stored_by_the_fleet(fleet, requests, keys):
    """Of `keys`, the calls the fleet (or the probe host's own store, where the fleet did not
    answer the first ask) holds: a HIT at the probe host, within two asks."""
    fleet.drain()
    first = {call_key(r): r for r in reversed(requests)}
    stored = set()
    for key in keys:
        request = first[key]
        for _ in range(2):
            if ask(fleet.probe, request.network, request.body.encode())[1] == "HIT":
                stored.add(key)
                break
    return stored


def the_mix(fleet, requests, expected, clients, stored_before):
    """The mix round-robin over the hosts: the node's requests per call it stored (not those of
    `stored_before`, the herds'). (The figures; the pass; the calls stored; the calls refused.)"""
    counted = fleet.fleet_counters()
    seen = through_hosts(fleet, requests, expected, clients, route=lambda n: n % len(fleet.proxies))
    counted = fleet.fleet_counters() - counted
    looked_up = {key for key, statuses in seen.of_call.items() if LOOKED_UP & set(statuses)}
    # a call both looked up and passed by would blur the two shares
    both = [key for key in looked_up if BYPASS in seen.of_call[key]]
    stored = stored_by_the_fleet(fleet, requests, looked_up - stored_before)
    refused = looked_up - stored_before - stored
    anyway = seen.went_to_node_anyway(refused)
    for_stored = seen.node_requests - anyway
    return {"requests": len(requests), "statuses": dict(seen.statuses), "wrong": len(seen.wrong),
            "calls_stored_before": len(looked_up & stored_before),
            "wrong_examples": seen.wrong[:3], "node_requests": seen.node_requests,
            "node_requests_not_looked_up_or_refused": anyway, "distinct_calls": len(seen.of_call),
            "calls_both_bypassed_and_looked_up": len(both), "stored_calls": len(stored),
            "refused_calls": len(refused), "node_requests_for_stored": for_stored,
            "node_requests_per_stored_call": for_stored / len(stored) if stored else None,
            "fleet_counters": dict(counted), "fleet_rounds_unanswered": unanswered(counted),
            "stored_calls_missed_twice": [[*key, dict(seen.of_call[key])] for key in stored
                                          if seen.of_call[key]["MISS"] > 1],
            }, seen, stored, refused


def unanswered(counters):
    """Fleet rounds that did not answer (timed out, failed, or skipped by the open breaker): each
    sends its request to the node, as a daemon without the fleet would."""
    return sum(counters.get(f"fleet_{name}_total", 0) for name in ("timeouts", "errors", "skipped"))


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
    """For up to `limit` stored calls, each at a host never asked it (the hosts taken in turn):
    the first ask, a fleet hit, and the second, a hit from that host's own daemon, one at a
    time; a pair counts where both were HITs."""
    first = {}
    for request in requests:
        if call_key(request) in stored_calls:
            first.setdefault(call_key(request), request)
    hosts = len(fleet.proxies)
    fleet_hits, local_hits, statuses = [], [], collections.Counter()
    hits_before = fleet.fleet_counters()["fleet_hits_total"]
    turn, measured_at = 0, set()
    for key, request in first.items():
        if len(fleet_hits) == limit:
            break
        host = next((h % hosts for h in range(turn, turn + hosts) if key not in asked[h % hosts]), None)
        if host is None:
            continue
        turn = host + 1
        _, from_fleet, _, fleet_took = ask(fleet.proxies[host], request.network, request.body.encode())
        _, from_store, _, store_took = ask(fleet.proxies[host], request.network, request.body.encode())
        statuses[f"{from_fleet}, then {from_store}"] += 1
        if from_fleet == from_store == "HIT":
            fleet_hits.append(fleet_took * 1e3)
            local_hits.append(store_took * 1e3)
            measured_at.add(host)
    return {"statuses": dict(statuses), "pairs": len(fleet_hits),
            "fleet_hits_counted": fleet.fleet_counters()["fleet_hits_total"] - hits_before,
            "hosts_measured": len(measured_at),
            "fleet_hit_ms": spread(fleet_hits), "local_hit_ms": spread(local_hits)}


def spread(times):
    if not times:
        return None
    ordered = sorted(times)
    return {"count": len(ordered), "p50": ordered[len(ordered) // 2],
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]}


def entries_on(cluster, port):
    """The entries a node holds (not the locks and answers of misses in flight)."""
    return int(cluster.cli(port, "eval", "return #redis.call('keys', 'rpcedge:*:e')", "0"))


def summed_over_entries(cluster, port, command):
    """`command` (a Redis command that takes a key and answers a number) summed over the entries
    a node holds."""
    script = (f"local n = 0 for _, k in ipairs(redis.call('keys', 'rpcedge:*:e')) do "
              f"n = n + redis.call({command}, k) end return n")
    return int(cluster.cli(port, "eval", script, "0"))


def memory(fleet, used_before):
    """Redis's memory per entry, as Redis counts each key's (MEMORY USAGE), beside the values'
    bytes; and the masters' and the replicas' used_memory grown since `used_before`, over the
    entries, which with a few hundred entries counts the connections' buffers as much."""
    used = {port: fleet.cluster.used_memory(port) for port in fleet.cluster.processes}
    masters = fleet.cluster.masters()
    entries = sum(entries_on(fleet.cluster, port) for port in masters)
    values = sum(summed_over_entries(fleet.cluster, port, "'strlen'") for port in masters)
    usage = sum(summed_over_entries(fleet.cluster, port, "'memory', 'usage'") for port in masters)
    grown = {role: sum(used[port] - used_before[port] for port in ports) for role, ports in
             (("masters", masters), ("replicas", [p for p in fleet.cluster.processes if p not in masters]))}
    other_keys = sum(int(fleet.cluster.cli(port, "dbsize")) for port in masters) - entries
    return {"entries": entries, "other_keys": other_keys, "used_memory_grown": grown,
            "bytes_per_entry": usage / entries if entries else None,
            "value_bytes_per_entry": values / entries if entries else None,
            "used_memory_grown_per_entry": grown["masters"] / entries if entries else None,
            "replica_used_memory_grown_per_entry": grown["replicas"] / entries if entries else None}


def master_killed(fleet, requests, expected, clients, refused):
    """The mix twice more, request n through host (n + 1) mod hosts on the first pass and (n + 2)
    on the second (not the host the first mix sent it to), while the master holding the most
    entries is killed a fifth of the way in; how long the cluster took to be whole again."""
    held = {port: entries_on(fleet.cluster, port) for port in fleet.cluster.masters()}
    port = max(held, key=held.get)
    survivor = next(p for p in fleet.cluster.processes if p != port)
    killed = {}

    def watch():
        # the cluster says it lost the master's slots once its nodes agree the master failed,
        # and is whole again once a replica holds them
        def whole():
            return fleet.cluster.whole(survivor)
        while whole():
            if time.monotonic() - killed["at"] > 10:
                return  # never seen failed: a replica took over between two looks
            time.sleep(0.05)
        killed["failed_after_s"] = time.monotonic() - killed["at"]
        while not whole():
            if time.monotonic() - killed["at"] > 60:
                return
            time.sleep(0.05)
        killed["whole_after_s"] = time.monotonic() - killed["at"]

    watcher = threading.Thread(target=watch, daemon=True)

    def kill():
        killed["at"] = time.monotonic()
        fleet.cluster.kill(port)
        watcher.start()

    hosts, length = len(fleet.proxies), len(requests)
    twice = requests * 2
    counted = fleet.fleet_counters()
    # request m of pass p (0 or 1) goes to host m + 1 + p, where the first mix sent it to host m
    seen = through_hosts(fleet, twice, expected, clients, route=lambda n: (n % length + 1 + n // length) % hosts,
                         before=kill)
    ended = time.monotonic()
    counted = fleet.fleet_counters() - counted
    watcher.join()
    fleet.cluster.wait_until_ok(timeout=60)
    anyway = seen.went_to_node_anyway(refused)
    # a MISS of a call the stores keep is the host asking the node for it
    asked_of_node = [key for key, statuses in seen.of_call.items() if statuses["MISS"] and key not in refused]
    return {"killed_master_entries": held[port], "mix_ran_after_kill_s": ended - killed["at"],
            "cluster_failed_after_s": killed.get("failed_after_s"),
            "cluster_whole_after_s": killed.get("whole_after_s"), "requests": len(twice),
            "statuses": dict(seen.statuses), "wrong": len(seen.wrong), "wrong_examples": seen.wrong[:3],
            "node_requests": seen.node_requests, "node_requests_not_looked_up_or_refused": anyway,
            "node_requests_for_stored": seen.node_requests - anyway, "stored_calls_asked_of_node": len(asked_of_node),
            "fleet_counters": dict(counted)}


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
                _, _, body = fleet.stack.replay.request("POST", f"/{request.network}", request.body.encode(),
                                                        {"Content-Type": "application/json"})
                expected[call_key(request)] = json.loads(body)
        # blocks (by hash or number, or their receipts), asked before anything is stored; the mix
        # asks for every block call the corpus has, and finds these stored
        blocks = [call for call in cc.find_all(cc.immutable) if call.method.startswith("eth_getBlock")
                  and call.network in NETWORKS][:herd_blocks]
        if len(blocks) < herd_blocks:
            raise RuntimeError(f"the corpus has {len(blocks)} block calls; {herd_blocks} are needed")
        herded = {(call.network, rc.request_key(call.request)) for call in blocks}
        used_before = {port: fleet.cluster.used_memory(port) for port in fleet.cluster.processes}
        out = {"hosts": hosts, "envoy_native_hosts": sum(p.host == "envoy-native" for p in fleet.proxies),
               "latency_between_hosts": latency_between_hosts(),
               "herds": {"clients": herd_clients, "blocks": herds(fleet, blocks, herd_clients)}}
        out["mix"], seen, stored, refused = the_mix(fleet, requests, expected, clients, herded)
        out["memory"] = memory(fleet, used_before)
        out["latency"] = latencies(fleet, requests, seen.asked, stored, latency_calls)
        out["master_killed"] = master_killed(fleet, requests, expected, clients, refused)
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
