"""The fault matrix (issue 47): each host under load while one part misbehaves, every answer judged
against the node's recording (testbed/judged_load.py says how).

A cell is one fault on one link (Toxiproxy between the proxy and the node, the proxy and the
cache daemon, or the daemon and each node of the fleet's Redis Cluster; a lie is told by a
testbed.liar, which the link then leads to), one more client
that misbehaves (testbed.bad_clients; what it sees is judged apart, judged_load.CLIENT_OUTCOMES),
or the proxy's own processes or configuration (testbed.proxy_faults: reloaded with a good
configuration or a bad one, a worker killed, Envoy's Wasm VM failing), or the descriptors the
daemon's or the proxy's processes may open (testbed.descriptors). While it is on, the mix
runs (judged_load.load); then the fault is removed and the recovery measured
(judged_load.recovery).
"""

import contextlib
import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from testbed import bad_clients
from testbed import cache_cases as cc
from testbed import descriptors
from testbed import fleet_cell
from testbed import memory_limit
from testbed import proxy_faults
from testbed import wire
from testbed.envoy_harness import ENVOY_HOSTS
from testbed.harness import children, fill, free_port, small_tmpfs
from testbed.judged_load import NEVER, RECOVERY_LIMIT, load, networks, recovery
from testbed.liar import Liar
from testbed.redis_cluster import RedisCluster
from testbed.toxiproxy import Toxiproxy

# The upstream timeout the matrix runs the proxies with (nginx's proxy_read_timeout, Envoy's route
# timeout), so that a node that never answers costs a cell seconds, not the examples' 300 s
# (nginx) and 120 s (Envoy).
NODE_TIMEOUT_S = 5
# The cache lookup's timeout in the matrix: the example configs' (the tests' own is longer, for
# their expected cache statuses on a loaded machine; here only the answers are judged).
LOOKUP_TIMEOUT_MS = 50


@dataclass(frozen=True)
class Fault:
    """A fault on `link` ("node", "daemon", "fleet", "client" or "proxy"): Toxiproxy toxics, each (type, stream,
    toxicity, attributes; on the fleet's link to each Redis node), the link taken down (`down`), a
    Redis master killed (`kill_master`; its replica takes over), a signal to the daemon's process (SIGSTOP: hung
    until SIGCONT; SIGKILL: dead until started again on its store), the daemon started again on
    its store with the store's files corrupt (`corrupt_store`), the daemon moved onto a small
    file system that is then filled (`full_disk`), the daemon's or the proxy's processes held to
    the descriptors they have (`descriptors`, on the link "daemon" or "proxy"), the daemon held to
    a memory limit (`memory_limit`), the finality node lying (`finality_lie`), or a `lie` (a name
    in liar.LIES) on LIE_SHARE of the answers that come over the link; or a misbehaving `client` (a name in
    bad_clients.CLIENTS) beside the load's clients; or done to the proxy itself (`proxy`, an
    action of proxy_faults)."""
    name: str
    link: str
    what: str
    toxics: tuple = ()
    down: bool = False
    daemon_signal: int = 0
    corrupt_store: bool = False
    full_disk: bool = False
    kill_master: bool = False
    descriptors: bool = False
    # the daemon in a memory cgroup of its own, limited to what it uses plus a little (memory_limit)
    memory_limit: bool = False
    # the finality node says every block is final while the fault is on, after it said none was:
    # a jump ahead, which ends with the fault
    finality_lie: bool = False
    lie: str = ""
    client: str = ""
    # what is done to the proxy's own processes or configuration (proxy_faults.ACTIONS)
    proxy: str = ""
    # whether every answer must still be right (a cache fault must never cost an answer)
    all_right: bool = False
    # whether a request may go unanswered until the client gives up ("timeout"): only where no part
    # that is left can answer it (a request a failed Wasm VM held)
    may_hang: bool = False


