"""The figure tables of RELIABILITY.md and BENCHMARKS.md, rendered from the result files they
come from, so that no figure in them is copied by hand (issue 66). A table sits between
`<!-- table: NAME -->` and `<!-- /table -->`; NAME is one of TABLES, which says which file it
is made from and how. The line under the marker names the file and the run (its date and head).

    .venv/bin/python tools/render_tables.py          # rewrites the tables from the files
    .venv/bin/python tools/render_tables.py --check  # fails where a document differs
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "loadtest"))

import faults  # noqa: E402  (loadtest/faults.py, which renders its own results)
import goals  # noqa: E402  (loadtest/goals.py: the goals the load tests' figures judge)
import soak  # noqa: E402  (loadtest/soak.py, which renders its own results)
from testbed.soak import Soak  # noqa: E402

DOCUMENTS = ["RELIABILITY.md", "BENCHMARKS.md", "loadtest/results/fleet.md", "loadtest/results/instructions.md",
             "loadtest/results/level.md"]

# name: (the result file, relative to the repository, and what of it makes the table's lines)
TABLES = {
    "faults-matrix": ("loadtest/results/faults.json", lambda results: faults.matrix(results["cells"])),
    "faults-fleet": ("loadtest/results/faults.json", lambda results: faults.fleet_link(results["cells"])),
    "goals-defaults": ("loadtest/results/results.json", goals.defaults_table),
    "goals-cache": ("loadtest/results/cache.json", goals.cache_table),
    "goals-fleet": ("loadtest/results/fleet.json", goals.fleet_table),
    "goals-batch": ("loadtest/results/batch.json", goals.batch_table),
    "goals-herd": ("loadtest/results/herd.json", goals.herd_table),
    "goals-scan": ("loadtest/results/scan.json", goals.scan_table),
    "goals-wal": ("loadtest/results/cached.json", goals.wal_table),
    "goals-witness": ("loadtest/results/witness.json", goals.witness_table),
    "goals-dictionary": ("loadtest/results/dictionary.json", goals.dictionary_table),
    "fleet-sim": ("loadtest/results/fleet-sim.json", goals.fleet_sim_table),
    "goals-transcode": ("loadtest/results/transcode-core.json", goals.transcode_table),
    "instructions": ("loadtest/results/instructions.json", goals.instructions_table),
    "goals-browser": ("loadtest/results/browser/results.json", goals.browser_table),
    "fuzz": ("loadtest/results/fuzz.json", goals.fuzz_table),
    "soak": ("loadtest/results/soak.json", lambda results: soak.table([Soak.from_json(run) for run in results["runs"]])),
    # the criterion benches' own tables, as they printed them
    "compress": ("loadtest/results/compress.json", lambda results: results["tables"]["codecs"]),
    "level": ("loadtest/results/level.json", lambda results: results["tables"]["levels"]),
    "level-stock": ("loadtest/results/level.json", lambda results: results["tables"].get("stock", ["(gzip not in this run)"])),
}

MARKED = re.compile(r"^(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)^(<!-- /table -->)", re.S | re.M)
# every marker that begins a line, well formed or not: a table's end must follow its start
# before the next start (a marker within a line is prose that names one)
MARKERS = re.compile(r"^<!-- */?table\b[^>]*-->", re.M)


def run_line(results):
    """The run a result file holds: when, on what commit and machine, and what differed from the
    commit; its session's date and head where it has no provenance."""
    session = results.get("session", {})
    found = results.get("provenance") or session.get("provenance")
    if not found:
        return f"{session.get('date', 'undated')}, head {session.get('head', 'unknown')}, no provenance"
    machine = found["machine"]
    dirty = f" (**and changes not committed:** {', '.join(found['dirty'])})" if found["dirty"] else ""
    return (f"{found['started'].replace('T', ' ')[:16]} to {found['ended'].replace('T', ' ')[11:16]} UTC, "
            f"commit {found['commit'][:9]}{dirty}, {machine['cpus']} CPUs ({machine['model']})")


def rendered(name, root=REPO, document="BENCHMARKS.md"):
    """The table `name` as its file says it: a line naming the file (linked from `document`) and
    the run, then the table."""
    if name not in TABLES:
        raise KeyError(f"no table {name!r}: the tables are {', '.join(TABLES)}")
    path, lines = TABLES[name]
    results = json.loads((root / path).read_text())
    link = os.path.relpath(path, Path(document).parent)
    return "\n".join([f"*From [{Path(path).name}]({link}): {run_line(results)}.*", "", *lines(results)]) + "\n"


def render(text, root=REPO, document="BENCHMARKS.md"):
    """`text` (of `document`, relative to the repository) with every marked table rendered again.
    A marker out of place or misspelt, or a table of no known name, is an error: rendering past it
    would replace the text up to the next end."""
    markers = [m.group() for m in MARKERS.finditer(text)]
    starts = [f"<!-- table: {name} -->" for name in TABLES]
    for at, marker in enumerate(markers):
        expected = "<!-- /table -->" if at % 2 else "a table's start"
        if (marker != expected) if at % 2 else (marker not in starts):
            raise ValueError(f"{marker!r} where {expected} should be (the tables: {', '.join(TABLES)})")
    if len(markers) % 2:
        raise ValueError(f"{markers[-1]!r} has no <!-- /table --> after it")
    return MARKED.sub(lambda m: m.group(1) + rendered(m.group("name"), root, document) + m.group(4), text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; fail where a table differs")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    stale = []
    for document in DOCUMENTS:
        path = args.root / document
        text = path.read_text()
        try:
            new = render(text, args.root, document)
        except ValueError as error:
            print(f"{document}: {error}", file=sys.stderr)
            return 2
        if new == text:
            continue
        stale.append(document)
        if not args.check:
            path.write_text(new)
    if args.check and stale:
        print(f"tables that differ from their result files in {', '.join(stale)}: run tools/render_tables.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
