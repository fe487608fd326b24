"""Transcoding through both hosts: a client that asks for SSZ gets the SSZ of the node's JSON
answer, byte-exact against an independent encoder here (for witnesses) or the consensus specs'
own serialization (Beacon-API objects, which the replay node sends as JSON unless told); JSON clients, batches and whatever cannot
be transcoded get the node's JSON as before; nginx and Envoy send the same bytes."""

import json
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
from Crypto.Hash import keccak

from testbed import wire
from testbed.envoy_harness import ENVOY_HOSTS, run_envoy
from testbed.harness import CORPUS, LOOPBACK, WITNESSES, free_port
from testbed.nginx_harness import start_nginx

SERVER = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_transcode on;
        rpcedge_beacon_network mainnet;
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
            proxy_http_version 1.1;
        }}
    }}
"""
ENVOY_PLUGIN_CONFIG = ('{"min_length": 1024, "max_buffer": 1048576, "transcode": true, "beacon_network": "mainnet", '
                       '"buffer_limit": 68157440}')

WITNESS_BLOCKS = {"0x134ff8": "cache_hoodi_1265656.json", "0x138c2d": "cache_hoodi_1281069.json"}
SSZ = "application/octet-stream"
HOSTS = ["nginx", *ENVOY_HOSTS]


def byte_lists(items):
    """SSZ of List[ByteList[...]]: an offset per item, then the items."""
    offsets, data = b"", b""
    for item in items:
        offsets += struct.pack("<I", 4 * len(items) + len(data))
        data += item
    return offsets + data


def container(fields):
    """SSZ of a container of variable-size fields."""
    head, data = b"", b""
    for field in fields:
        head += struct.pack("<I", 4 * len(fields) + len(data))
        data += field
    return head + data


def witness_ssz(witness, eip8025=False):
    names = ["state", "codes", "headers"] + ([] if eip8025 else ["keys"])
    return container([byte_lists([bytes.fromhex(h[2:]) for h in witness[name]]) for name in names])


def witness_json(block):
    return json.loads((WITNESSES / WITNESS_BLOCKS[block]).read_text())["witness"]


def call(method, params, id=1):
    return json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).encode()


@pytest.fixture(scope="module")
def hosts(replay, tmp_path_factory):
    port = free_port()
    nginx = start_nginx(tmp_path_factory.mktemp("transcode-nginx"),
                        SERVER.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port), [port])
    envoys = {host: run_envoy(tmp_path_factory.mktemp(f"transcode-{host}"), replay.port, ENVOY_PLUGIN_CONFIG,
                              adapter=adapter) for host, adapter in ENVOY_HOSTS.items()}
    yield {"nginx": nginx.port, **{host: envoy.port for host, envoy in envoys.items()}}
    for envoy in envoys.values():
        envoy.process.stop()
    nginx.stop()


def post(port, path, body, accept=None, accept_encoding="gzip", headers=None):
    headers = {"Content-Type": "application/json", **(headers or {})}
    if accept:
        headers["Accept"] = accept
    return wire.request(port, path, method="POST", headers=headers, body=body, accept_encoding=accept_encoding)


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("block", sorted(WITNESS_BLOCKS))
def test_a_witness_goes_out_as_ssz_with_the_envelope_in_headers(hosts, host, block):
    r = post(hosts[host], "/hoodi", call("debug_executionWitness", [block], id="w-1"), accept=SSZ)
    assert r.complete and r.status == 200
    assert r.header("content-type") == SSZ
    assert r.header("content-encoding") is None, "SSZ is not gzipped by default"
    assert int(r.header("content-length")) == len(r.body)
    assert r.body == witness_ssz(witness_json(block))
    assert r.header("x-rpcedge-jsonrpc-id") == '"w-1"'
    assert r.header("x-rpcedge-jsonrpc-version") == "2.0"
    assert "accept" in [v.strip().lower() for v in r.header("vary").split(",")]


def json_header_witnesses():
    """The corpus's witnesses whose headers are JSON objects (geth's form), each the only recording
    of its call: (params, result)."""
    recorded = [pair for path in sorted((CORPUS / "debug_executionWitness").glob("*hive*.json"))
                for pair in json.loads(path.read_text())]
    calls = [json.dumps(pair["request"]["params"]) for pair in recorded]
    return [(pair["request"]["params"], pair["response"]["result"]) for pair, params in zip(recorded, calls)
            if calls.count(params) == 1 and isinstance((pair["response"].get("result") or {}).get("headers"), list)
            and any(isinstance(header, dict) for header in pair["response"]["result"]["headers"])]


def read_container(ssz, fields):
    """The variable-size fields of an SSZ container, each a List[ByteList]: lists of bytes."""
    bounds = [struct.unpack_from("<I", ssz, 4 * i)[0] for i in range(fields)] + [len(ssz)]
    lists = []
    for start, end in zip(bounds, bounds[1:]):
        field = ssz[start:end]
        count = struct.unpack_from("<I", field)[0] // 4 if field else 0
        items = [struct.unpack_from("<I", field, 4 * i)[0] for i in range(count)] + [len(field)]
        lists.append([field[a:b] for a, b in zip(items, items[1:])])
    return lists


@pytest.mark.parametrize("host", HOSTS)
def test_a_witness_with_json_headers_goes_out_with_each_header_as_the_rlp_of_its_hash(hosts, host):
    witnesses = json_header_witnesses()
    assert witnesses, "the corpus has a witness with JSON headers"
    for params, result in witnesses:
        r = post(hosts[host], "/hive", call("debug_executionWitness", params), accept=SSZ)
        assert r.complete and r.status == 200 and r.header("content-type") == SSZ, params
        assert int(r.header("content-length")) == len(r.body)
        state, codes, headers, keys = read_container(r.body, 4)
        for name, items in [("state", state), ("codes", codes), ("keys", keys)]:
            assert items == [bytes.fromhex(h[2:]) for h in result.get(name) or []], (params, name)
        assert len(headers) == len(result["headers"])
        for rlp, header in zip(headers, result["headers"]):
            if isinstance(header, str):
                assert rlp == bytes.fromhex(header[2:])
            else:
                # the RLP of a header is a list: its keccak-256 is the block's hash
                assert rlp[0] >= 0xf8 and keccak.new(data=rlp, digest_bits=256).hexdigest() == header["hash"][2:]


# bytes of content: about 80 MB of JSON, past the 64 MiB that a transcoded body was once held to
BIG_WITNESS = 40_000_000
BIG_CALL = call("debug_executionWitness", ["0x1"], id=9)


@pytest.fixture(scope="module")
def big_witness(replay):
    """A witness the replay makes up past 64 MiB of JSON: the JSON the node sends, and its fields'
    bytes in the container's order."""
    r = wire.request(replay.port, f"/generated/witness?bytes={BIG_WITNESS}", method="POST",
                     headers={"Content-Type": "application/json"}, body=BIG_CALL, accept_encoding=None)
    assert r.status == 200 and len(r.body) > 64 << 20
    result = json.loads(r.body)["result"]
    return r.body, [[bytes.fromhex(h[2:]) for h in result[name]] for name in ("state", "codes", "headers", "keys")]


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("delivery", ["length", "chunked"])
def test_a_witness_past_64_mib_is_transcoded_as_it_arrives_with_its_exact_length(hosts, host, delivery, big_witness):
    _, fields = big_witness
    # chunked as geth and erigon send it: held up to transcode_hold_max, then read as it arrives
    node = {"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": str(1 << 20)} if delivery == "chunked" else {}
    r = post(hosts[host], f"/generated/witness?bytes={BIG_WITNESS}", BIG_CALL, accept=SSZ, headers=node)
    assert r.complete and r.status == 200 and r.header("content-type") == SSZ
    assert int(r.header("content-length")) == len(r.body)
    assert r.header("x-rpcedge-jsonrpc-id") == "9"
    assert read_container(r.body, 4) == fields