FAULTS = [
    Fault("node-latency", "node", "the node answers 100 ms late (±50 ms)",
          (("latency", "downstream", 1.0, {"latency": 100, "jitter": 50}),), all_right=True),
    Fault("node-slicer", "node", "the node's bytes arrive in slices of ~64 B",
          (("slicer", "downstream", 1.0, {"average_size": 64, "size_variation": 48, "delay": 20}),),
          all_right=True),
    Fault("node-bandwidth", "node", "the node sends at 1 MB/s per connection",
          (("bandwidth", "downstream", 1.0, {"rate": 1000}),), all_right=True),
    Fault("node-slow-close", "node", "the node's connections close 1 s after it is done",
          (("slow_close", "downstream", 1.0, {"delay": 1000}),), all_right=True),
    Fault("node-reset-before-headers", "node", "half the node's connections reset as the request arrives",
          (("reset_peer", "upstream", 0.5, {"timeout": 0}),)),
    Fault("node-cut-mid-body", "node", "the node's connections close after 256 KiB",
          (("limit_data", "downstream", 1.0, {"bytes": 256 * 1024}),)),
    Fault("node-never-answers", "node", "the node takes requests and never answers",
          (("timeout", "downstream", 1.0, {"timeout": 0}),)),
    Fault("node-down", "node", "the node refuses connections", down=True),
    Fault("daemon-latency", "daemon", "the daemon answers 200 ms late, past the 50 ms lookup timeout",
          (("latency", "downstream", 1.0, {"latency": 200}),), all_right=True),
    Fault("daemon-reset", "daemon", "the daemon's connections reset",
          (("reset_peer", "upstream", 1.0, {"timeout": 0}),), all_right=True),
    Fault("daemon-cut", "daemon", "the daemon's connections close after 3000 bytes",
          (("limit_data", "downstream", 1.0, {"bytes": 3000}),), all_right=True),
    Fault("daemon-hung", "daemon", "the daemon's answers are lost on the wire, its connections left open",
          (("timeout", "downstream", 1.0, {"timeout": 0}),), all_right=True),
    Fault("daemon-down", "daemon", "the daemon refuses connections", down=True, all_right=True),
    Fault("daemon-sigstop", "daemon", "the daemon's process is stopped (SIGSTOP), then continued",
          daemon_signal=signal.SIGSTOP, all_right=True),
    Fault("daemon-out-of-descriptors", "daemon", "the daemon may open only a few more descriptors (EMFILE past "
          "them), then has its limit back", descriptors=True, all_right=True),
    Fault("daemon-memory-limit", "daemon", "the daemon is held to 2 MiB more memory (a cgroup of its own): its "
          "page cache reclaimed, its allocations slowed, killed by the cgroup as it outgrows it, then started again",
          memory_limit=True, all_right=True),
    Fault("daemon-kill-9", "daemon", "the daemon is killed (SIGKILL), then started again on its store",
          daemon_signal=signal.SIGKILL, all_right=True),
]

LIE_SHARE = 0.3
FAULTS += [
    Fault("node-short-length", "node", "the node closes after half the bytes its Content-Length declares",
          lie="short-length"),
    Fault("node-long-length", "node", "the node sends a second, smuggled response after the one declared",
          lie="long-length"),
    Fault("node-garbage", "node", "the node sends half its answer and bytes that are no JSON, framed exactly",
          lie="garbage"),
    Fault("node-error-storm", "node", "the node answers 429 (Retry-After), 503, or a 200 JSON-RPC limit error",
          lie="error-storm"),
    Fault("node-unasked-gzip", "node", "the node gzips its answers whatever it was asked",
          lie="unasked-gzip", all_right=True),
    Fault("node-finality-lie", "node", "the finality node jumps from no block final to every one while the node "
          "gives receipts from a fork, then the lie ends", lie="fork", finality_lie=True),
    Fault("daemon-corrupt-store", "daemon",
          "the daemon started again on its store with the last 512 bytes of each file overwritten",
          corrupt_store=True, all_right=True),
    Fault("daemon-bitflip", "daemon", "one bit of the daemon's answer flipped, anywhere in its body",
          lie="bitflip", all_right=True),
    Fault("daemon-full-disk", "daemon",
          "the daemon's store on a 64 MiB tmpfs filled to the last byte, then freed",
          full_disk=True, all_right=True),
]

