"""`make faults`: the fault matrix (testbed/faults.py) in full. Each host in turn in front of the
replay node and a cache daemon, each behind Toxiproxy; every fault for `--seconds` of the mix
from many clients, then its recovery. The table goes to loadtest/results/faults.md (and
faults.json), which RELIABILITY.md explains.

    .venv/bin/python loadtest/faults.py [--seconds 15] [--hosts nginx,envoy] [--faults node-slicer]
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from testbed import faults
from testbed import judged_load
from testbed import provenance
from testbed.cache_cases import CORE_LIB
from testbed.envoy_harness import NATIVE, WASM
from testbed.harness import CACHED_BIN, REPO
from testbed.nginx_harness import MODULE

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "cached", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/faults.py",
            "testbed/judged_load.py", "testbed/cache_cases.py"]
WORK = REPO / "build" / "faults"


def never(cell):
    """The answers no cell may have: wrong or garbled under the fault (to the misbehaving client
    too), anything but right in the round after it."""
    counts, after, client = cell["counts"], cell["after"], cell.get("client", {})
    return (sum(counts.get(o, 0) + client.get(o, 0) for o in judged_load.NEVER)
            + sum(n for o, n in after.items() if o != "right"))


def client_text(cell):
    """What the misbehaving client saw, if the cell has one."""
    client = cell.get("client")
    if not client:
        return ""
    return "; the client: " + ", ".join(f"{client[o]} {o}" for o in judged_load.CLIENT_OUTCOMES if client.get(o))


# the fleet counters a fleet cell shows: its daemon's, from the fault on (fleet_cell.FleetDaemon)
FLEET_SHOWN = {"fleet_hits_total": "hits", "fleet_misses_total": "misses", "fleet_errors_total": "errors",
               "fleet_timeouts_total": "timeouts", "fleet_skipped_total": "skipped (breaker open)",
               "fleet_breaker_opened_total": "times the breaker opened"}


def fleet_text(cell):
    """What the fleet's daemons counted, if the cell is the fleet's."""
    fleet = cell.get("fleet")
    if not fleet:
        return ""
    return "; the fleet: " + ", ".join(f"{fleet.get(name, 0)} {what}" for name, what in FLEET_SHOWN.items())


def recovery_text(cell):
    return "none" if cell["recovery_s"] is None else f"{cell['recovery_s']:.1f} s"


def cell_text(cell):
    counts = cell["counts"]
    total = sum(counts.values())
    shares = (", ".join(f"{counts[o]} {o}" for o in judged_load.OUTCOMES if counts.get(o)) + client_text(cell)
              + fleet_text(cell))
    return total, shares, never(cell), recovery_text(cell)


def shares(cell):
    """A matrix cell: each outcome's share of the answers, and the recovery."""
    counts = cell["counts"]
    total = sum(counts.values()) or 1
    # one decimal near the ends, so that 99.8 % does not read as all
    percent = lambda count: f"{100 * count / total:.{1 if 0 < min(count, total - count) * 100 < total else 0}f} %"  # noqa: E731
    parts = [f"{percent(counts[o])} {o}" for o in judged_load.OUTCOMES if counts.get(o) and o not in judged_load.NEVER]
    wrong = never(cell)
    return (f"{', '.join(parts)}; {f'**{wrong} wrong**' if wrong else '0 wrong'}; {recovery_text(cell)}"
            + client_text(cell))


def matrix(cells):
    """Fault by host: the share of each outcome, the wrong answers, then the recovery."""
    hosts = list(dict.fromkeys(cell["host"] for cell in cells))
    by = {(cell["fault"], cell["host"]): cell for cell in cells}
    lines = ["| fault | " + " | ".join(hosts) + " |", "| --- |" + " --- |" * len(hosts)]
    for fault in dict.fromkeys(cell["fault"] for cell in cells):
        row = [shares(by[fault, host]) if (fault, host) in by else "" for host in hosts]
        lines.append(f"| {fault} | " + " | ".join(row) + " |")
    return lines