BUDGET_SERVER = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_transcode on;
        rpcedge_transcode_budget 100m;
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
            proxy_http_version 1.1;
        }}
    }}
"""


@pytest.fixture(scope="module")
def budget_hosts(replay, tmp_path_factory):
    """nginx and the native Envoy module with a transcode budget that holds one big witness's
    transcode but not two."""
    port = free_port()
    nginx = start_nginx(tmp_path_factory.mktemp("budget-nginx"),
                        BUDGET_SERVER.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port), [port])
    config = json.dumps({**json.loads(ENVOY_PLUGIN_CONFIG), "transcode_budget": 100 << 20})
    envoy = run_envoy(tmp_path_factory.mktemp("budget-envoy"), replay.port, config, adapter="native", concurrency=2)
    yield {"nginx": nginx.port, "envoy-native": envoy.port}
    envoy.process.stop()
    nginx.stop()


@pytest.mark.parametrize("host", ["nginx", "envoy-native"])
def test_two_witnesses_over_the_budget_one_is_transcoded_and_the_other_goes_out_as_it_came(
        budget_hosts, host, big_witness):
    json_body, fields = big_witness
    # the node sends each slowly, so that both transcodes would be in flight at once
    slow = {"X-Replay-Chunk-Size": str(1 << 20), "X-Replay-Chunk-Delay-Ms": "20"}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post(budget_hosts[host], f"/generated/witness?bytes={BIG_WITNESS}",
                                               BIG_CALL, accept=SSZ, headers=slow), range(2)))
    assert all(r.complete and r.status == 200 for r in answers)
    kinds = sorted(r.header("content-type") for r in answers)
    assert kinds == ["application/json", SSZ], kinds
    for r in answers:
        if r.header("content-type") == SSZ:
            assert int(r.header("content-length")) == len(r.body)
            assert read_container(r.body, 4) == fields
        else:
            assert r.decoded() == json_body, "the JSON as it came"


@pytest.mark.parametrize("host", HOSTS)
def test_the_eip_8025_container_on_request(hosts, host):
    block = "0x138c2d"
    r = post(hosts[host], "/", call("debug_executionWitness", [block]), accept=f"{SSZ}; witness=eip8025")
    assert r.header("content-type") == f"{SSZ}; witness=eip8025"
    assert r.body == witness_ssz(witness_json(block), eip8025=True)


@pytest.mark.parametrize("host", HOSTS)
def test_a_chunked_answer_is_transcoded_whole(hosts, host):
    block = "0x134ff8"
    r = post(hosts[host], "/hoodi", call("debug_executionWitness", [block]), accept=SSZ,
             headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "5000"})
    assert r.complete and r.body == witness_ssz(witness_json(block))
    assert int(r.header("content-length")) == len(r.body)


@pytest.mark.parametrize("host", HOSTS)
def test_a_raw_block_is_its_bytes(hosts, host):
    recorded = (CORPUS / "debug_getRawBlock" / "execution-apis__hive-testchain__get-genesis.io").read_text()
    result = json.loads(recorded.split("<< ", 1)[1])["result"]
    r = post(hosts[host], "/hive-testchain", call("debug_getRawBlock", ["0x0"], id=9), accept=SSZ)
    assert r.body == bytes.fromhex(result[2:])
    assert r.header("x-rpcedge-jsonrpc-id") == "9"


@pytest.mark.parametrize("host", HOSTS)
def test_json_clients_batches_and_errors_get_json(hosts, host, replay):
    port = hosts[host]
    request = call("debug_executionWitness", ["0x134ff8"])
    direct = post(replay.port, "/hoodi", request, accept_encoding=None).body
    for accept in [None, "application/json", "*/*", f"{SSZ};q=0.5, application/json"]:
        r = post(port, "/hoodi", request, accept=accept)
        assert r.header("content-type") == "application/json", accept
        assert r.decoded() == direct
    batch = b"[" + request + b"]"
    r = post(port, "/hoodi", batch, accept=SSZ)
    assert r.header("content-type") == "application/json"
    assert isinstance(json.loads(r.decoded()), list)
    # no recording: the node answers a JSON-RPC error, which stays JSON
    r = post(port, "/hoodi", call("debug_executionWitness", ["0x1"]), accept=SSZ)
    assert r.header("content-type") == "application/json"
    assert json.loads(r.decoded())["error"]["code"] == -32601


@pytest.mark.parametrize("host", HOSTS)
def test_an_answer_that_may_not_be_transformed_goes_out_as_it_came(hosts, host):
    r = post(hosts[host], "/hoodi", call("debug_executionWitness", ["0x134ff8"]), accept=SSZ,
             headers={"X-Replay-Header": "Cache-Control: no-transform"})
    assert r.complete and r.header("content-type") == "application/json"
    assert json.loads(r.decoded())["result"] == witness_json("0x134ff8")


def test_both_hosts_send_the_same_bytes(hosts):
    for body, accept in [(call("debug_executionWitness", ["0x138c2d"]), SSZ),
                         (call("debug_executionWitness", ["0x138c2d"]), f"{SSZ}; witness=eip8025"),
                         (call("debug_getRawBlock", ["0x0"]), SSZ)]:
        a, *others = (post(hosts[h], "/", body, accept=accept) for h in HOSTS)
        for b in others:
            assert a.body == b.body
            for name in ["content-type", "content-length", "x-rpcedge-jsonrpc-id", "x-rpcedge-jsonrpc-version"]:
                assert a.header(name) == b.header(name), name


# Beacon-API routes the replay node answers (see corpus-reader/src/beacon.rs), with their version.
BEACON_ROUTES = [
    ("/eth/v2/beacon/blocks/phase0:case_4", "phase0"),
    ("/eth/v2/beacon/blocks/altair:case_2", "altair"),
    ("/eth/v2/beacon/blocks/bellatrix:case_3", "bellatrix"),
    ("/eth/v2/beacon/blocks/capella:case_1", "capella"),
    ("/eth/v2/beacon/blocks/deneb:case_0", "deneb"),
    ("/eth/v2/beacon/blocks/electra:case_1", "electra"),
    ("/eth/v2/beacon/blocks/fulu:case_2", "fulu"),
    ("/eth/v1/beacon/blinded_blocks/348241", "deneb"),
    ("/eth/v1/beacon/blinded_blocks/0x50b3798189636f067c5456a93df6ea6ba4ac71c02059a81e567134378e0b11a1", "deneb"),
    ("/eth/v1/beacon/blobs/electra:case_3", None),
    ("/eth/v1/beacon/blob_sidecars/deneb:case_0", "deneb"),
    ("/eth/v1/debug/beacon/data_column_sidecars/fulu:case_2", "fulu"),
    ("/eth/v2/debug/beacon/states/fulu:case_0", "fulu"),
    ("/eth/v1/beacon/light_client/bootstrap/altair:case_4", "altair"),
    ("/eth/v1/beacon/light_client/bootstrap/electra:case_0", "electra"),
    ("/eth/v1/beacon/light_client/finality_update?case=electra:case_4", "electra"),
    ("/eth/v1/beacon/light_client/optimistic_update?case=altair:case_0", "altair"),
]


def get(port, path, accept=None, headers=None, accept_encoding="gzip"):
    headers = dict(headers or {})
    if accept:
        headers["Accept"] = accept
    return wire.request(port, path, headers=headers, accept_encoding=accept_encoding)


def node_answer(replay, path, ssz):
    r = get(replay.port, path, accept=SSZ if ssz else None, headers={"X-Replay-Ssz": "1"}, accept_encoding=None)
    assert r.status == 200 and r.header("content-type") == (SSZ if ssz else "application/json")
    return r.body


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("path,version", BEACON_ROUTES)
def test_a_beacon_api_object_goes_out_as_the_specs_ssz(hosts, host, replay, path, version):
    r = get(hosts[host], path, accept=f"{SSZ};q=1, application/json;q=0.9")
    assert r.complete and r.status == 200
    assert r.header("content-type") == SSZ
    assert r.body == node_answer(replay, path, ssz=True)
    assert int(r.header("content-length")) == len(r.body)
    assert r.header("eth-consensus-version") == version
    assert "accept" in [v.strip().lower() for v in r.header("vary").split(",")]
    # a JSON client gets the node's JSON
    r = get(hosts[host], path, accept="application/json")
    assert r.header("content-type") == "application/json"
    assert r.decoded() == node_answer(replay, path, ssz=False)


LIGHT_CLIENT_UPDATES = ("/eth/v1/beacon/light_client/updates?start_period=1&count=4"
                        "&cases=altair:case_1,capella:case_2,electra:case_0,fulu:case_3")


def updates_chunks(ssz):
    """The updates route's SSZ read by its framing: (fork digest, update) per chunk."""
    chunks = []
    while ssz:
        (length,) = struct.unpack_from("<Q", ssz)
        chunks.append((ssz[8:12].hex(), ssz[12:8 + length]))
        ssz = ssz[8 + length:]
    return chunks


