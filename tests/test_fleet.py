"""The fleet tier on its own: daemons (rpcedge-cached, each with its own store) sharing a real Redis
Cluster (3 masters, 3 replicas, an ACL user; and one with TLS): what one stores the others hit,
every fleet value has a TTL, nothing planted in the cluster is served, a miss held by one daemon
is followed by the others, and a refused login stops the daemon at start. Through the hosts:
test_fleet_hosts.py."""

import glob
import hashlib
import os
import signal
import threading
import time

import pytest

from testbed.cache_entry import cache_entry, layout
from testbed.harness import StartError, start_cached
from testbed.redis_cluster import RedisCluster
from test_cached import key, looked, put

USER, PASSWORD = "rpcedge", "fleet-password"
FLEET_TTL_S = 3600
# generous: a test's cluster, daemons and client share two CPUs
FLEET_TIMEOUT = "300ms"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = RedisCluster(tmp_path_factory.mktemp("fleet-cluster"), users=[(USER, PASSWORD)])
    yield cluster
    cluster.stop()


def fleet_args(directory, cluster, password=None, extra=()):
    return cluster.daemon_args(directory, FLEET_TIMEOUT, password, ["--fleet-ttl", f"{FLEET_TTL_S}s", *extra])


@pytest.fixture
def daemons(tmp_path, cluster):
    """Starts daemons on the module's cluster, each with its own store; stopped after the test."""
    started = []

    def start(count=2, extra=(), on=cluster):
        for _ in range(count):
            name = f"daemon-{len(started)}"
            started.append(start_cached(tmp_path, tmp_path / name, args=fleet_args(tmp_path, on, extra=extra),
                                        name=name))
        return started[-count:]

    yield start
    for daemon in started:
        daemon.process.stop()


def in_fleet(cluster, k, suffix="e", timeout=5):
    """Waits until the fleet holds `k`'s value: written from a queue, behind the store."""
    deadline = time.monotonic() + timeout
    name = f"rpcedge:{{{k}}}:{suffix}"
    while cluster.command("EXISTS", name) != 1:
        assert time.monotonic() < deadline, f"{name} never reached the fleet"
        time.sleep(0.02)
    return name


def test_an_entry_stored_through_one_daemon_is_a_hit_through_another_and_kept_there(daemons, cluster):
    a, b = daemons(2)
    kept, expiring = key("fleet kept"), key("fleet expiring")
    assert put(a, kept, cache_entry(b'{"kept":true}}'))[0] == 204
    assert put(a, expiring, cache_entry(b'"0x10"}'), {"X-Rpcedge-Ttl": "30"})[0] == 204
    stored = a.request("GET", f"/v1/entries/{kept}")[2]
    # every fleet value expires: the fleet's TTL, or the entry's own when shorter
    assert 0 < cluster.command("PTTL", in_fleet(cluster, kept)) <= FLEET_TTL_S * 1000
    assert 0 < cluster.command("PTTL", in_fleet(cluster, expiring)) <= 30_000
    status, headers, body = b.request("GET", f"/v1/entries/{kept}")
    assert (status, body, headers["X-Rpcedge-Ttl"]) == (200, stored, None), "the entry as A keeps it, no expiry"
    status, headers, _ = b.request("GET", f"/v1/entries/{expiring}")
    assert status == 200 and 0 < int(headers["X-Rpcedge-Ttl"]) <= 30
    assert b.stats()["fleet_hits_total"] == 2
    # B keeps what the fleet gave: the next lookup is B's own hit, even with the fleet emptied
    cluster.command("DEL", f"rpcedge:{{{kept}}}:e")
    assert b.request("GET", f"/v1/entries/{kept}")[2] == stored
    stats = b.stats()
    assert (stats["fleet_hits_total"], stats["hits_total"]) == (2, 1)
    assert a.stats()["fleet_stores_total"] == 2
    # a batch's local misses go to the fleet, and what it has is a hit
    batch = [key("fleet batch 1"), key("fleet batch 2"), key("fleet absent")]
    for k in batch[:2]:
        assert put(a, k, cache_entry(b'"batch"}'))[0] == 204
        in_fleet(cluster, k)
    status, _, body = b.request("POST", "/v1/lookup", "\n".join(batch).encode())
    assert status == 200 and [outcome for outcome, _, _ in looked(body)] == ["hit", "hit", "absent"]


