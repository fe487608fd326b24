"""Makes corpus-sample/, the part of the shared corpus that ships in the repository, so that a
clone with nothing beside it can `make run` (the replay node serves it) and the Docker stack has
a node to put behind the proxies. The choice is a rule over the shared corpus's index, not a list,
and the same corpus always gives the same sample:

  rpc/      per method and network, the smallest recording with a real (not placeholder) answer;
            per method of the load test's mix, the smallest recordings it can use; per load-test
            size bucket (testbed/scenarios.py), the smallest recordings with an
            answer in it; the smallest bzip2 tarballs holding a trace answer over 1 MiB; the
            smallest block by hash of 64 KiB or more (the daemon keeps such an answer plain
            beside its stream: tests/test_cache_hosts.py's big-answer test); of the
            witnesses whose headers are JSON objects (geth's form) and whose call no other
            recording makes, the smallest of the latest fork (most header fields); and the
            recordings that the README's examples ask for. index.jsonl keeps their rows.
  witness/  the smaller ethrex-replay witness (hoodi block 0x134ff8).
  ssz/      per fork, the smallest SignedBeaconBlock case; deneb's first BlobSidecar case; fulu's
            smallest DataColumnSidecar; altair's
            and electra's smallest light client bootstrap, finality and optimistic update; every
            light-client fork's smallest LightClientUpdate (the updates route's tests); the real
            deneb blinded block. (A random BeaconState case is 8.6 MB: states are not sampled.)
  licenses/ the sources' licences, as in the shared corpus.

    .venv/bin/python tools/corpus_sample.py [--corpus ../shared/corpus] [--out corpus-sample]

It refuses to write a sample over 8 MiB.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

from testbed.scenarios import MIX_LARGEST, MIX_PER_MILLE, SIZE_BUCKETS

REPO = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
LIMIT = 8 * MiB
PER_MIX_METHOD = 3  # recordings per method of the load test's mix
PER_BUCKET = 6  # recordings per load-test size bucket, each a file of at most:
BUCKET_FILE_MAX = 512 * 1024  # (the big answers come as bzip2 tarballs, which fit)
BIG_TRACES = 4  # tarballs holding a trace answer over 1 MiB
BIG_BLOCK = 64 * 1024  # the smallest answer the cache daemon keeps plain beside its stream
# Recordings that the README and `make run`'s banner ask for.
EXAMPLES = ["eth_getBlockByNumber/erigon-rpc-tests__mainnet__test_04.json"]
WITNESS = "witness/ethrex-replay/cache_hoodi_1265656.json"
FORKS = ["phase0", "altair", "bellatrix", "capella", "deneb", "electra", "fulu"]
# the light client's header without and with the execution payload's, branches of both depths
LIGHT_CLIENT_FORKS = ["altair", "electra"]
LIGHT_CLIENT_TYPES = ["LightClientBootstrap", "LightClientFinalityUpdate", "LightClientOptimisticUpdate"]
UPDATE_FORKS = FORKS[1:]  # every fork with a light client
SSZ_STATIC = "ssz/ssz_static/tests/mainnet/{fork}/ssz_static/{type}/ssz_random"


def real_pairs(row):
    return [pair for pair in row["pairs"] if not pair["placeholder_response"]]


def rpc_choice(rows, *also):
    rows = [row for row in rows if real_pairs(row)]
    by_size = sorted(rows, key=lambda row: (row["file_bytes"], row["path"]))
    chosen = {}
    for row in by_size:
        chosen.setdefault((row["method"], row["network"]), row)
    picked = {row["path"] for row in chosen.values()}
    for method in MIX_PER_MILLE:
        usable = [row for row in by_size if row["method"] == method and any(
            not (pair["error"] or pair["batch"]) and pair["resp_bytes"] <= MIX_LARGEST for pair in real_pairs(row))]
        picked.update(row["path"] for row in usable[:PER_MIX_METHOD])
    for smallest, largest in SIZE_BUCKETS.values():
        in_bucket = [row for row in by_size if row["file_bytes"] <= BUCKET_FILE_MAX
                     and any(smallest <= pair["resp_bytes"] < largest for pair in real_pairs(row))]
        picked.update(row["path"] for row in in_bucket[:PER_BUCKET])
    big_traces = [row for row in by_size if row["format"].endswith("tar.bz2") and "trace" in row["method"].lower()
                  and max(pair["resp_bytes"] for pair in real_pairs(row)) > MiB]
    picked.update(row["path"] for row in big_traces[:BIG_TRACES])
    big_blocks = [row for row in by_size if row["method"] == "eth_getBlockByHash" and any(
        not (pair["error"] or pair["batch"]) and pair["resp_bytes"] >= BIG_BLOCK for pair in real_pairs(row))]
    picked.update(row["path"] for row in big_blocks[:1])
    picked.update(EXAMPLES)
    picked.update(also)
    return [row for row in rows if row["path"] in picked]


def json_header_witness(corpus, rows):
    """The path of the smallest recorded witness with JSON headers of the latest fork, whose call
    is recorded once."""
    found, calls = [], []
    for row in rows:
        if row["method"] != "debug_executionWitness" or row["format"] != "rpc-tests-json":
            continue
        for pair in json.loads((corpus / "rpc" / row["path"]).read_text()):
            calls.append(json.dumps(pair["request"], sort_keys=True))
            headers = (pair["response"].get("result") or {}).get("headers") or []
            if headers and all(isinstance(header, dict) for header in headers):
                fields = sum(value is not None for value in headers[0].values())
                found.append((-fields, row["file_bytes"], row["path"], calls[-1]))
    return min(choice for choice in found if calls.count(choice[3]) == 1)[2]


def smallest_case(directory):
    cases = sorted(directory.iterdir(), key=lambda case: (sum(f.stat().st_size for f in case.iterdir()), case.name))
    return cases[0]


def files_to_copy(corpus):
    rows = [json.loads(line) for line in (corpus / "rpc/index.jsonl").read_text().splitlines()]
    chosen = rpc_choice(rows, json_header_witness(corpus, rows))
    files = [Path("rpc") / row["path"] for row in chosen]
    files.append(Path(WITNESS))
    cases = [smallest_case(corpus / SSZ_STATIC.format(fork=fork, type="SignedBeaconBlock")) for fork in FORKS]
    cases.append(corpus / SSZ_STATIC.format(fork="deneb", type="BlobSidecar") / "case_0")
    cases.append(smallest_case(corpus / SSZ_STATIC.format(fork="fulu", type="DataColumnSidecar")))
    cases.extend(smallest_case(corpus / SSZ_STATIC.format(fork=fork, type=name))
                 for fork in LIGHT_CLIENT_FORKS for name in LIGHT_CLIENT_TYPES)
    cases.extend(smallest_case(corpus / SSZ_STATIC.format(fork=fork, type="LightClientUpdate")) for fork in UPDATE_FORKS)
    for case in cases:
        files.extend(path.relative_to(corpus) for path in sorted(case.iterdir()))
    files.extend(path.relative_to(corpus) for path in sorted((corpus / "ssz/real").iterdir()))
    files.extend(path.relative_to(corpus) for path in sorted((corpus / "licenses").iterdir()))
    return chosen, files


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    parser.add_argument("--out", type=Path, default=REPO / "corpus-sample")
    args = parser.parse_args()
    chosen, files = files_to_copy(args.corpus)
    index = "".join(json.dumps(row) + "\n" for row in chosen)
    total = sum((args.corpus / f).stat().st_size for f in files) + len(index)
    if total > LIMIT:
        sys.exit(f"the sample would be {total} bytes, over {LIMIT}")
    # only the sampled parts are replaced: the sample's README and licence notes stay
    for part in ["rpc", "witness", "ssz", "licenses"]:
        shutil.rmtree(args.out / part, ignore_errors=True)
    for f in files:
        (args.out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.corpus / f, args.out / f)
    (args.out / "rpc/index.jsonl").write_text(index)
    methods = {row["method"] for row in chosen}
    networks = {row["network"] for row in chosen}
    print(f"{args.out}: {len(chosen)} recordings ({len(methods)} methods, {len(networks)} networks), "
          f"{len(files) - len(chosen)} other files, {total} bytes")


if __name__ == "__main__":
    main()