# The fleet's faults, between the daemon and every node of its Redis Cluster; a fleet cell's
# daemon forgets what the fleet holds every second (fleet_cell.FleetDaemon), so that lookups keep
# reaching it.
FAULTS += [
    Fault("fleet-latency", "fleet", "Redis answers 100 ms late, past the daemon's 20 ms fleet timeout",
          (("latency", "downstream", 1.0, {"latency": 100}),), all_right=True),
    Fault("fleet-reset", "fleet", "the daemon's connections to Redis reset",
          (("reset_peer", "upstream", 1.0, {"timeout": 0}),), all_right=True),
    Fault("fleet-cut", "fleet", "the daemon's connections to Redis close after 3000 bytes",
          (("limit_data", "downstream", 1.0, {"bytes": 3000}),), all_right=True),
    Fault("fleet-hung", "fleet", "Redis's answers are lost on the wire, its connections left open",
          (("timeout", "downstream", 1.0, {"timeout": 0}),), all_right=True),
    Fault("fleet-down", "fleet", "every Redis node refuses connections", down=True, all_right=True),
    Fault("fleet-master-killed", "fleet", "a Redis master is killed (SIGKILL); its replica takes over, and it "
          "comes back as a replica", kill_master=True, all_right=True),
]

# a misbehaving client costs the others nothing
FAULTS += [Fault(f"client-{name}", "client", client.what, client=name, all_right=True)
           for name, client in bad_clients.CLIENTS.items()]

# the proxy's own faults
FAULTS += [
    Fault("proxy-reload", "proxy", "the proxy takes a changed configuration every second (nginx: SIGHUP to the "
          "master; Envoy: its listener file replaced)", proxy="reload", all_right=True),
    Fault("proxy-bad-config", "proxy", "the proxy is given a configuration with a bad compression level every "
          "second (nginx: SIGHUP; Envoy: its listener file), which it must refuse", proxy="bad-config",
          all_right=True),
    Fault("proxy-out-of-descriptors", "proxy", "the proxy's processes may open only a few more descriptors (EMFILE "
          "past them), then have their limit back", descriptors=True),
    Fault("proxy-worker-killed", "proxy", "an nginx worker is killed (SIGKILL) every second; the master starts "
          "another", proxy="worker-killed"),
    Fault("proxy-vm-panic", "proxy", "Envoy's Wasm VM panics every second (a build that panics on a request "
          "header); FAIL_RELOAD gives the next requests a new VM", proxy="vm-panic", may_hang=True),
]

# The full disk's file system, and the daemon on it: small memtables, flushed often, so that a
# short cell reaches the disk and, once it is freed, it has room for every memtable (what the
# daemon waits for before it opens its stopped store again).
FULL_DISK_SIZE = "64m"
FULL_DISK_ARGS = ("--flush-interval", "500ms", "--memtable-size", "8MiB")
# how long the daemon may take to write again once the disk is freed
FULL_DISK_RESUME_S = 30

# the hosts of the matrix; OpenResty in the Lua binding's capture form
HOSTS = ("nginx", "envoy", "envoy-native", "openresty")

@dataclass
class FullDisk:
    """The daemon's regular store, and the tmpfs it is moved to for the full disk's cell."""
    regular_store: Path
    mount: Path
    mounted: object = None
    daemon: object = None