def forms_bytes(entry):
    """The bytes of an entry's zstd and brotli forms."""
    parts = layout(entry)
    return len(parts.zstd) + len(parts.br)


def without_forms(entry):
    """An entry's parts but its zstd and brotli forms: envelope, head and tail."""
    parts = layout(entry)
    return parts.before_id + parts.after_id + parts.head + parts.data


def test_the_fleet_carries_an_entry_without_the_zstd_and_brotli_forms_its_store_adds(daemons, cluster):
    a, b = daemons(2)
    k = key("fleet forms")
    hashes = ",".join(f'"0x{hashlib.sha256(str(i).encode()).hexdigest()}"' for i in range(300))
    assert put(a, k, cache_entry(f'{{"number":"0x10","transactions":[{hashes}]}}}}'.encode()))[0] == 204
    stored = a.request("GET", f"/v1/entries/{k}")[2]
    assert stored[1] == 2 and forms_bytes(stored) > 0, "A keeps its tail deflated, and its zstd and brotli forms"
    value = cluster.command("GET", in_fleet(cluster, k))
    status, _, carried = b.request("GET", f"/v1/entries/{k}")
    assert status == 200 and forms_bytes(carried) == 0
    # the same entry but for the forms: its fields, envelope, head and DEFLATE stream byte for byte
    assert (carried[1:22], without_forms(carried)) == (stored[1:22], without_forms(stored))
    assert len(value) < len(stored), f"Redis holds {len(value)} bytes of an entry A keeps in {len(stored)}"
    # counted once the write's reply is in, which may be after the key is there
    deadline = time.monotonic() + 5
    while a.stats()["fleet_stored_bytes_total"] != len(value):
        assert time.monotonic() < deadline, (a.stats()["fleet_stored_bytes_total"], len(value))
        time.sleep(0.02)


# Debian's libfaketime, preloaded: the daemon's wall clock set off by an offset, its monotonic clock
# left alone (tokio's timers run on it). Not its `faketime` command, which runs the daemon as a
# child of its own: stopping the command left the daemon running.
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


def clock_set_off(offset):
    assert LIBFAKETIME, "no libfaketime: make deps installs Debian's faketime"
    return ["env", f"LD_PRELOAD={LIBFAKETIME}", f"FAKETIME={offset}", "FAKETIME_DONT_FAKE_MONOTONIC=1"]


@pytest.mark.parametrize("offset", ["+5m", "-5m"])
def test_an_entry_from_a_host_whose_clock_is_off_is_kept_for_its_ttl_and_not_refused(tmp_path, cluster, offset):
    """A host's clock 5 minutes off its writer's (--fleet-clock-skew's default): an entry with a
    3 s TTL is a hit there, and gone there once the 3 s have passed."""
    writer = start_cached(tmp_path, tmp_path / "writer", args=fleet_args(tmp_path, cluster), name="writer")
    reader = start_cached(tmp_path, tmp_path / "reader", args=fleet_args(tmp_path, cluster), name="reader",
                          argv_prefix=clock_set_off(offset))
    try:
        k = key(f"clock off {offset}")
        assert put(writer, k, cache_entry(b'"0x1"}'), {"X-Rpcedge-Ttl": "3"})[0] == 204
        in_fleet(cluster, k)
        status, headers, _ = reader.request("GET", f"/v1/entries/{k}")
        assert status == 200, f"refused: {reader.stats()['fleet_expired_total']} expired"
        assert 0 < int(headers["X-Rpcedge-Ttl"]) <= 3
        time.sleep(3.5)
        assert reader.request("GET", f"/v1/entries/{k}")[0] == 404, "served past its TTL"
    finally:
        writer.process.stop()
        reader.process.stop()


