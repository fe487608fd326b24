"""`make bench`: the load test. wrk replays real JSON-RPC requests from the corpus through every
proxy variant (testbed/variants.py) in front of the replay upstream, one scenario after the
other (testbed/scenarios.py), and the results go to loadtest/results/ (testbed/report.py).

    .venv/bin/python loadtest/bench.py [--runs 3] [--duration 5] [--variants nginx-gzip6,nginx-rpcedge-default] [--scenarios mix]

Everything listens on 127.0.0.1 and every run is bounded: wrk runs for a fixed time with a fixed
number of connections (per scenario), after a warm-up. Every cell runs `--runs` times, in rounds
(each round starts every variant afresh and runs it through every scenario), so that a slow
minute of this shared machine lands on one run of every variant rather than on all runs of one;
the report keeps the medians and the spread. The proxy gets a CPU of its own (taskset);
wrk and the upstream share the others, so req/s is the lesser of what the proxy and the client
side can do, and the proxy's CPU time per request (utime + stime from /proc of its worker
processes, or of the Envoy process) is the fair measure of its cost.
"""

import argparse
import json
import os
import re
import resource
import shutil
import sys
import time
from pathlib import Path

from testbed import provenance, report, scenarios, variants
from testbed.harness import CORPUS, LOOPBACK, REPO, StartError, corpus_description, start_replay
from testbed.wrk import run_wrk

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/variants.py",
            "testbed/scenarios.py", "testbed/wrk.py", "loadtest/wrk"]
WORK = REPO / "build" / "bench"
SCRIPT = LOADTEST / "wrk" / "replay.lua"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A response slower than this is a wrk timeout error; far above any latency seen here.
WRK_TIMEOUT = "10s"
DRAIN = 0.5  # seconds between the warm-up and the measured run
# A run that other processes disturbed (see report.DISTURBED) is run once more, so many times at most
# per session, so that a busy machine cannot stretch the session much.
RERUNS = 10
# Proxy log lines worth a look, whatever the client saw: nginx's warnings and worse (e.g. bodies
# spilled to temporary files) and Envoy's errors (its warnings are start-up and shutdown notes).
LOG_PROBLEM = re.compile(r"\[(warn|error|crit|critical|alert|emerg)\]")