class FaultedStack:
    """A cache stack (cc.CacheStack) as the proxies see it, for cc.start_proxy: `replay` and
    `daemon` are the Toxiproxy links ("node" and "daemon") in front of the real ones; a liar
    waits in front of each for a lie's cell. The fleet's cells have a Redis Cluster of their own
    (`cluster`)."""

    def __init__(self, stack, toxiproxy):
        self.stack, self.toxiproxy = stack, toxiproxy
        self.replay = SimpleNamespace(port=toxiproxy.link("node", stack.replay.port))
        self.daemon = SimpleNamespace(port=toxiproxy.link("daemon", stack.daemon.port))
        # the fleet's cluster once a fleet cell asks for it, a fleet cell's daemon, and the fleet
        # counters of the last fleet cell
        self._cluster = None
        self.fleet = None
        self.fleet_counts = Counter()
        self.full_disk = None
        self.liars = {"node": Liar("node-liar", toxiproxy.log_dir, free_port(), stack.replay.port)}
        try:
            self.liars["daemon"] = Liar("daemon-liar", toxiproxy.log_dir, free_port(), stack.daemon.port)
        except Exception:
            self.liars["node"].stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for liar in self.liars.values():
            liar.stop()
        if self._cluster:
            self._cluster.stop()

    @property
    def cluster(self):
        """The fleet's Redis Cluster (3 masters, 3 replicas), each node announcing a link of its
        own (the "fleet" links): started for the first fleet cell."""
        if self._cluster is None:
            self._cluster = RedisCluster(self.toxiproxy.log_dir / "fleet", announce=lambda port: self.toxiproxy.link(
                fleet_cell.link_name(port), port))
        return self._cluster

    def links(self, name):
        """The Toxiproxy links of `name` ("node", "daemon" or "fleet")."""
        if name == "fleet":
            return [fleet_cell.link_name(port) for port in self.cluster.ports]
        return [name] if name in ("node", "daemon") else []

    def inject(self, fault):
        if fault.finality_lie:
            # nothing final, heard; then the lie: everything final
            self.stack.say_finalized(0)
            for network in self.stack.networks:
                self.stack.wait_for_finality(network, 0)
            self.stack.say_finalized(cc.FINAL)
        if fault.lie:
            self.liars[fault.link].tell(fault.lie, LIE_SHARE)
            self.toxiproxy.redirect(fault.link, self.liars[fault.link].port)
        for link in self.links(fault.link):
            if fault.down:
                self.toxiproxy.set_enabled(link, False)
            for kind, stream, toxicity, attributes in fault.toxics:
                self.toxiproxy.add(link, kind, stream, toxicity, **attributes)
        if fault.kill_master:
            self.cluster.kill(self.cluster.masters()[0])
        if fault.daemon_signal:
            self.stack.daemon.process.proc.send_signal(fault.daemon_signal)
        if fault.corrupt_store:
            self.start_on_corrupt_store()
        if fault.full_disk:
            self.start_on_full_disk()

    def start_on_corrupt_store(self):
        """Stops the daemon (which flushes its memtables), overwrites the end of each of its
        store's files (where RocksDB reads a table's footer and properties at open), and starts
        it again on that store: it must set the store aside and start on an empty one."""
        daemon = self.stack.daemon
        daemon.process.stop()
        store = Path(daemon.db)
        set_aside = set(store.parent.glob(f"{store.name}.corrupt-*"))
        files = [file for file in store.iterdir() if file.suffix in (".sst", ".blob")]
        if not files:
            raise RuntimeError(f"{store} has no table or blob file to corrupt")
        for file in files:
            data = bytearray(file.read_bytes())
            data[-512:] = b"\x5a" * min(512, len(data))
            file.write_bytes(bytes(data))
        self.stack.start_daemon(db_name=store.name, port=daemon.port)
        if set(store.parent.glob(f"{store.name}.corrupt-*")) <= set_aside:
            raise RuntimeError(f"the daemon started on the corrupt {store} without setting it aside")

    def start_on_full_disk(self):
        """Moves the daemon onto an empty store on a tmpfs of its own and fills that file system:
        every flush then fails."""
        daemon = self.stack.daemon
        self.full_disk = FullDisk(daemon.db, daemon.db.parent / "full-disk")
        daemon.process.stop()
        self.full_disk.mounted = small_tmpfs(self.full_disk.mount, FULL_DISK_SIZE)
        self.full_disk.mounted.__enter__()
        self.full_disk.daemon = self.stack.start_daemon(db_name=str(self.full_disk.mount / "db"), port=daemon.port,
                                                        args=FULL_DISK_ARGS)
        fill(self.full_disk.mount / "filler")

    def end_full_disk(self):
        """Frees the disk and waits until the daemon writes again (a DELETE is a write; it
        failed while the disk was full, or the cell tested nothing) and says it opened its store
        again; then puts the daemon back on its regular store."""
        full_disk, self.full_disk = self.full_disk, None
        try:
            if full_disk.daemon:
                absent = "/v1/entries/" + "0" * 64
                if full_disk.daemon.request("DELETE", absent)[0] != 500:
                    raise RuntimeError("the daemon still wrote with its disk full")
                (full_disk.mount / "filler").unlink()
                deadline = time.monotonic() + FULL_DISK_RESUME_S
                while full_disk.daemon.request("DELETE", absent)[0] >= 300:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the daemon did not write again {FULL_DISK_RESUME_S} s after its disk "
                                           "was freed")
                    time.sleep(0.5)
                if full_disk.daemon.stats()["store_reopens_total"] < 1:
                    raise RuntimeError("the daemon wrote again without opening its store again")
        finally:
            try:
                self.stack.daemon.process.stop()
                if full_disk.mounted:
                    # RocksDB's own log, beside the daemon's, for what it did about the disk
                    with contextlib.suppress(OSError):
                        shutil.copy(full_disk.mount / "db" / "LOG", full_disk.mount.parent / "full-disk-rocksdb.log")
                    full_disk.mounted.__exit__(None, None, None)
            finally:
                self.stack.start_daemon(db_name=full_disk.regular_store.name, port=self.stack.daemon.port)

    def end_finality_lie(self):
        """Ends the lie as the test bed's truth: every block final, as before the cell. The
        daemon starts again on its store, since it believes what it first hears (it would hold
        this move for its hold, and the next cells would find nothing final); what it kept on the
        lie's word, if anything, is still there to be served."""
        daemon = self.stack.daemon
        self.stack.say_finalized(cc.FINAL)
        daemon.process.stop()
        self.stack.start_daemon(db_name=daemon.db.name, port=daemon.port)

    def heal(self, fault):
        """The daemon continued (or started again on the store it was killed on) first, so that
        a failing Toxiproxy leaves no daemon stopped; a killed Redis master started again (a
        replica now). A liar that told no lie, or a fleet cell that reached no fleet, fails the
        cell: it tested nothing."""
        daemon = self.stack.daemon
        try:
            try:
                if fault.kill_master:
                    self.cluster.start_all()
            finally:
                if self.fleet:
                    fleet, self.fleet = self.fleet, None
                    self.fleet_counts = fleet.stop()
            if fault.daemon_signal == signal.SIGSTOP:
                daemon.process.proc.send_signal(signal.SIGCONT)
            elif fault.daemon_signal == signal.SIGKILL or (fault.memory_limit
                                                           and daemon.process.proc.poll() is not None):
                # killed, by the fault or by its cgroup: started again on its store
                daemon.process.proc.wait()
                self.stack.start_daemon(db_name=daemon.db.name, port=daemon.port)
            elif fault.full_disk and self.full_disk:
                self.end_full_disk()
            elif fault.finality_lie:
                self.end_finality_lie()
            if fault.lie:
                told = self.liars[fault.link].told()
                self.liars[fault.link].tell(None)
                if not told:
                    raise RuntimeError(f"the {fault.link}'s liar told no {fault.lie} lie")
        finally:
            self.toxiproxy.reset()


