"""`make bench`, which level pays: `cargo bench -p rpcedge-core --bench level` (every coding's levels
on the corpus's bodies, bucket by bucket; shared-core/benches/level.rs) run once, and the two
tables it prints (each level's time, ratio and bytes saved per extra µs; the stock compressors'
bytes beside libdeflate's levels) kept line by line in results/level.json with the run's
provenance. level.md's tables are rendered from it.

    .venv/bin/python loadtest/level_core.py [--codings gzip,zstd,br]
"""

import argparse
import subprocess
from pathlib import Path

from testbed import provenance
from testbed.printed_tables import printed_tables
from testbed.harness import REPO

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results" / "level.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core/src/compress", "shared-core/src/compress.rs", "shared-core/benches/level.rs",
            "shared-core/benches/common", "shared-core/tests/common/corpus.rs", "corpus-reader", "shared-core/Cargo.toml",
            "Cargo.lock"]
CODINGS = ("gzip", "zstd", "br")
# the first line of each table the bench prints
TABLES = {"levels": "| coding | bucket |", "stock": "| bucket | zlib 6"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codings", default=",".join(CODINGS))
    args = parser.parse_args()
    started = provenance.now()
    outputs = []
    for coding in args.codings.split(","):
        done = subprocess.run(["cargo", "bench", "-p", "rpcedge-core", "--bench", "level", "--locked", "--", coding],
                              cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"cargo bench failed:\n{done.stderr[-4000:]}")
        outputs.append(done.stdout)
        print(f"{coding}: done", flush=True)
    found = printed_tables("\n".join(outputs), TABLES)
    if len(found.get("levels", [])) <= 2:
        raise RuntimeError("the bench printed no table of levels")
    provenance.write(RESULTS, {"codings": args.codings.split(","), "tables": found}, started)
    print(f"results: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
