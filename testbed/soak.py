"""The soak (issue 47): one host under the mix for a long run while faults come and go at random
times; its memory, descriptors and the daemon's disk sampled throughout.

Two forms per host: `mix`, the cache off (every answer is the node's, compressed or streamed on
the way), and `warm`, the cache on and asked every case first (the cacheable answers are hits).

The volume is wrk's (loadtest/wrk/soak.lua), every answer checked against the node's answer to
its request, byte for byte as a client decodes it (gzip with the machine's zlib), each connection
asking with an id of its own (an answer meant for another connection is wrong). Beside it,
JUDGED_THREADS clients of the fault matrix (judged_load.load) send the whole mix, zstd and the
batch too, and decode and compare every answer. Every FAULT_EVERY_S on average
(exponentially) one of the form's faults comes: one of the matrix's (FaultedStack), on for
FAULT_SECONDS, or the proxy's reload (proxy_faults), which each run has first. Every SAMPLE_S
the proxy's processes (nginx's master and workers, or Envoy) and the daemon are sampled: resident
memory, open descriptors, the store's bytes on disk.

A form passes when no answer is wrong (wrk's, the judged clients', and those of the round asked
once it is over), no answer is anything but right where no fault allows it (`unexplained`), and
no sampled series grows (`grows`); each reload must have been taken.
"""

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from statistics import median

from testbed import faults
from testbed import judged_load
from testbed import proxy_faults
from testbed.harness import LOOPBACK, REPO, Every, children, stop_all
from testbed.wrk import run_wrk

SCRIPT = REPO / "loadtest" / "wrk" / "soak.lua"
FORMS = ("mix", "warm")
WRK_THREADS = 8  # and as many connections: soak.lua pairs each answer with its request
WRK_SEGMENT_S = 10
JUDGED_THREADS = 2
SAMPLE_S = 2
FAULT_EVERY_S = 8
FAULT_SECONDS = 3
# the form's faults: each one after which every answer must be right again by itself
NODE_FAULTS = ("node-latency", "node-slicer", "node-reset-before-headers", "node-cut-mid-body", "node-down")
DAEMON_FAULTS = ("daemon-latency", "daemon-reset", "daemon-sigstop", "daemon-kill-9")
RELOAD = "proxy-reload"
# Envoy keeps what a reload replaced (the old filter chains, with their listening sockets, their
# connections and the filter's configuration) for its drain time, 600 s by default: longer than a
# run's quarter, so each reload's hold would show as growth (`grows`). With this one the soak sees
# whether they are let go.
DRAIN_TIME_S = 30
# A failed answer (a status other than 200) counts against a fault that was on within this many
# seconds of it: wrk counts by the whole second, and an answer the fault began may end after it
FAILED_MARGIN_S = 2
# what the judged clients may see while the form's faults come and go (each fault's cell allows
# no more: a node's faults cut or fail answers, the daemon's and a reload cost none, none hangs)
JUDGED_ALLOWED = {"right", "error", "cut"}
# how much a series may rise from its second quarter to its last (`grows`): at least the first
# figure, or the second as a share of where it was
ALLOWANCE = {"proxy_rss": (16 << 20, 0.10), "daemon_rss": (32 << 20, 0.10), "proxy_fds": (8, 0.0),
             "daemon_fds": (8, 0.0), "store_bytes": (32 << 20, 0.5)}


# what each wrk connection's id stands in for in the requests' list (soak.lua puts its own there)
ID_STAND_IN = "rpcedge-soak-connection-id"


def around_id(text):
    """(before, after) the id of `text`, a request or an answer made with ID_STAND_IN."""
    stand_in = json.dumps(ID_STAND_IN).encode()
    if text.count(stand_in) != 1:
        raise ValueError(f"{ID_STAND_IN!r} is not once in {text[:200]!r}")
    before, _, after = text.partition(stand_in)
    return before, after


def write_requests(path, cases):
    """The list for soak.lua: each single call of the mix (a batch is equal only as JSON, left
    to the judged clients) with and without gzip, its body and answer cut where the id goes."""
    records = []
    for kind, found in cases.items():
        if kind == "batch":
            continue
        for case in found:
            request = judged_load.request_of(kind, case, ID_STAND_IN)
            for coding in ("gzip", "-"):
                fields = (case.path.encode(), coding.encode(), *around_id(request.body), *around_id(request.expected))
                records.append(b"".join(b"%010d%s" % (len(f), f) for f in fields))
    path.write_bytes(b"".join(records))
    return path