@contextlib.contextmanager
def faulted_stack(work, cases):
    """A cache stack for `cases`' networks (cc.CacheStack, its logs and stores in `work`) behind
    Toxiproxy: a FaultedStack while inside."""
    stack = cc.CacheStack(work, networks(cases), finality_hold=cc.DAEMON_HOLD)
    try:
        with Toxiproxy(work) as toxiproxy, FaultedStack(stack, toxiproxy) as faulted:
            yield faulted
    finally:
        stack.stop()


def start_proxy(host, workdir, stack, cache=True, drain_time_s=None):
    """`host` in front of the faulted stack with the matrix's timeouts, the cache on (unless
    `cache` is false), no hot tier (every lookup reaches the daemon), and HTTP/2 with prior
    knowledge (h2c) for the clients that speak it: on a port of its own in nginx (as the example
    config), on the same in Envoy (its codec AUTO). Envoy reads its listener from a file it watches,
    for the proxy's own faults (proxy_faults), and drains what a change of it replaced for
    `drain_time_s` (its own 600 s if not given)."""
    options = {"node_timeout_s": NODE_TIMEOUT_S, "timeout_ms": LOOKUP_TIMEOUT_MS, "cache": cache}
    if host in ENVOY_HOSTS:
        options.update(listener_file=True, drain_time_s=drain_time_s)
    h2_port = None if host in ENVOY_HOSTS else free_port()
    if h2_port:
        options["extra"] = f"\n        listen {wire.LOOPBACK}:{h2_port} http2;"
    proxy = cc.start_proxy(host, workdir, stack, **options)
    proxy.h2_port = h2_port or proxy.port
    return proxy


