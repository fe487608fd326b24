"""The corpus sample that ships in the repository (corpus-sample/): what tools/corpus_sample.py
makes of the shared corpus, within its 8 MiB, and enough for the replay node to serve on its own
(a clone with nothing beside it, the Docker stack's node)."""

import filecmp
import json
import subprocess
import sys
import time

import pytest

import test_replay
from testbed import replay_corpus as rc
from testbed import wire
from testbed.harness import REPO, SAMPLE_CORPUS, SHARED_CORPUS, start_replay
from testbed.scenarios import SIZE_BUCKETS, MiB

SOURCES = ["erigontech-rpc-tests", "ethereum-execution-apis", "lambdaclass-ethrex-replay",
           "eth-consensus-specs", "flashbots-mev-boost"]


def sample_files():
    return sorted(p for p in SAMPLE_CORPUS.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def sample_replay(tmp_path_factory):
    upstream = start_replay(tmp_path_factory.mktemp("sample-replay"), corpus=SAMPLE_CORPUS / "rpc",
                            root=SAMPLE_CORPUS)
    try:
        yield upstream
    finally:
        upstream.process.stop()


def test_the_sample_fits_and_names_its_sources():
    total = sum(p.stat().st_size for p in sample_files())
    assert total <= 8 * MiB, f"{total} bytes"
    for source in SOURCES:
        assert (SAMPLE_CORPUS / "licenses" / f"{source}.LICENSE").stat().st_size > 0
    rows = rc.index_rows(SAMPLE_CORPUS / "rpc")
    assert set(rows) == set(rc.corpus_files(SAMPLE_CORPUS / "rpc")), "index.jsonl describes every recording"
    answers = [pair["resp_bytes"] for row in rows.values() for pair in row["pairs"] if not pair["placeholder_response"]]
    for name, (smallest, largest) in SIZE_BUCKETS.items():
        assert any(smallest <= size < largest for size in answers), f"nothing in the {name} bucket"
    traces = [row for row in rows.values() if "trace" in row["method"].lower()
              and any(pair["resp_bytes"] > MiB for pair in row["pairs"])]
    assert len(traces) >= 3
    assert len({row["network"] for row in rows.values()}) == 7


@pytest.mark.skipif(not SHARED_CORPUS.is_dir(), reason="the shared corpus is not beside the repository")
def test_the_sample_is_what_the_script_makes(tmp_path):
    out = tmp_path / "sample"
    subprocess.run([sys.executable, REPO / "tools" / "corpus_sample.py", "--corpus", SHARED_CORPUS, "--out", out],
                   check=True, capture_output=True)
    made = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    shipped = [p.relative_to(SAMPLE_CORPUS) for p in sample_files() if p.name != "README.md"]
    assert made == shipped
    changed = [p for p in made if not filecmp.cmp(out / p, SAMPLE_CORPUS / p, shallow=False)]
    assert not changed


def test_the_replay_serves_every_sampled_pair(sample_replay):
    test_replay.test_every_recorded_pair_is_replayed(sample_replay)


def test_the_replay_serves_the_sampled_witness_and_beacon_objects(sample_replay):
    call = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "debug_executionWitness", "params": ["0x134ff8"]})
    r = wire.request(sample_replay.port, "/hoodi", method="POST", body=call.encode(),
                     headers={"Content-Type": ["application/json"]}, accept_encoding=None)
    recorded = json.loads((SAMPLE_CORPUS / "witness/ethrex-replay/cache_hoodi_1265656.json").read_text())["witness"]
    assert r.status == 200 and json.loads(r.body)["result"] == recorded

    blocks = sorted((SAMPLE_CORPUS / "ssz/ssz_static/tests/mainnet").glob("*/ssz_static/SignedBeaconBlock/ssz_random/case_*"))
    forks = {"phase0", "altair", "bellatrix", "capella", "deneb", "electra", "fulu"}
    assert {case.parts[-5] for case in blocks} == forks
    versioned = [f"/eth/v2/beacon/blocks/{case.parts[-5]}:{case.name}" for case in blocks]
    versioned.append("/eth/v1/beacon/blinded_blocks/348241")
    for path in [*versioned, "/eth/v1/beacon/blobs/deneb:case_0"]:
        r = wire.request(sample_replay.port, path, accept_encoding=None)
        assert r.status == 200 and json.loads(r.body)["data"], path
        assert (r.header("eth-consensus-version") is not None) == (path in versioned), path


def test_a_batch_of_calls_recorded_alone_is_answered_call_by_call(sample_replay):
    calls = rc.single_calls(SAMPLE_CORPUS / "rpc", "mainnet", 12)
    assert len(calls) >= 6
    alone = []
    for number, call in enumerate(calls, start=1):
        status, _, body = sample_replay.request("POST", "/mainnet", rc.compact({**call, "id": number}))
        assert status == 200 and json.loads(body)["id"] == number
        alone.append(json.loads(body))

    # ids as ethers v6 numbers them, a string id, a call no recording holds, and a notification
    batch = [{**call, "id": number} for number, call in enumerate(calls, start=1)]
    batch.insert(2, {"jsonrpc": "2.0", "method": "eth_noSuchMethod", "params": [], "id": "x"})
    batch.insert(4, {"jsonrpc": "2.0", "method": calls[0]["method"], "params": calls[0]["params"]})
    status, headers, body = sample_replay.request("POST", "/mainnet", rc.compact(batch))
    answers = json.loads(body)
    assert status == 200 and headers["content-type"] == "application/json"
    assert answers[2] == {"jsonrpc": "2.0", "id": "x", "error": {
        "code": -32601, "message": f"rpcedge-replay: no recording for eth_noSuchMethod (in a batch of {len(batch)})"}}
    assert answers[:2] + answers[3:] == alone, "each call's own answer, in the batch's order, the notification none"

    notifications = rc.compact([calls[0], calls[1]])
    assert sample_replay.request("POST", "/mainnet", notifications)[::2] == (200, b"")

    # the node's work: each call counted and, when asked, taking its time, one after another
    stats = lambda: json.loads(sample_replay.request("GET", "/stats")[2])
    before = stats()
    started = time.monotonic()
    delayed = {"X-Replay-Call-Delay-Ms": "100"}
    status, _, body = sample_replay.request("POST", "/mainnet", rc.compact(batch[:3]), delayed)
    assert status == 200 and len(json.loads(body)) == 3
    assert time.monotonic() - started >= 0.3
    after = stats()
    assert (after["rpc_requests"] - before["rpc_requests"], after["rpc_calls"] - before["rpc_calls"]) == (1, 3)