def test_values_planted_in_the_cluster_are_never_served(daemons, cluster):
    a, b = daemons(2)
    donor = key("fleet donor")
    assert put(a, donor, cache_entry(b'{"donor":1}}'))[0] == 204
    donor_value = cluster.command("GET", in_fleet(cluster, donor))
    plants = {
        "key": donor_value,  # a valid value, of another key
        "mac": donor_value[:-1] + bytes([donor_value[-1] ^ 1]),
        "mac ": donor_value[:-10],  # cut: its MAC is not where it was
        "format": b"garbage",
    }
    for n, (reason, value) in enumerate(plants.items()):
        k = key(f"fleet planted {n}")
        cluster.command("SET", f"rpcedge:{{{k}}}:e", value, "PX", 60_000)
        status, headers, _ = b.request("GET", f"/v1/entries/{k}")
        assert (status, headers["X-Rpcedge-Miss"]) == (404, "absent"), reason
    stats = b.stats()
    refused = {reason: stats[f'fleet_refused_total{{reason="{reason}"}}'] for reason in ("key", "mac", "format")}
    assert refused == {"key": 1, "mac": 2, "format": 1}
    assert stats["fleet_hits_total"] == 0


def test_values_of_another_type_planted_in_the_cluster_do_not_turn_the_fleet_off(daemons, cluster):
    """A Redis error about a key (WRONGTYPE on a planted hash) is a miss, not a failing cluster:
    whoever can write to the cluster cannot open the daemons' breaker with it."""
    a, b = daemons(2)
    for n in range(12):
        k = key(f"fleet planted hash {n}")
        cluster.command("HSET", f"rpcedge:{{{k}}}:e", "field", "value")
        assert b.request("GET", f"/v1/entries/{k}")[0] == 404
    real = key("fleet after the plants")
    assert put(a, real, cache_entry(b'{"real":1}}'))[0] == 204
    in_fleet(cluster, real)
    assert b.request("GET", f"/v1/entries/{real}")[0] == 200
    stats = b.stats()
    assert (stats["fleet_breaker_opened_total"], stats["fleet_hits_total"], stats["fleet_errors_total"]) == (0, 1, 12)


def test_a_cluster_that_stops_answering_is_counted_as_timing_out(daemons, cluster):
    """A round past the fleet timeout is a timeout, though the cluster client's own response
    timeout (the same) ends it first. The cluster is stopped for less than its node timeout (1 s),
    so that no failover follows."""
    a, = daemons(1)
    for process in cluster.processes.values():
        process.proc.send_signal(signal.SIGSTOP)
    try:
        statuses = [a.request("GET", f"/v1/entries/{key(f'fleet hung {n}')}")[0] for n in range(2)]
    finally:
        for process in cluster.processes.values():
            process.proc.send_signal(signal.SIGCONT)
    stats = a.stats()
    assert statuses == [404, 404]
    assert (stats["fleet_timeouts_total"], stats["fleet_errors_total"]) == (2, 0)