def fleet_link(cells):
    """The fleet's cells: the answers (and whether every one was right), then what the cell's
    daemon counted of the fleet from the fault on."""
    lines = ["| fault | host | answers | fleet hits | timeouts | errors | skipped | breaker opened |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    faults_order = list(dict.fromkeys(cell["fault"] for cell in cells))
    hosts = list(dict.fromkeys(cell["host"] for cell in cells))
    for cell in sorted(cells, key=lambda cell: (faults_order.index(cell["fault"]), hosts.index(cell["host"]))):
        fleet = cell.get("fleet")
        if not fleet:
            continue
        total = sum(cell["counts"].values())
        answers = f"{total:,}, all right" if cell["counts"].get("right", 0) == total else f"{total:,}: {cell_text(cell)[1]}"
        counted = " | ".join(f"{fleet.get(name, 0):,}" for name in ("fleet_hits_total", "fleet_timeouts_total",
                                                                     "fleet_errors_total", "fleet_skipped_total",
                                                                     "fleet_breaker_opened_total"))
        lines.append(f"| {cell['fault']} | {cell['host']} | {answers} | {counted} |")
    return lines


def dirty_text(session):
    """What the run measured beyond its commit: files that differed from it."""
    dirty = session.get("provenance", {}).get("dirty")
    return f" (**and changes not committed:** {', '.join(dirty)})" if dirty else ""


def markdown(session, cells):
    lines = [
        "# The fault matrix",
        "",
        f"{session['date']}; head {session['head']}{dirty_text(session)}; {session['seconds']} s of load per cell from "
        f"{judged_load.LOAD_THREADS} clients on fresh connections (the mix: blocks and receipts the cache keeps, "
        "calls at `latest` it passes, traces over max_buffer that stream, a batch; gzip, identity and "
        f"zstd clients); the node's timeout {faults.NODE_TIMEOUT_S} s in every host; recovery is the time "
        "from the fault's end until one request of each kind in each coding is right.",
        "Generated by `make faults` (`loadtest/faults.py`); what each outcome means: testbed/judged_load.py. "
        "*Wrong* counts every answer that must never be: wrong or garbled under the fault, and anything "
        "but right when every case is asked again after it.",
        "",
        "Each outcome's share of the answers, the wrong answers, then the recovery:",
        "",
        *matrix(cells),
        "",
        "Counts:",
        "",
        "| fault | host | answers | outcomes | wrong | recovery |",
        "| --- | --- | ---: | --- | ---: | ---: |",
    ]
    for cell in cells:
        total, shares, wrong, recovered = cell_text(cell)
        lines.append(f"| {cell['fault']}: {cell['what']} | {cell['host']} | {total} | {shares} | {wrong} | "
                     f"{recovered} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--hosts", default=",".join(faults.HOSTS))
    parser.add_argument("--faults", default=",".join(f.name for f in faults.FAULTS))
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    chosen = [f for f in faults.FAULTS if f.name in args.faults.split(",")]
    hosts = args.hosts.split(",")
    unknown = set(args.faults.split(",")) - {f.name for f in chosen} | set(hosts) - set(faults.HOSTS)
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    started = provenance.now()
    cases = judged_load.mix_cases()
    shutil.rmtree(WORK, ignore_errors=True)  # the stores of an earlier run among them
    WORK.mkdir(parents=True)
    cells = []
    with faults.faulted_stack(WORK, cases) as faulted:
        for host in hosts:
            proxy = faults.start_proxy(host, WORK / host, faulted)
            try:
                for seed, fault in enumerate(chosen):
                    if not faults.applies(fault, host):
                        continue
                    if reason := faults.unavailable(fault):
                        print(f"{host:13} {fault.name:26} skipped: {reason}", flush=True)
                        continue
                    tally, recovered = faults.run_cell(faulted, proxy, fault, cases, args.seconds, seed)
                    cell = {"fault": fault.name, "what": fault.what, "host": host, "counts": dict(tally.counts),
                            "after": dict(tally.after), "client": dict(tally.client), "recovery_s": recovered,
                            "wrong_examples": [repr(w) for w in tally.wrong], "notes": tally.notes,
                            "failures": faults.failures(fault, tally, recovered)}
                    if fault.link == "fleet":
                        cell["fleet"] = {name: faulted.fleet_counts[name] for name in FLEET_SHOWN}
                    cells.append(cell)
                    total, shares, wrong, recovery = cell_text(cell)
                    print(f"{host:13} {fault.name:26} {total:6} answers: {shares}; wrong {wrong}; "
                          f"recovery {recovery}{''.join(f'; {note}' for note in tally.notes)}", flush=True)
            finally:
                proxy.stop()
    # the modules of hosts not run are hashed too: each is what `make faults` built
    measured = [MODULE, WASM, NATIVE, CORE_LIB, CACHED_BIN]
    session = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": args.seconds,
               "head": provenance.git("rev-parse", "--short", "HEAD"),
               "provenance": provenance.of_run(started, measured)}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "faults.json").write_text(json.dumps({"session": session, "cells": cells}, indent=1) + "\n")
    (args.results / "faults.md").write_text(markdown(session, cells))
    failed = [cell for cell in cells if cell["failures"]]
    for cell in failed:
        print(f"FAILED {cell['host']} {cell['fault']}: {'; '.join(cell['failures'])}")
    wrong = sum(never(cell) for cell in cells)
    print(f"{len(cells)} cells, {len(failed)} failed, {wrong} wrong answers; {args.results / 'faults.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