def wrk_segment(port, requests, seconds):
    """One wrk run through `port`: its RESULT (requests, right, wrong, failed, errors)."""
    return run_wrk([f"-t{WRK_THREADS}", f"-c{WRK_THREADS}", f"-d{seconds}s", "--timeout",
                    f"{judged_load.CLIENT_TIMEOUT}s", "-s", SCRIPT, f"http://{LOOPBACK}:{port}", "--", requests],
                   seconds)[0]


def resident(pids):
    """Bytes resident and descriptors open, over `pids` (those gone meanwhile left out)."""
    rss = fds = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            open_fds = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        # a zombie (killed, not yet reaped) has no VmRSS
        resident_kib = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")]
        rss, fds = rss + sum(resident_kib) * 1024, fds + (open_fds if resident_kib else 0)
    return rss, fds


def disk_bytes(directory):
    """Bytes allocated to the files under `directory`."""
    total = 0
    for file in Path(directory).rglob("*"):
        try:
            total += file.lstat().st_blocks * 512
        except OSError:
            continue  # removed meanwhile (a compaction)
    return total


def grows(values, least, share):
    """Whether a series keeps growing: the median of its last quarter above the median of its
    second quarter by more than `least` and `share` of it. The median is the series' level, which
    whatever grows without bound raises, and a few samples far above the rest do not (they move
    the highest). The first quarter is the warm-up (pools, caches and allocators fill); a series
    of fewer than 8 samples says nothing."""
    values = [value for value in values if value is not None]
    if len(values) < 8:
        return False
    quarter = len(values) // 4
    before, last = median(values[quarter:2 * quarter]), median(values[3 * quarter:4 * quarter])
    return last > before + max(least, share * before)


@dataclass
class Soak:
    """One form's run; `samples` are (seconds, proxy_rss, proxy_fds, daemon_rss, daemon_fds,
    store_bytes), `rates` (seconds, requests per second) per wrk run."""
    host: str
    form: str
    wrk: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    judged: Counter = field(default_factory=Counter)
    after: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    samples: list = field(default_factory=list)
    rates: list = field(default_factory=list)
    wrong_examples: list = field(default_factory=list)
    seconds: float = 0.0
    # wrk's failed answers by the second (Unix time) they came, and when each fault was on
    failed_at: Counter = field(default_factory=Counter)
    fault_windows: list = field(default_factory=list)

    SERIES = ("proxy_rss", "proxy_fds", "daemon_rss", "daemon_fds", "store_bytes")
    COUNTS = ("wrk", "errors", "judged", "after", "faults")

    def as_json(self):
        # not dataclasses.asdict: it makes each Counter again from its items, counting the pairs
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, record):
        """A run as `as_json` wrote it: JSON keeps a Counter as a plain object, its keys as strings."""
        return cls(**{**record, **{name: Counter(record[name]) for name in cls.COUNTS},
                      "failed_at": Counter({int(second): n for second, n in record["failed_at"].items()})})

    def series(self, name):
        index = self.SERIES.index(name) + 1
        return [sample[index] for sample in self.samples]

    def growing(self):
        return [name for name in self.SERIES if grows(self.series(name), *ALLOWANCE[name])]

    def wrong(self):
        """Every answer that must never be: wrk's wrong ones, the judged clients' wrong or
        garbled ones, and anything but right once the faults were over."""
        return (self.wrk["wrong"] + sum(self.judged[o] for o in judged_load.NEVER)
                + sum(n for o, n in self.after.items() if o != "right"))

    def unexplained(self):
        """What no fault allows, by kind: wrk's failed answers that came while no fault was on (nor
        within FAILED_MARGIN_S of one), wrk's timeouts, the judged clients' outcomes beyond
        JUDGED_ALLOWED."""
        def under_a_fault(second):
            return any(start - FAILED_MARGIN_S <= second <= end + FAILED_MARGIN_S for start, end in self.fault_windows)
        found = {
            "failed with no fault on": sum(n for second, n in self.failed_at.items() if not under_a_fault(second)),
            "wrk timeouts": self.errors["timeout"],
            "judged beyond what a fault allows": sum(n for o, n in self.judged.items() if o not in JUDGED_ALLOWED),
        }
        return {kind: n for kind, n in found.items() if n}

    def passed(self):
        return not self.wrong() and not self.unexplained() and not self.growing()


def failed_seconds(text):
    """soak.lua's "second:count," list as a Counter."""
    counts = Counter()
    for item in filter(None, text.split(",")):
        second, count = item.split(":")
        counts[int(second)] += int(count)
    return counts


