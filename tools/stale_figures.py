"""Lists every result under loadtest/results/ that BENCHMARKS.md and RELIABILITY.md may not cite as
it stands: one with no provenance (testbed/provenance.py), one measured on a tree that differed
from its commit, and one whose commit is older than the last change to what its bench measures
(the bench's MEASURES). Prints nothing when every result is fresh; `make bench` runs it last.

    .venv/bin/python tools/stale_figures.py
"""

import importlib
import json
import subprocess
import sys

from testbed.harness import REPO
from testbed.provenance import git

LOADTEST = REPO / "loadtest"
RESULTS = LOADTEST / "results"
# the benches that write into a folder: their results by name (several runs each, kept apart; bench.py's
# in a folder of their own: results/browser/)
FOLDER_BENCHES = {"bench": "**/results.json", "faults": "faults*.json", "soak": "soak*.json"}


def bench_modules():
    """(script, module) of each bench: a script of loadtest/ that says what it MEASURES."""
    sys.path.insert(0, str(LOADTEST))
    for script in sorted(LOADTEST.glob("*.py")):
        bench = importlib.import_module(script.stem)
        if hasattr(bench, "MEASURES"):
            yield script, bench


def benches():
    """(result file, the paths its figures measure) for each result a bench wrote."""
    for script, bench in bench_modules():
        files = (sorted(RESULTS.glob(FOLDER_BENCHES[script.stem])) if script.stem in FOLDER_BENCHES
                 else [bench.RESULTS] if bench.RESULTS.exists() else [])
        for result in files:
            yield result, [*bench.MEASURES, str(script.relative_to(REPO))]


def claimed():
    """The paths under a crate's benches/ (a criterion bench's harness) that some bench names in its
    MEASURES: each counts only for the benches that name it, so that a change to one bench's harness
    leaves the figures of benches that measure its crate and not that harness as they were."""
    return sorted({path for _, bench in bench_modules() for path in bench.MEASURES if "/benches/" in path})


def provenance_of(result):
    record = json.loads(result.read_text())
    if isinstance(record, dict):
        return record.get("provenance") or record.get("session", {}).get("provenance")
    return None


def why_stale(result, measures, harnesses=()):
    found = provenance_of(result)
    if not found:
        return "no provenance: the commit and binaries it measured are unknown"
    commit = found["commit"]
    if found["dirty"]:
        return f"measured on {commit[:9]} with changes not committed: {', '.join(found['dirty'])}"
    try:
        git("merge-base", "--is-ancestor", commit, "HEAD")
    except subprocess.CalledProcessError:
        return f"measured on {commit[:9]}, which is not in this branch's history"
    # what is measured is the code that runs: a change to its documentation or to its tests leaves
    # the figures as they were
    named = {path.rstrip("/") for path in measures}
    # a bench that names a file of the tests (the corpus reader its harness shares) measures it
    tests = [] if any("/tests/" in path for path in named) else [":(exclude,glob)**/tests.rs", ":(exclude,glob)**/tests/**"]
    code = [*measures, ":(exclude)*.md", *tests, *(f":(exclude){path}" for path in harnesses if path not in named)]
    changed = git("log", "--format=%h", f"{commit}..HEAD", "--", *code).split()
    if changed:
        files = git("diff", "--name-only", commit, "HEAD", "--", *code).split()
        shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
        return (f"measured on {commit[:9]}; {len(changed)} commit{'s' * (len(changed) > 1)} since changed what it "
                f"measures: {shown}")
    return None


def main():
    harnesses = claimed()
    for result, measures in benches():
        if reason := why_stale(result, measures, harnesses):
            print(f"stale: {result.relative_to(REPO)}: {reason}")


if __name__ == "__main__":
    main()
