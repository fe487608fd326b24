"""The fleet tier through the hosts: three "hosts" on one machine (nginx, Envoy with the native
module, OpenResty), each with its own daemon and store, sharing one Redis Cluster of 3 masters
and 3 replicas, in front of one node (the replay, which counts what reaches it). What one host
stored is a hit through the others; a herd spread over the hosts reaches the node once; a master
killed under load fails over without a wrong answer; a stopped cluster costs the hosts nothing."""

import concurrent.futures
import threading
import time
import types

import pytest

from testbed import cache_cases as cc
from testbed.cache_cases import start_proxy
from testbed.redis_cluster import RedisCluster
from test_cache_hosts import post, status
from test_fleet import fleet_args

HOSTS = ("nginx", "envoy-native", "openresty")
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = RedisCluster(tmp_path_factory.mktemp("fleet-hosts-cluster"), users=[("rpcedge", "fleet-password")])
    yield cluster
    cluster.stop()


def kept_cases():
    """Calls whose answers every daemon keeps: blocks (and their receipts) by hash or by a final
    number, large ones first."""
    methods = ("eth_getBlockByHash", "eth_getBlockByNumber", "eth_getBlockReceipts")
    found = [case for case in cc.find_all(cc.immutable) if case.request["method"] in methods]
    return sorted(found, key=lambda case: -cc.size(case.response))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, cluster):
    """The node, three daemons on the cluster and a host in front of each: {host: proxy}, with
    `.daemons` and `.stack`."""
    directory = tmp_path_factory.mktemp("fleet-hosts")
    cases = kept_cases()
    args = fleet_args(directory, cluster)
    stack = cc.CacheStack(directory, [case.network for case in cases], daemon_args=args)
    daemons = [stack.daemon, stack.another_daemon("db-b"), stack.another_daemon("db-c")]
    proxies = {}
    for host, daemon in zip(HOSTS, daemons):
        own = types.SimpleNamespace(replay=stack.replay, daemon=daemon)
        proxies[host] = start_proxy(host, directory / host, own)
    yield types.SimpleNamespace(proxies=proxies, daemons=dict(zip(HOSTS, daemons)), stack=stack, cases=cases)
    for proxy in proxies.values():
        proxy.stop()
    for daemon in daemons[1:]:
        daemon.process.stop()
    stack.stop()


def fleet_has(cluster, count, timeout=5):
    deadline = time.monotonic() + timeout
    while len(cluster.keys("rpcedge:*:e")) < count:
        assert time.monotonic() < deadline, "the entries never reached the fleet"
        time.sleep(0.02)


def test_an_answer_stored_through_one_host_is_a_hit_through_the_others_with_their_own_ids(fleet, cluster):
    block = fleet.cases[0]
    before = fleet.stack.node_requests()
    miss = post(fleet.proxies["nginx"].port, block, id_="a")
    assert (status(miss), miss.decoded()) == ("MISS", block.answer("a"))
    fleet_has(cluster, 1)
    for host, id_ in (("envoy-native", "b"), ("openresty", 3)):
        hit = post(fleet.proxies[host].port, block, id_=id_)
        assert (status(hit), hit.decoded()) == ("HIT", block.answer(id_)), host
    assert fleet.stack.node_requests() == before + 1, "B and C never asked the node"
    assert all(fleet.daemons[host].stats()["fleet_hits_total"] >= 1 for host in ("envoy-native", "openresty"))


def test_a_herd_spread_over_the_hosts_sends_the_node_one_request(fleet):
    block = fleet.cases[1]
    clients = [(host, n) for host in HOSTS for n in range(50)]
    ready = threading.Barrier(len(clients))

    def ask(client):
        host, n = client
        ready.wait()
        return post(fleet.proxies[host].port, block, id_=f"{host}-{n}")

    before = fleet.stack.node_requests()
    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        responses = list(pool.map(ask, clients))
    for (host, n), response in zip(clients, responses):
        assert response.status == 200 and response.decoded() == block.answer(f"{host}-{n}"), (host, status(response))
    assert fleet.stack.node_requests() == before + 1, sorted(status(r) for r in responses)


def fleet_answers_again(fleet, cases, writer, reader):
    """Until a case stored through `writer` is a hit through `reader`, which never asked for it
    before: the fleet answers. A new case each time: a write the fleet missed is not made again."""
    for case in cases:
        post(fleet.proxies[writer].port, case, id_=1)
        time.sleep(0.5)
        if status(post(fleet.proxies[reader].port, case, id_=2)) == "HIT":
            return
    pytest.fail(f"the fleet never answered again in {len(cases)} tries")


def load(fleet, cases, stop, seen):
    """Asks every host for `cases` in turn until `stop`: every answer must be the node's."""
    n = 0
    while not stop.is_set():
        for host, proxy in fleet.proxies.items():
            block = cases[n % len(cases)]
            started = time.monotonic()
            response = post(proxy.port, block, id_=n)
            seen.append((time.monotonic() - started, status(response), response.status == 200
                         and response.decoded() == block.answer(n)))
            n += 1


def under_load(fleet, cases, during):
    """What `load` saw of `cases` while `during()` ran. Should the load itself fail (a reset, a
    timeout), so does the test: a bare thread's exception would only be a warning."""
    stop, seen = threading.Event(), []
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load, fleet, cases, stop, seen)
        try:
            during()
        finally:
            stop.set()
        loading.result(timeout=60)
    return seen


def test_a_master_killed_under_load_fails_over_and_every_answer_stays_right(fleet, cluster):
    def kill_a_master():
        time.sleep(1)
        cluster.kill(cluster.masters()[0])
        # a replica takes over once the node timeout (1 s) has passed
        time.sleep(1)
        cluster.wait_until_ok(timeout=30)
        time.sleep(1)

    seen = under_load(fleet, fleet.cases[20:35], kill_a_master)
    assert seen and all(right for _, _, right in seen), "every answer is the node's"
    assert "ERROR" not in {s for _, s, _ in seen}, sorted(seen, reverse=True)[:5]
    fleet_answers_again(fleet, fleet.cases[2:10], "openresty", "nginx")


def test_a_stopped_cluster_costs_the_hosts_nothing_and_its_return_is_picked_up(fleet, cluster):
    cluster.stop_all()
    seen = under_load(fleet, fleet.cases[35:50], lambda: time.sleep(3))
    assert seen and all(right for _, _, right in seen)
    # no lookup waited for the hosts' lookup timeout (1 s), which would show as ERROR
    assert "ERROR" not in {s for _, s, _ in seen}, sorted(seen, reverse=True)[:5]
    print(f"cluster stopped: {len(seen)} requests, the slowest {max(t for t, _, _ in seen) * 1000:.0f} ms")
    stats = [daemon.stats() for daemon in fleet.daemons.values()]
    assert all(s["fleet_breaker_opened_total"] >= 1 and s["fleet_skipped_total"] > 0 for s in stats), stats
    cluster.start_all()
    fleet_answers_again(fleet, fleet.cases[10:20], "nginx", "envoy-native")
