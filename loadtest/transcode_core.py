"""`make bench`, the transcoder's own speed: `cargo bench -p rpcedge-core --bench transcode` (the
corpus's largest witness and a deneb block, rpcedge's transcoder against serde + ssz_rs, both
ways) run `--runs` times, one after another; each run's criterion medians, and the witness's JSON
and SSZ sizes the bench prints, into results/transcode-core.json with the run's provenance.
BENCHMARKS.md's transcoding table is rendered from it, each goal judged by its worst run.

    .venv/bin/python loadtest/transcode_core.py [--runs 3]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from testbed import provenance
from testbed.harness import REPO

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results" / "transcode-core.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core/src/transcode", "shared-core/benches/transcode.rs", "shared-core/Cargo.toml", "Cargo.lock"]
# where criterion writes: $CRITERION_HOME, or the target folder's criterion/
CRITERION = Path(os.environ.get("CRITERION_HOME") or Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "criterion")
GROUPS = ["witness json->ssz", "witness ssz->json", "block json->ssz", "block ssz->json"]


def one_run():
    """One run of the bench: each group's functions' median time and throughput bytes; the
    witness's JSON and SSZ sizes."""
    # an earlier run's figures are gone before this one: none of them can stand for it
    for group in GROUPS:
        shutil.rmtree(CRITERION / group.replace(">", "_"), ignore_errors=True)
    done = subprocess.run(["cargo", "bench", "-p", "rpcedge-core", "--bench", "transcode", "--locked"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    sizes = re.search(r"witness: (\d+) B of JSON, (\d+) B of SSZ", done.stdout)
    if not sizes:
        raise RuntimeError(f"the bench no longer prints the witness's sizes:\n{done.stdout[-2000:]}")
    groups = {}
    for found in CRITERION.glob("*/*/new/benchmark.json"):
        bench = json.loads(found.read_text())
        if bench["group_id"] not in GROUPS:
            continue
        median_ns = json.loads((found.parent / "estimates.json").read_text())["median"]["point_estimate"]
        groups.setdefault(bench["group_id"], {})[bench["function_id"]] = {
            "median_ns": median_ns, "bytes": bench["throughput"]["Bytes"]}
    missing = [group for group in GROUPS if len(groups.get(group, {})) != 2]
    if missing:
        raise RuntimeError(f"criterion wrote no figures of {', '.join(missing)} under {CRITERION}")
    return {"groups": groups, "witness_json_bytes": int(sizes[1]), "witness_ssz_bytes": int(sizes[2])}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    started = provenance.now()
    runs = []
    for number in range(args.runs):
        runs.append(one_run())
        print(f"run {number + 1}: " + ", ".join(
            f"{group} {figures['rpcedge']['bytes'] / figures['rpcedge']['median_ns'] * 1e9 / 2**30:.2f} GiB/s"
            for group, figures in sorted(runs[-1]["groups"].items())), flush=True)
    provenance.write(RESULTS, {"runs": runs}, started)
    print(f"results: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
