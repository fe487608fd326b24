"""The proxy's own faults in the fault matrix (the link "proxy"), one act every EVERY_S while the
load runs, and what must hold once they stop:

    reload         a new configuration taken under load: nginx's master gets a SIGHUP (new
                   workers, the old ones finish what they serve); Envoy gets a changed listener
                   file (its filter chains drained and replaced in place). Each must be taken.
    bad-config     the same with a bad compression level in the configuration: each must be
                   refused, the running configuration serving on (nginx logs the refusal;
                   Envoy counts it, lds.update_rejected).
    worker-killed  an nginx worker killed (SIGKILL); the master starts another, each time.
    vm-panic       Envoy's Wasm VM fails: the listener names the build of the filter that panics
                   on a request header, and such a request comes; with the example's failure
                   policy (FAIL_RELOAD) the next requests get a new VM.

Envoy reads its listeners from a file it watches for these (envoy_harness: `listener_file`), as an
operator who changes a running Envoy's configuration has it; each version moved in carries its
own version_info, which Envoy reports once it takes it.
"""

import contextlib
import os
import signal
import threading
import time

from testbed import wire
from testbed.envoy_harness import PANICKING_WASM, WASM
from testbed.harness import Every, stop_all

ACTIONS = ("reload", "bad-config", "worker-killed", "vm-panic")
EVERY_S = 1
NGINX_HOSTS = ("nginx", "openresty")
# the hosts each action applies to (every host where not named)
ACTION_HOSTS = {"worker-killed": NGINX_HOSTS, "vm-panic": ("envoy",)}
# how long a host may take to take or refuse what it was given
SETTLE_S = 10

# The bad value, per host: (what the configuration says, what it says instead, what nginx logs
# when it refuses it); the module's directive in nginx, the Lua binding's settings in OpenResty,
# the plugin's configuration in the listener file of either Envoy.
BAD_CONFIG = {
    "nginx": ("rpcedge on;", "rpcedge on;\n        rpcedge_level 42;",
              '"rpcedge_level" directive must be between 1 and 12, got 42'),
    "openresty": ('"level": "auto"', '"level": 42', "rpcedge: config: level: must be between 1 and 12, got 42"),
    "envoy": ('"level": "auto"', '"level": 42', None),
    "envoy-native": ('"level": "auto"', '"level": 42', None),
}
# A change to Envoy's listener that each reload makes and the next undoes: it changes no answer.
ENVOY_CHANGE = ('"stream_delay_ms": 100', '"stream_delay_ms": 101')
PANIC_HEADER = "x-rpcedge-test-panic"
# what nginx logs for each worker it starts (at its notice level)
WORKER_STARTED = "start worker process "


def applies(action, host):
    return not action or host in ACTION_HOSTS.get(action, (host,))


def replaced(text, old, new):
    if text.count(old) != 1:
        raise RuntimeError(f"the configuration does not say {old!r} once")
    return text.replace(old, new)


def settled(check, failure):
    """Waits up to SETTLE_S until `check()` is true; then raises RuntimeError(`failure()`)."""
    deadline = time.monotonic() + SETTLE_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(failure())
        time.sleep(0.1)


class NginxFaults:
    """nginx's or OpenResty's master and workers (proxy.nginx)."""

    def __init__(self, proxy):
        self.host, self.nginx = proxy.host, proxy.nginx
        self.conf = self.nginx.prefix / "nginx.conf"
        self.workers_before = set(self.nginx.worker_pids())
        self.logged = len(self.nginx.error_log())

    def logged_since(self, line):
        return self.nginx.error_log()[self.logged:].count(line)

    @contextlib.contextmanager
    def prepared(self, action):
        """The configuration file with the bad value for bad-config while inside."""
        good = self.conf.read_text()
        if action == "bad-config":
            was, bad, _ = BAD_CONFIG[self.host]
            self.conf.write_text(replaced(good, was, bad))
        try:
            yield
        finally:
            self.conf.write_text(good)

    def act(self, action):
        pid = self.nginx.worker_pids()[0] if action == "worker-killed" else self.nginx.process.proc.pid
        os.kill(pid, signal.SIGKILL if action == "worker-killed" else signal.SIGHUP)

    def check(self, action, acts):
        if action == "bad-config":
            # each reload asked for refused (logged) before the good file is put back, so that
            # none still pending reads it
            refusal = BAD_CONFIG[self.host][2]
            settled(lambda: self.logged_since(refusal) >= acts,
                    lambda: f"{self.host} logged {refusal!r} {self.logged_since(refusal)} times for {acts} reloads")
            if set(self.nginx.worker_pids()) - self.workers_before:
                raise RuntimeError("new workers: a reload with a bad configuration was taken")
            return
        # a worker started for each reload or killed worker, and the first ones gone (they
        # finish what they serve first)
        settled(lambda: self.logged_since(WORKER_STARTED) >= acts,
                lambda: f"{action}: {self.logged_since(WORKER_STARTED)} workers started for {acts} acts")
        if acts:
            settled(lambda: not self.workers_before & set(self.nginx.worker_pids()),
                    lambda: f"{action}: the workers it found are still there")