def applies(fault, host):
    return proxy_faults.applies(fault.proxy, host)


def unavailable(fault):
    """Why this machine cannot put `fault` on, or None."""
    return memory_limit.unavailable() if fault.memory_limit else None


def run_cell(stack, proxy, fault, cases, seconds, seed=0):
    """One cell: the tally under the fault (a node's on an empty cache) through `proxy` (a
    cache_cases.Proxy), then the recovery (seconds) once it is gone."""
    if fault.link == "node" or fault.memory_limit:
        # an empty cache, on the daemon's port (its link's far end): the node's faults then meet
        # misses (and their herds) as well as answers the cache never keeps; a memory limit meets
        # a daemon that keeps what it is sent, not one that answers from what it has
        stack.stack.fresh_daemon(port=stack.stack.daemon.port)
    try:
        # what holds the processes (their limits, the proxy's own faults) lets go before the
        # heal, which then finds the daemon as the cell left it (killed by its cgroup, say)
        with contextlib.ExitStack() as faulted:
            if fault.link == "fleet":
                stack.fleet = fleet_cell.FleetDaemon(stack, proxy, cases)
            stack.inject(fault)
            if fault.descriptors:
                faulted.enter_context(descriptors.limited(*processes(stack, proxy, fault.link)))
            if fault.memory_limit:
                pressure = faulted.enter_context(memory_limit.limited(stack.stack.daemon.process.proc.pid))
            if fault.proxy:
                faulted.enter_context(proxy_faults.faulting(proxy, fault.proxy, seconds))
            tally = load(proxy, cases, seconds, seed, lie=fault.lie, misbehaving=fault.client)
            if fault.memory_limit:
                met, killed = pressure()
                if not met:
                    raise RuntimeError("the daemon never met its memory limit: the cell tested nothing")
                tally.notes.append(f"limit met {met:,} times, {killed} OOM kills")
    finally:
        stack.heal(fault)
    return tally, recovery(proxy, cases, tally)


def processes(stack, proxy, link):
    """The pids of the daemon's process, or the proxy's (nginx's master and workers), and the
    logs where they say what failed."""
    if link == "daemon":
        return [stack.stack.daemon.process.proc.pid], [stack.stack.daemon.process.log]
    if proxy.nginx:
        master = proxy.nginx.process.proc.pid
        return [master, *children(master)], [proxy.nginx.prefix / "error.log"]
    return [proxy.envoy.process.proc.pid], [proxy.envoy.process.log]


def failures(fault, tally, recovered):
    """What a cell (`run_cell`'s tally and recovery under `fault`) breaks of the matrix's rules,
    one line each; none: it passes. No answer wrong or garbled, the misbehaving client's
    included; none left waiting for nothing but where the fault may hang; every answer right
    under a fault that leaves them so (the cache's, a harmless lie's, a client's, a good reload);
    and every case right again once the fault is gone."""
    broken = []
    never = {o: tally.counts[o] + tally.client[o] for o in NEVER if tally.counts[o] + tally.client[o]}
    if never:
        broken.append(f"answers that may never be: {never}")
    if not sum(tally.counts.values()):
        broken.append("no answer came under the fault")
    if fault.client:
        allowed = bad_clients.CLIENTS[fault.client].allowed
        if not sum(tally.client.values()):
            broken.append("the misbehaving client never finished")
        if not set(tally.client) <= allowed:
            broken.append(f"the misbehaving client saw {dict(tally.client)}, beyond {sorted(allowed)}")
        if "left" in allowed and not tally.client["left"]:
            broken.append(f"the client never left mid-body: {dict(tally.client)}")
    if not fault.may_hang and tally.counts["timeout"]:
        broken.append(f"{tally.counts['timeout']} clients left waiting")
    if fault.all_right and set(tally.counts) != {"right"}:
        broken.append(f"not every answer right under the fault: {dict(tally.counts)}")
    if recovered is None:
        broken.append(f"answers still not right {RECOVERY_LIMIT} s after the fault ended")
    if set(tally.after) != {"right"}:
        broken.append(f"answers after the fault: {dict(tally.after)}")
    return broken
