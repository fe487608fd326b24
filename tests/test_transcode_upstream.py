"""Asking the node for SSZ (`transcode_upstream_ssz`) and rendering JSON for JSON clients, through
nginx and Envoy. The node here is rpcedge itself, nginx with `rpcedge_transcode` in front of the
replay: asked for SSZ, it answers as a node with SSZ would, with the JSON-RPC envelope and the
Beacon-API envelope's members in headers, and the proxies under test render its SSZ back as
JSON. Its headers on the JSON answers show that SSZ is what crossed between node and proxy."""

import json

import pytest

from testbed.envoy_harness import ENVOY_HOSTS, run_envoy
from testbed.harness import CORPUS, LOOPBACK, free_port
from testbed.nginx_harness import start_nginx
from test_transcode import (BIG_CALL, BIG_WITNESS, LIGHT_CLIENT_UPDATES, SSZ, WITNESS_BLOCKS, big_witness, call, get,  # noqa: F401
                            node_answer, post, witness_json)

NODE_AND_PROXY = """
    server {{
        listen {LOOPBACK}:{node_port};
        rpcedge on;
        rpcedge_transcode on;
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
            proxy_http_version 1.1;
        }}
    }}
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_transcode_upstream_ssz on;
        # (below the big witness's SSZ, to render it as it arrives)
        rpcedge_transcode_hold_max 16m;
        location / {{
            proxy_pass http://{LOOPBACK}:{node_port};
            proxy_http_version 1.1;
        }}
    }}
"""
ENVOY_PLUGIN_CONFIG = '{"transcode_upstream_ssz": true, "transcode_hold_max": 16777216, "buffer_limit": 68157440}'
BLINDED_BLOCK = "/eth/v1/beacon/blinded_blocks/348241"
HOSTS = ["nginx", *ENVOY_HOSTS]


@pytest.fixture(scope="module")
def hosts(replay, tmp_path_factory):
    node_port, port = free_port(), free_port()
    text = NODE_AND_PROXY.format(LOOPBACK=LOOPBACK, node_port=node_port, port=port, replay_port=replay.port)
    nginx = start_nginx(tmp_path_factory.mktemp("upstream-ssz-nginx"), text, [node_port, port])
    # one worker: what rpcedge learns of the node is each worker's own
    envoys = {host: run_envoy(tmp_path_factory.mktemp(f"upstream-ssz-{host}"), node_port, ENVOY_PLUGIN_CONFIG,
                              concurrency=1, adapter=adapter) for host, adapter in ENVOY_HOSTS.items()}
    yield {"nginx": port, "node": node_port, **{host: envoy.port for host, envoy in envoys.items()}}
    for envoy in envoys.values():
        envoy.process.stop()
    nginx.stop()


def lowered(value):
    """JSON with every string in lower case: rpcedge writes hex in lower case."""
    return json.loads(json.dumps(value).lower())


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("block", sorted(WITNESS_BLOCKS))
def test_a_json_client_gets_the_json_of_the_ssz_its_call_was_asked_in(hosts, host, block):
    r = post(hosts[host], "/hoodi", call("debug_executionWitness", [block], id="w-1"))
    assert r.complete and r.status == 200
    assert r.header("x-rpcedge-jsonrpc-id") == '"w-1"', "the node was asked for SSZ"
    assert r.header("content-type") == "application/json"
    assert r.header("content-encoding") == "gzip" and int(r.header("content-length")) == len(r.body)
    answer = json.loads(r.decoded())
    witness = witness_json(block)
    assert (answer["jsonrpc"], answer["id"]) == ("2.0", "w-1")
    assert answer["result"] == lowered({name: witness[name] for name in ("state", "codes", "keys", "headers")})


