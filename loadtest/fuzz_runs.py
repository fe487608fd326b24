"""`make fuzz` and `make test`'s fuzzing: each cargo-fuzz target of shared-core/fuzz for `--seconds`,
`--jobs` at a time (each a libFuzzer process of one thread), with AddressSanitizer. For each
target, libFuzzer's own figures go into `--results`: its runs and their rate, and the code edges
its corpus reached when read (`cov` at INITED) and when it stopped (at DONE), with the inputs it
started from. RELIABILITY.md's fuzzing table is rendered from results/fuzz.json. A target that
finds a crash fails the run with its last lines (the input in shared-core/fuzz/artifacts/).

    .venv/bin/python loadtest/fuzz_runs.py [--seconds 20] [--jobs 1] [--targets a,b] [--results PATH]

Expects `cargo +nightly fuzz build` done (the Makefile's fuzz targets do it) and the corpus seeded
(`make fuzz-seeds`).
"""

import argparse
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testbed import provenance
from testbed.harness import REPO

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results" / "fuzz.json"
FUZZ = REPO / "shared-core" / "fuzz"
# where `cargo fuzz build` puts the targets (its default triple and profile)
BINARIES = FUZZ / "target" / "x86_64-unknown-linux-gnu" / "release"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "Cargo.lock"]
RSS_LIMIT_MB = 2048
# libFuzzer's lines: "#1234\tINITED cov: 1735 ft: ..." (no cov where none was reached: an empty
# corpus), "#76340\tDONE   cov: 1851 ...", "Done 76340 runs in 21 second(s)", and how many inputs
# it was handed
INITED = re.compile(r"^#\d+\s+INITED\b(?:[^\n]*?\bcov: (\d+))?", re.M)
DONE = re.compile(r"^#\d+\s+DONE\s+cov: (\d+)", re.M)
RUNS = re.compile(r"^Done (\d+) runs in (\d+) second", re.M)
SEEDS = re.compile(r"INFO: (?:seed corpus: files: (\d+)|A corpus is not provided)")


def every_target():
    return sorted(path.stem for path in (FUZZ / "fuzz_targets").glob("*.rs"))


def figures(log):
    """libFuzzer's figures of a run that ended as asked, from its output; None for any other."""
    inited, ended, runs, seeds = INITED.search(log), DONE.search(log), RUNS.search(log), SEEDS.search(log)
    if not (inited and ended and runs):
        return None
    return {"runs": int(runs[1]), "seconds": int(runs[2]), "runs_per_s": round(int(runs[1]) / max(int(runs[2]), 1)),
            "cov_start": int(inited[1] or 0), "cov_end": int(ended[1]),
            "inputs_at_start": int(seeds[1]) if seeds and seeds[1] else 0}


def fuzz(target, seconds):
    """One target's run: (its figures, or None where it failed; its output)."""
    done = subprocess.run(["cargo", "+nightly", "fuzz", "run", target, "--",
                           f"-max_total_time={seconds}", f"-rss_limit_mb={RSS_LIMIT_MB}"],
                          cwd=FUZZ.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        return None, done.stdout
    found = figures(done.stdout)
    return found, done.stdout if found else done.stdout + "\n(it ended, but without libFuzzer's closing figures)"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--targets", default=",".join(every_target()))
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    targets = args.targets.split(",")
    if unknown := set(targets) - set(every_target()):
        parser.error(f"no fuzz target {', '.join(sorted(unknown))}")
    started = provenance.now()
    found, failed = {}, []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for target, (ran, log) in zip(targets, pool.map(lambda target: fuzz(target, args.seconds), targets)):
            if ran is None:
                failed.append(target)
                print(f"{target} failed:\n" + "\n".join(log.splitlines()[-40:]), flush=True)
                continue
            found[target] = ran
            print(f"{target}: {ran['runs']:,} runs in {ran['seconds']} s, cov {ran['cov_start']} → {ran['cov_end']}",
                  flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    provenance.write(args.results, {"seconds": args.seconds, "jobs": args.jobs, "targets": found, "failed": failed},
                     started, [BINARIES / target for target in targets])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