class EnvoyFaults:
    """Envoy (proxy.envoy), its listeners read from a file it watches."""

    def __init__(self, proxy):
        self.host, self.envoy = proxy.host, proxy.envoy
        if self.envoy is None or self.envoy.listener_file is None:
            raise ValueError(f"{proxy.host} does not read its listeners from a file (faults.start_proxy does)")
        # each cell leaves Envoy running the listeners it started with (prepared)
        self.good = self.on_file = self.envoy.first_listeners
        self.stats_before = self.envoy.listener_stats()
        self.log_before = self.envoy.process.log.stat().st_size

    def grew(self, counter):
        return self.envoy.listener_stats()[counter] - self.stats_before[counter]

    def taking(self, version):
        """Waits until Envoy runs the listeners of `version` (move_in's)."""
        settled(lambda: self.envoy.listener_stats()["lds.version_text"] == version,
                lambda: f"Envoy did not take version {version} of its listeners: {self.envoy.listener_stats()}")

    def move_in(self, text):
        self.on_file = text
        return self.envoy.move_in_listeners(text)

    @contextlib.contextmanager
    def prepared(self, action):
        """For vm-panic, the listener that names the panicking build while inside; at the end,
        the listener Envoy started with moved in again and taken (so that a cell leaves the next
        one the Envoy it found)."""
        try:
            if action == "vm-panic":
                if not PANICKING_WASM.exists():
                    raise RuntimeError(f"{PANICKING_WASM} is missing: run `make -C envoy-filter wasm-test-panic`")
                self.taking(self.move_in(replaced(self.good, f"filename: {WASM}", f"filename: {PANICKING_WASM}")))
                self.stats_before = self.envoy.listener_stats()
            yield
        finally:
            if self.on_file != self.good:
                self.taking(self.move_in(self.good))

    def act(self, action):
        if action == "vm-panic":
            with contextlib.suppress(OSError, ValueError, AssertionError):  # it fails, however Envoy ends it
                wire.request(self.envoy.port, "/", headers={PANIC_HEADER: "1"}, timeout=10)
        elif action == "bad-config":
            was, bad, _ = BAD_CONFIG[self.host]
            self.move_in(replaced(self.good, was, bad))
        else:
            change = ENVOY_CHANGE if self.on_file == self.good else ENVOY_CHANGE[::-1]
            self.move_in(replaced(self.on_file, *change))

    def check(self, action, acts):
        if action == "reload":
            # each version taken, and each a change made in place (not a listener left as it was)
            if acts:
                self.taking(str(self.envoy.listeners_version))
            for counter in ("lds.update_success", "listener_in_place_updated"):
                if self.grew(counter) != acts:
                    raise RuntimeError(f"Envoy's {counter} grew by {self.grew(counter)} for {acts} reloads")
        elif action == "bad-config":
            settled(lambda: self.grew("lds.update_rejected") >= acts,
                    lambda: f"Envoy rejected {self.grew('lds.update_rejected')} of {acts} bad listeners")
            if self.grew("lds.update_success") or self.grew("listener_in_place_updated"):
                raise RuntimeError(f"Envoy took a listener with a bad configuration: {self.envoy.listener_stats()}")
        elif action == "vm-panic":
            with open(self.envoy.process.log, "rb") as log:
                log.seek(self.log_before)
                if b"panicked at" not in log.read():
                    raise RuntimeError("no Wasm VM panicked")


def of(proxy):
    """The proxy's faults (`proxy`, a cache_cases.Proxy): an NginxFaults or an EnvoyFaults."""
    return NginxFaults(proxy) if proxy.nginx else EnvoyFaults(proxy)


@contextlib.contextmanager
def faulting(proxy, action, seconds):
    """`action` on `proxy` (a cache_cases.Proxy) every EVERY_S for `seconds` from a thread while
    inside; then what must hold is checked (a RuntimeError if not)."""
    if action not in ACTIONS or not applies(action, proxy.host):
        raise ValueError(f"no {action!r} for {proxy.host}")
    host, acts = of(proxy), 0

    def act(stopping):
        nonlocal acts
        with contextlib.suppress(ProcessLookupError):  # a worker gone by itself
            host.act(action)
            acts += 1
        if stopping.wait(EVERY_S) or time.monotonic() >= deadline:
            stopping.set()

    with host.prepared(action):
        stopping, deadline = threading.Event(), time.monotonic() + seconds
        acting = Every(act, stopping, name=f"{action} of {proxy.host}")
        acting.start()
        try:
            yield
        finally:
            stop_all([acting], stopping)
        host.check(action, acts)