@pytest.mark.parametrize("host", HOSTS)
def test_light_client_updates_go_out_framed_with_their_forks_digests(hosts, host, replay):
    r = get(hosts[host], LIGHT_CLIENT_UPDATES, accept=SSZ)
    assert r.complete and r.status == 200
    assert r.header("content-type") == SSZ and int(r.header("content-length")) == len(r.body)
    assert r.header("eth-consensus-version") is None, "the updates may be of several forks"
    assert r.body == node_answer(replay, LIGHT_CLIENT_UPDATES, ssz=True)
    # mainnet's published digests of altair, capella, electra and (before blob parameters) fulu
    assert [digest for digest, _ in updates_chunks(r.body)] == ["afcaaba0", "bba4da96", "ad532ceb", "82fae541"]
    r = get(hosts[host], LIGHT_CLIENT_UPDATES, accept="application/json")
    assert r.decoded() == node_answer(replay, LIGHT_CLIENT_UPDATES, ssz=False)


@pytest.mark.parametrize("host", HOSTS)
def test_a_chunked_beacon_state_is_transcoded_whole_and_an_ssz_answer_passes(hosts, host, replay):
    path = "/eth/v2/debug/beacon/states/electra:case_1"
    r = get(hosts[host], path, accept=SSZ, headers={"X-Replay-Mode": "chunked", "X-Replay-Chunk-Size": "65536"})
    assert r.complete and r.body == node_answer(replay, path, ssz=True)
    assert int(r.header("content-length")) == len(r.body)
    # the node answers SSZ itself: it goes through as it came
    r = get(hosts[host], path, accept=SSZ, headers={"X-Replay-Ssz": "1"})
    assert r.header("content-type") == SSZ and r.body == node_answer(replay, path, ssz=True)


@pytest.mark.parametrize("host", HOSTS)
def test_a_beacon_answer_of_an_unknown_fork_goes_out_as_it_came(hosts, host, replay):
    path = "/eth/v2/beacon/blocks/deneb:case_4"
    r = get(hosts[host], path, accept=SSZ, headers={"X-Replay-Header": "Eth-Consensus-Version: gloas"})
    assert r.complete and r.header("content-type") == "application/json"
    assert r.decoded() == node_answer(replay, path, ssz=False)