def test_a_master_that_stops_answering_is_skipped_for_its_own_keys_alone(tmp_path_factory, daemons):
    """A breaker per master: once a stopped master's rounds have opened its breaker, its keys skip
    the fleet, and the other masters' keys are still hits; it closes again when the master is
    back. A cluster of its own, with a node timeout no stop here reaches (no failover)."""
    quiet = RedisCluster(tmp_path_factory.mktemp("fleet-a-master-stops"), replicas=0, node_timeout_ms=60_000)
    try:
        a, b = daemons(2, on=quiet)
        keys = [key(f"fleet a master stops {n}") for n in range(30)]
        for k in keys:
            assert put(a, k, cache_entry(b'"kept"}'))[0] == 204
        names = {k: in_fleet(quiet, k) for k in keys}
        stopped = quiet.masters()[0]
        on_stopped = [k for k in keys if quiet.cli(stopped, "exists", names[k]).strip() == "1"]
        on_others = [k for k in keys if k not in on_stopped]
        assert len(on_stopped) > 5 and on_others, "more of the stopped master's keys than open its breaker"
        quiet.processes[stopped].proc.send_signal(signal.SIGSTOP)
        try:
            statuses = {k: b.request("GET", f"/v1/entries/{k}")[0] for k in on_stopped + on_others}
            stats = b.stats()
        finally:
            quiet.processes[stopped].proc.send_signal(signal.SIGCONT)
        assert [statuses[k] for k in on_stopped] == [404] * len(on_stopped)
        assert [statuses[k] for k in on_others] == [200] * len(on_others), "the live masters' keys are hits"
        # 5 timeouts open its breaker; the rest are skipped (a probe let through after its pause
        # on a slow machine is one more timeout)
        assert stats["fleet_skipped_total"] + stats["fleet_timeouts_total"] == len(on_stopped), stats
        assert stats["fleet_breakers_open"] == 1 and stats["fleet_breaker_opened_total"] >= 1, stats
        deadline = time.monotonic() + 10
        while b.request("GET", f"/v1/entries/{on_stopped[-1]}")[0] != 200:
            assert time.monotonic() < deadline, "the master's breaker never closed after it came back"
            time.sleep(0.1)
        assert b.stats()["fleet_breakers_open"] == 0
    finally:
        quiet.stop()


def test_a_lock_planted_without_an_expiry_holds_nobody_back(daemons, cluster):
    """A lock no daemon set (no time to live) is gone for a follower: its waiters go to their node
    at once instead of waiting out their hold."""
    a, = daemons(1)
    k = key("fleet planted lock")
    cluster.command("SET", f"rpcedge:{{{k}}}:lock", "not a daemon's")
    status, headers, _ = a.request("GET", f"/v1/entries/{k}", headers={"X-Rpcedge-Lock": "5000"})
    assert (status, headers["X-Rpcedge-Miss"]) == (404, "in_flight")
    started = time.monotonic()
    status, headers, _ = a.request("GET", f"/v1/flights/{k}")
    assert (status, headers["X-Rpcedge-Miss"]) == (404, "released")
    assert time.monotonic() - started < 2.5, "not the 5 s hold"


def test_a_new_holder_is_never_followed_by_the_answer_of_the_one_before(daemons, cluster):
    """A holder's answer stays in the fleet until its lock would have expired; the next miss that
    holds the key clears it, so that its own followers wait for its answer."""
    a, b = daemons(2)
    lock = {"X-Rpcedge-Lock": "5000"}
    k = key("fleet two holders")
    assert a.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Lock"] == "held"
    assert put(a, k, cache_entry(b'{"first":1}}'),
               {"X-Rpcedge-Requires-Final": "5", "X-Rpcedge-Namespace": "none"})[0] == 409
    in_fleet(cluster, k, suffix="a")
    # the next miss holds the key again; its follower must not get the first holder's answer
    assert a.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Lock"] == "held"
    assert cluster.command("EXISTS", f"rpcedge:{{{k}}}:a") == 0
    assert b.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Miss"] == "in_flight"
    got = []
    waiter = threading.Thread(target=lambda: got.append(b.request("GET", f"/v1/flights/{k}")))
    waiter.start()
    time.sleep(0.5)
    second = cache_entry(b'{"second":2}}')
    assert put(a, k, second, {"X-Rpcedge-Requires-Final": "5", "X-Rpcedge-Namespace": "none"})[0] == 409
    waiter.join(10)
    assert [(status, body) for status, _, body in got] == [(200, second)]


