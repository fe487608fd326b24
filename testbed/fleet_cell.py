"""The daemon of the fault matrix's fleet cells (testbed/faults.py): one on the fleet tier's Redis
Cluster, whose every node a Toxiproxy link of its own leads to (`link_name`), kept asking the fleet
while the fault is on, and the fleet counters it kept."""

import contextlib
import shutil
import threading
import time
from collections import Counter

from testbed.harness import Every, stop_all
from testbed.judged_load import ask, request_of

# The daemon's fleet timeout: its default.
FLEET_TIMEOUT = "20ms"
# How often the daemon's store forgets what the fleet holds.
FORGET_S = 1.0
# How long the daemon may take to write what it kept to the fleet.
FILL_S = 10
# the counters that say a lookup reached the fleet (or was skipped, its breaker open)
ASKED = ("fleet_hits_total", "fleet_misses_total", "fleet_errors_total", "fleet_timeouts_total",
         "fleet_skipped_total")


def link_name(port):
    """The Toxiproxy link in front of the Redis node on `port`."""
    return f"fleet-{port}"


def counters(stats):
    return {name: value for name, value in stats.items() if name.startswith("fleet_") and name.endswith("_total")}


class FleetDaemon:
    """A daemon on the fleet with a store of its own, the daemon link of `faulted` (a
    faults.FaultedStack) led to it; the regular daemon waits, untouched, until stop() hands the
    link back. It is asked every case once through `proxy` and given the time to write what it
    kept to the fleet. Since a daemon's own store answers whatever it was asked once, its store
    then forgets every entry the fleet holds each FORGET_S (a DELETE of each key, on its own
    port), so that its lookups keep reaching the fleet; its counters count from there."""

    def __init__(self, faulted, proxy, cases):
        self.faulted = faulted
        args = faulted.cluster.daemon_args(faulted.toxiproxy.log_dir, FLEET_TIMEOUT)
        self.daemon = faulted.stack.another_daemon("fleet-db", args=args)
        self.stopping, self.worker, self.before = threading.Event(), None, {}
        try:
            faulted.toxiproxy.redirect("daemon", self.daemon.port)
            self.fill(proxy, cases)
            self.keys = [name.split("{", 1)[1].split("}", 1)[0] for name in faulted.cluster.keys("rpcedge:*:e")]
            self.before = counters(self.daemon.stats())
            self.worker = Every(self.forget, self.stopping, "fleet forgetting")
            self.worker.start()
        except Exception:
            with contextlib.suppress(Exception):  # the first failure is the one to see
                self.release()
            raise

    def fill(self, proxy, cases):
        for kind, kind_cases in cases.items():
            for case in kind_cases:
                ask(proxy.port, request_of(kind, case, 7), "identity")
        deadline, stored = time.monotonic() + FILL_S, None
        while stored != (stored := self.daemon.stats()["fleet_stores_total"]) and time.monotonic() < deadline:
            time.sleep(0.3)

    def forget(self, stopping):
        if not stopping.wait(FORGET_S):
            for key in self.keys:
                self.daemon.request("DELETE", f"/v1/entries/{key}")

    def stop(self):
        """The fleet counters since the fill, the link handed back. A cell in which no lookup
        reached the fleet tested nothing: it fails."""
        try:
            stop_all([self.worker] if self.worker else [], self.stopping)
        finally:
            stats = self.release()
        counts = Counter(counters(stats))
        counts.subtract(self.before)
        if not any(counts[name] for name in ASKED):
            raise RuntimeError("no lookup reached the fleet")
        return counts

    def release(self):
        """Hands the daemon link back to the regular daemon and stops this one: its last stats."""
        self.faulted.toxiproxy.redirect("daemon", self.faulted.stack.daemon.port)
        try:
            return self.daemon.stats()
        finally:
            self.daemon.process.stop()
            shutil.rmtree(self.daemon.db, ignore_errors=True)
