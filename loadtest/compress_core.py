"""`make bench`, the compressors side by side: `cargo bench -p rpcedge-core --bench compress`
(libdeflate at levels 1, 4, 6 and 9 against zlib-rs and miniz_oxide at 1 and 6, one-shot, on the
corpus's bodies by size bucket; shared-core/benches/compress.rs) run once, and the table it prints
kept line by line in results/compress.json with the run's provenance. BENCHMARKS.md's table is
rendered from it.

    .venv/bin/python loadtest/compress_core.py
"""

import subprocess
from pathlib import Path

from testbed import provenance
from testbed.harness import REPO
from testbed.printed_tables import printed_tables

LOADTEST = Path(__file__).resolve().parent
RESULTS = LOADTEST / "results" / "compress.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core/src/compress", "shared-core/src/compress.rs", "shared-core/benches/compress.rs",
            "shared-core/benches/common", "shared-core/tests/common/corpus.rs", "corpus-reader", "shared-core/Cargo.toml",
            "Cargo.lock"]
TABLES = {"codecs": "| bucket | bodies | bytes | codec |"}


def main():
    started = provenance.now()
    done = subprocess.run(["cargo", "bench", "-p", "rpcedge-core", "--bench", "compress", "--locked"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"cargo bench failed:\n{done.stderr[-4000:]}")
    found = printed_tables(done.stdout, TABLES)
    if len(found.get("codecs", [])) <= 2:
        raise RuntimeError(f"the bench printed no table:\n{done.stdout[-2000:]}")
    provenance.write(RESULTS, {"tables": found}, started)
    print(f"results: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