def test_a_miss_holds_its_key_over_an_entry_it_cannot_open(daemons, cluster):
    """A miss that finds an entry it cannot open (planted, or sealed with another secret) where it
    would hold the key still holds it: the other hosts follow it instead of each asking its node,
    and its settle replaces what was there."""
    a, b = daemons(2)
    lock = {"X-Rpcedge-Lock": "5000"}
    k = key("fleet planted under a hold")
    cluster.command("SET", f"rpcedge:{{{k}}}:e", b"garbage", "PX", 60_000)
    assert a.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Lock"] == "held"
    assert cluster.command("EXISTS", f"rpcedge:{{{k}}}:lock") == 1
    assert b.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Miss"] == "in_flight"
    entry = cache_entry(b'{"held":1}}')
    assert put(a, k, entry)[0] == 204
    # the settle writes the entry and frees the lock in one step, after the store answers
    deadline = time.monotonic() + 5
    while cluster.command("EXISTS", f"rpcedge:{{{k}}}:lock"):
        assert time.monotonic() < deadline, "the holder never settled"
        time.sleep(0.02)
    assert b.request("GET", f"/v1/entries/{k}")[2] == a.request("GET", f"/v1/entries/{k}")[2]
    assert a.stats()["fleet_locks_held_total"] == 1 and b.stats()["fleet_locks_followed_total"] == 1


def test_an_entry_over_the_fleet_limit_stays_local(daemons, cluster):
    a, b = daemons(2, extra=["--fleet-max-entry", "4KiB"])
    small, large = key("fleet small"), key("fleet large")
    # incompressible: the daemon keeps it as large as it came
    noise = b'"0x' + os.urandom(4096).hex().encode() + b'"}'
    assert put(a, large, cache_entry(noise))[0] == 204
    assert put(a, small, cache_entry(b'"small"}'))[0] == 204
    in_fleet(cluster, small)
    assert cluster.command("EXISTS", f"rpcedge:{{{large}}}:e") == 0
    assert a.stats()["fleet_too_large_total"] == 1
    assert b.request("GET", f"/v1/entries/{large}")[0] == 404
    assert a.request("GET", f"/v1/entries/{large}")[0] == 200
    # a holder's entry over the limit is not published either: its followers go to their node, told
    # that it released the key (it did not die)
    lock = {"X-Rpcedge-Lock": "5000"}
    k = key("fleet large coalesced")
    assert a.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Lock"] == "held"
    assert b.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Miss"] == "in_flight"
    got = []
    waiter = threading.Thread(target=lambda: got.append(b.request("GET", f"/v1/flights/{k}")))
    waiter.start()
    assert put(a, k, cache_entry(noise))[0] == 204
    waiter.join(10)
    assert (got[0][0], got[0][1]["X-Rpcedge-Miss"]) == (404, "released")
    assert a.stats()["fleet_too_large_total"] == 2