def split_cpus():
    """(the proxy's CPU, the CPUs of everything else), or (None, all) on a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, cpus
    return cpus[0], cpus[1:]


def pinned(work):
    """Pins this process (and so the wrk and the node it starts) to the CPUs that the proxy does
    not use, and empties `work`: (the proxy's CPU, the argv prefix that runs a proxy on it)."""
    proxy_cpu, other_cpus = split_cpus()
    os.sched_setaffinity(0, other_cpus)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return proxy_cpu, ("taskset", "-c", str(proxy_cpu)) if proxy_cpu is not None else ()


def cpu_seconds(pids):
    """User plus system CPU time of processes so far (all their threads)."""
    ticks = 0
    for pid in pids:
        # the fields after the command name, which may itself hold spaces and parentheses
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLOCK_TICKS


def busy_seconds():
    """CPU time the machine spent on anything so far, all CPUs: user, system and steal (time the
    host gave to other machines)."""
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
    return (user + nice + system + steal) / CLOCK_TICKS


def own_seconds():
    """CPU time of this process and of its children it waited for (wrk) so far."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def wrk(port, connections, request_list, accept_encoding, seconds, header=None):
    """One wrk run: (the RESULT of loadtest/wrk/replay.lua, wrk's whole output)."""
    return run_wrk(["-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", WRK_TIMEOUT, "-s", SCRIPT,
                    f"http://{LOOPBACK}:{port}", "--", request_list, accept_encoding, *([header] if header else [])],
                   seconds)


def measure(running, replay_pid, variant, scenario, request_list, duration, warmup):
    """A warm-up run (connections, upstream keep-alive, allocators), then the measured one, with
    the proxy's CPU time and that of processes other than the proxy, the replay and wrk."""
    wrk(running.port, scenario.connections, request_list, variant.accept_encoding, warmup)
    # wrk leaves its last requests unanswered: let the proxy drop them before counting its CPU.
    time.sleep(DRAIN)

    def clocks():
        return cpu_seconds(running.cpu_pids), cpu_seconds([replay_pid]), own_seconds(), busy_seconds()

    before = clocks()
    stats, output = wrk(running.port, scenario.connections, request_list, variant.accept_encoding, duration)
    proxy, replay, own, busy = (b - a for a, b in zip(before, clocks()))
    # Below zero when the processes' clocks and the machine's (accounted differently by the
    # kernel) disagree: nothing else ran then.
    other = max(0.0, busy - proxy - replay - own) / (stats["duration_us"] / 1e6)
    return report.Row.of(variant, scenario, stats, proxy if running.cpu_pids else None, other), output


def log_problems(running):
    """The proxy's log lines that LOG_PROBLEM matches."""
    if running.log is None or not running.log.exists():
        return []
    return [line for line in running.log.read_text(errors="replace").splitlines() if LOG_PROBLEM.search(line)]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per variant and scenario (rounds)")
    parser.add_argument("--duration", type=int, default=5, help="seconds per measured run")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up before each run")
    parser.add_argument("--variants", help="comma-separated names (default: all)")
    parser.add_argument("--scenarios", help="comma-separated names (default: all)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the table and plots go")
    parser.add_argument("--node-gzip", action="store_true",
                        help="the node gzips its answers when asked, as geth and erigon do (replay --gzip-when-asked)")
    args = parser.parse_args()
    args.variants = pick(variants.VARIANTS, args.variants)
    args.scenarios = pick(scenarios.SCENARIOS, args.scenarios)
    return args


def pick(items, names):
    if names is None:
        return items
    known = {item.name: item for item in items}
    unknown = [n for n in names.split(",") if n not in known]
    if unknown:
        sys.exit(f"unknown: {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names.split(",")]


def main():
    args = parse_args()
    started = time.monotonic()
    proxy_cpu, other_cpus = split_cpus()
    # wrk and the replay, children of this process, inherit this; the proxies run under taskset.
    os.sched_setaffinity(0, other_cpus)
    proxy_prefix = ("taskset", "-c", str(proxy_cpu)) if proxy_cpu is not None else ()
    raw = args.results / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    run_started = provenance.now()
    session = report.Session.now(proxy_cpu, other_cpus, args.duration, args.warmup, args.runs)
    print(f"rpcedge load test: {len(args.variants)} variants x {len(args.scenarios)} scenarios x {args.runs} rounds, "
          f"{args.warmup} s warm-up + {args.duration} s each; proxy on CPU {proxy_cpu}, "
          f"wrk and upstream on {other_cpus}; load average before: {session.load_average}", flush=True)

    print(f"starting the replay upstream over {corpus_description()} ...", flush=True)
    replay = start_replay(WORK, args=["--gzip-when-asked"] if args.node_gzip else [])
    steal_before, total_before = report.cpu_ticks()
    runs, problems, descriptions, reruns = {}, {}, {}, 0
    try:
        lists = scenarios.write_lists(replay, CORPUS, WORK / "requests")
        for scenario in args.scenarios:
            requests = lists[scenario.name][1]
            descriptions[scenario.name] = (
                f"{scenario.title}, {len(requests)} requests ({len({r.recording for r in requests})} distinct), "
                f"mean answer {sum(r.answer_bytes for r in requests) / len(requests):.0f} B")
            print(f"  {scenario.name}: {descriptions[scenario.name]}, {scenario.connections} connections", flush=True)
        total, done = len(args.variants) * len(args.scenarios) * args.runs, 0
        for round_number in range(1, args.runs + 1):
            for variant in args.variants:
                running = variants.start(variant, replay.port, WORK, proxy_prefix)
                try:
                    for scenario in args.scenarios:
                        row, output = measure(running, replay.process.proc.pid, variant, scenario,
                                              lists[scenario.name][0], args.duration, args.warmup)
                        if row.other_cpu > report.DISTURBED and reruns < RERUNS:
                            reruns += 1
                            print(f"  other processes took {row.other_cpu:.0%} of a CPU during "
                                  f"{variant.name} {scenario.name}: once more", flush=True)
                            row, output = measure(running, replay.process.proc.pid, variant, scenario,
                                                  lists[scenario.name][0], args.duration, args.warmup)
                        (raw / f"{variant.name}--{scenario.name}--{round_number}.txt").write_text(output)
                        runs.setdefault((variant.name, scenario.name), []).append(row)
                        done += 1
                        print(f"[{done:3}/{total}] {time.monotonic() - started:5.0f} s  {row.progress()}", flush=True)
                finally:
                    running.stop()
                if lines := log_problems(running):
                    problems.setdefault(variant.name, lines)
                    print(f"  {variant.label}: {len(lines)} warnings or errors in its log, first: {lines[0]}", flush=True)
    except StartError as error:
        print(error, file=sys.stderr)
        return 1
    finally:
        if args.node_gzip:
            # what the node compressed: rpcedge asks it for identity, so only variants without it
            _, _, stats = replay.request("GET", "/stats")
            print(f"the node gzipped {json.loads(stats)['gzip_answers']} answers", flush=True)
        replay.process.stop()

    # one row per variant and scenario, variants in their order, each with its scenarios in theirs
    rows = [report.Row.median(runs[(v.name, s.name)]) for v in args.variants for s in args.scenarios]
    steal_after, total_after = report.cpu_ticks()
    session.steal = f"{100 * (steal_after - steal_before) / (total_after - total_before):.1f}%"
    report.write(args.results, session, rows, problems, descriptions, provenance.of_run(run_started))
    print()
    print(report.ratios_text(rows))
    print(f"\nresults in {args.results} ({time.monotonic() - started:.0f} s)")
    return 1 if any(row.errors for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