@pytest.mark.parametrize("host", HOSTS)
def test_a_witness_past_transcode_hold_max_is_rendered_as_its_ssz_arrives(hosts, host, big_witness):
    json_body, _ = big_witness
    r = post(hosts[host], f"/generated/witness?bytes={BIG_WITNESS}", BIG_CALL)
    assert r.complete and r.status == 200
    assert r.header("x-rpcedge-jsonrpc-id") == "9", "the node was asked for SSZ"
    assert r.header("content-type") == "application/json" and r.header("content-length") is None
    assert r.header("content-encoding") == "gzip", "streamed, as a body whose length is not known"
    answer = json.loads(r.decoded())
    assert (answer["jsonrpc"], answer["id"]) == ("2.0", 9)
    assert answer["result"] == json.loads(json_body)["result"]


@pytest.mark.parametrize("host", HOSTS)
def test_a_raw_block_and_an_error_through_a_node_asked_for_ssz(hosts, host):
    recorded = (CORPUS / "debug_getRawBlock" / "execution-apis__hive-testchain__get-genesis.io").read_text()
    r = post(hosts[host], "/hive-testchain", call("debug_getRawBlock", ["0x0"], id=9), accept_encoding=None)
    assert r.header("x-rpcedge-jsonrpc-id") == "9"
    assert json.loads(r.body) == {"jsonrpc": "2.0", "id": 9, "result": lowered(json.loads(recorded.split("<< ", 1)[1]))["result"]}
    # errors stay JSON all the way
    r = post(hosts[host], "/hoodi", call("debug_executionWitness", ["0x1"]))
    assert r.header("content-type") == "application/json"
    assert json.loads(r.decoded())["error"]["code"] == -32601
    # a client that asks for SSZ gets the node's SSZ as it came
    r = post(hosts[host], "/hive-testchain", call("debug_getRawBlock", ["0x0"], id=9), accept=SSZ)
    assert r.header("content-type") == SSZ
    assert r.body == bytes.fromhex(json.loads(recorded.split("<< ", 1)[1])["result"][2:])


@pytest.mark.parametrize("host", HOSTS)
def test_a_beacon_object_is_asked_in_ssz_once_the_node_has_shown_it_sends_the_envelope(hosts, host, replay):
    port = hosts[host]
    node_json = json.loads(node_answer(replay, BLINDED_BLOCK, ssz=False))
    # Nothing known of the node yet: the JSON client's request goes as it came.
    r = get(port, BLINDED_BLOCK, accept="application/json")
    assert r.header("content-type") == "application/json"
    assert r.header("eth-execution-optimistic") is None
    # An SSZ client's answer carries the envelope's members in headers.
    r = get(port, BLINDED_BLOCK, accept=SSZ)
    assert r.header("content-type") == SSZ and r.body == node_answer(replay, BLINDED_BLOCK, ssz=True)
    assert (r.header("eth-execution-optimistic"), r.header("eth-consensus-finalized")) == ("false", "true")
    # Now the JSON client's object crosses as SSZ and is rendered here.
    r = get(port, BLINDED_BLOCK, accept="application/json")
    assert r.complete and r.status == 200
    assert r.header("eth-execution-optimistic") == "false", "the node was asked for SSZ"
    assert r.header("content-type") == "application/json" and r.header("eth-consensus-version") == "deneb"
    assert int(r.header("content-length")) == len(r.body)
    assert json.loads(r.decoded()) == lowered(node_json)


@pytest.mark.parametrize("host", HOSTS)
def test_states_are_never_asked_for_in_ssz(hosts, host, replay):
    path = "/eth/v2/debug/beacon/states/fulu:case_0"
    get(hosts[host], path, accept=SSZ)
    r = get(hosts[host], path, accept="application/json")
    assert r.header("eth-execution-optimistic") is None
    assert r.decoded() == node_answer(replay, path, ssz=False)


def test_light_client_updates_pass_through_where_the_chain_is_not_named(hosts, replay):
    # the node's proxy transcodes, but no rpcedge_beacon_network names the chain whose digests frame them
    r = get(hosts["node"], LIGHT_CLIENT_UPDATES, accept=SSZ)
    assert r.complete and r.status == 200 and r.header("content-type") == "application/json"
    assert r.decoded() == node_answer(replay, LIGHT_CLIENT_UPDATES, ssz=False)