def test_a_miss_held_by_one_daemon_is_followed_by_the_others_and_its_failure_never_handed_to_them(daemons, cluster):
    a, b = daemons(2)
    lock = {"X-Rpcedge-Lock": "5000"}

    def wait_on(daemon, k, out):
        thread = threading.Thread(target=lambda: out.append(daemon.request("GET", f"/v1/flights/{k}")))
        thread.start()
        return thread

    # the holder's answer, not final (refused by the store), goes to the other daemon's waiters
    k = key("fleet coalesced")
    assert a.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Lock"] == "held"
    status, headers, _ = b.request("GET", f"/v1/entries/{k}", headers=lock)
    assert (status, headers["X-Rpcedge-Miss"], headers["X-Rpcedge-Lock"]) == (404, "in_flight", None)
    got = []
    waiters = [wait_on(b, k, got) for _ in range(2)]
    time.sleep(0.3)
    assert got == [], "B's waiters wait for A's holder"
    sent = cache_entry(b'{"n":1}}')
    assert put(a, k, sent, {"X-Rpcedge-Requires-Final": "5", "X-Rpcedge-Namespace": "none"})[0] == 409
    for waiter in waiters:
        waiter.join(10)
    assert [(status, body) for status, _, body in got] == [(200, sent)] * 2
    assert cluster.command("EXISTS", f"rpcedge:{{{k}}}:lock") == 0, "the lock goes with the answer"
    assert cluster.command("EXISTS", f"rpcedge:{{{k}}}:e") == 0, "an answer not final is not kept"
    assert b.request("GET", f"/v1/entries/{k}")[0] == 404, "nor kept by B"

    # a holder that stores: B's waiters get the entry, and B keeps it
    k = key("fleet coalesced and kept")
    a.request("GET", f"/v1/entries/{k}", headers=lock)
    b.request("GET", f"/v1/entries/{k}", headers=lock)
    got = []
    waiter = wait_on(b, k, got)
    assert put(a, k, cache_entry(b'"kept"}'))[0] == 204
    waiter.join(10)
    assert got[0][0] == 200 and b.request("GET", f"/v1/entries/{k}")[0] == 200

    # a holder that releases (its node failed): B's waiters go to their node
    k = key("fleet released")
    a.request("GET", f"/v1/entries/{k}", headers=lock)
    b.request("GET", f"/v1/entries/{k}", headers=lock)
    got = []
    waiter = wait_on(b, k, got)
    assert a.request("DELETE", f"/v1/flights/{k}")[0] == 204
    waiter.join(10)
    assert (got[0][0], got[0][1]["X-Rpcedge-Miss"]) == (404, "released")

    # a holder that dies: its lock runs out (taken first, it always runs out before its followers'
    # own; here by far), its followers are told their time ran out, never that it released the
    # key, and the next miss holds the key
    k = key("fleet holder died")
    assert a.request("GET", f"/v1/entries/{k}", headers={"X-Rpcedge-Lock": "2000"})[1]["X-Rpcedge-Lock"] == "held"
    assert b.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Miss"] == "in_flight"
    got = []
    wait_on(b, k, got).join(10)
    assert (got[0][0], got[0][1]["X-Rpcedge-Miss"]) == (404, "timeout")
    assert b.request("GET", f"/v1/entries/{k}", headers=lock)[1]["X-Rpcedge-Lock"] == "held"
    stats = b.stats()
    waits = {outcome: stats[f'fleet_lock_waits_total{{outcome="{outcome}"}}']
             for outcome in ("entry", "answer", "released", "timeout")}
    assert waits == {"entry": 1, "answer": 1, "released": 1, "timeout": 1}
    assert (stats["locks_released_total"], stats["locks_timed_out_total"]) == (1, 1)


def test_a_refused_login_is_a_clear_error_at_start(tmp_path, cluster):
    with pytest.raises(StartError) as started:
        start_cached(tmp_path, tmp_path / "db", args=fleet_args(tmp_path, cluster, password="wrong"))
    assert "the cluster refused the login" in str(started.value)


def test_a_daemon_without_the_secret_or_with_credentials_in_the_url_does_not_start(tmp_path, cluster):
    for args, message in [
        (["--fleet", cluster.seeds()], "--fleet needs --fleet-secret-file"),
        (["--fleet", "redis://user:pw@127.0.0.1:1", "--fleet-secret-file", "x"], "no credentials in the URL"),
        (["--fleet", "http://127.0.0.1:1", "--fleet-secret-file", "x"], "redis:// or rediss://"),
    ]:
        with pytest.raises(StartError) as started:
            start_cached(tmp_path, tmp_path / "db", args=args)
        assert message in str(started.value)
    (tmp_path / "short.secret").write_bytes(b"short")
    with pytest.raises(StartError) as started:
        start_cached(tmp_path, tmp_path / "db", args=["--fleet", cluster.seeds(), "--fleet-secret-file",
                                                       tmp_path / "short.secret"])
    assert "at least 32" in str(started.value)


def test_a_tls_cluster_is_reached_with_rediss_and_the_operators_ca(tmp_path_factory, daemons):
    tls = RedisCluster(tmp_path_factory.mktemp("fleet-tls"), masters=3, replicas=0, users=[(USER, PASSWORD)], tls=True)
    try:
        a, b = daemons(2, on=tls)
        k = key("fleet over tls")
        assert put(a, k, cache_entry(b'"tls"}'))[0] == 204
        in_fleet(tls, k)
        assert b.request("GET", f"/v1/entries/{k}")[0] == 200
        assert b.stats()["fleet_hits_total"] == 1
    finally:
        tls.stop()