def form_faults(form):
    names = NODE_FAULTS + (DAEMON_FAULTS if form == "warm" else ())
    chosen = [fault for fault in faults.FAULTS if fault.name in names]
    return chosen + [RELOAD]


def start_proxy(host, workdir, faulted, form):
    """`host` for `form`, in front of `faulted` (a faults.FaultedStack)."""
    return faults.start_proxy(host, workdir, faulted, cache=form == "warm", drain_time_s=DRAIN_TIME_S)


def warm_up(proxy, cases):
    """Each case asked once in each coding, so that what the cache keeps is kept (a miss stores it
    once answered); each answer must be right."""
    for kind, found in cases.items():
        for case in found:
            for accept_encoding in judged_load.ACCEPT_ENCODINGS:
                outcome, _ = judged_load.ask(proxy.port, judged_load.request_of(kind, case, 7), accept_encoding)
                if outcome != "right":
                    raise RuntimeError(f"warming the cache: {kind} in {accept_encoding}: {outcome}")


def soak(faulted, proxy, form, cases, requests_file, requests, seed=0, fault_every_s=FAULT_EVERY_S):
    """`requests` of the mix through `proxy` (started with the cache on for the warm form, off
    for the mix) over `faulted` (a faults.FaultedStack), with a fault every `fault_every_s` on
    average: a Soak."""
    result, rng, started = Soak(proxy.host, form), random.Random(seed), time.monotonic()
    judged_seeds = random.Random(seed + 1)
    stack = faulted.stack  # its daemon is another process after a kill -9
    if form == "warm":
        warm_up(proxy, cases)
    choices, reloads = form_faults(form), proxy_faults.of(proxy)

    def sample(stopping):
        master = proxy.pids[0]  # and nginx's workers
        proxy_rss, proxy_fds = resident([master, *children(master)])
        daemon_rss, daemon_fds = resident([stack.daemon.process.proc.pid])
        result.samples.append((time.monotonic() - started, proxy_rss, proxy_fds, daemon_rss or None,
                               daemon_fds or None, disk_bytes(stack.daemon.db)))
        stopping.wait(SAMPLE_S)

    def judged(stopping):
        tally = judged_load.load(proxy, cases, WRK_SEGMENT_S, judged_seeds.randrange(1 << 30), threads=JUDGED_THREADS)
        result.judged.update(tally.counts)
        result.wrong_examples += [repr(wrong) for wrong in tally.wrong][:max(0, 5 - len(result.wrong_examples))]

    def volume(stopping):
        run = wrk_segment(proxy.port, requests_file, WRK_SEGMENT_S)
        if not run["requests"]:
            raise RuntimeError(f"no request was answered in {WRK_SEGMENT_S} s: {run['errors']}")
        result.wrk.update({name: run[name] for name in ("requests", "right", "wrong", "failed", "carried_right")})
        result.errors.update(run["errors"])
        result.failed_at.update(failed_seconds(run["failed_at"]))
        result.rates.append((time.monotonic() - started, run["requests"] / run["seconds"]))
        if run["first_wrong"] and len(result.wrong_examples) < 5:
            result.wrong_examples.append(f"wrk: {run['first_wrong']}")
        if result.wrk["requests"] >= requests:
            stopping.set()

    stopping = threading.Event()
    workers = [Every(step, stopping, name=f"the soak's {step.__name__}") for step in (sample, judged, volume)]
    for worker in workers:
        worker.start()
    try:
        # the faults from this thread: what they start again (Toxiproxy, the daemon) is killed
        # when the thread that started it ends (harness: PR_SET_PDEATHSIG)
        while not stopping.wait(rng.expovariate(1 / fault_every_s)):
            chosen = rng.choice(choices) if result.faults[RELOAD] else RELOAD
            if chosen == RELOAD:
                reloads.act("reload")
            else:
                began = time.time()
                faulted.inject(chosen)
                try:
                    stopping.wait(FAULT_SECONDS)
                finally:
                    try:
                        faulted.heal(chosen)
                    finally:
                        result.fault_windows.append((began, time.time()))
            result.faults[chosen if chosen == RELOAD else chosen.name] += 1
    finally:
        stop_all(workers, stopping)
    reloads.check("reload", result.faults[RELOAD])
    tally = judged_load.Tally()
    judged_load.recovery(proxy, cases, tally)
    result.after.update(tally.after)
    result.judged.update(tally.counts)
    result.seconds = time.monotonic() - started
    return result
