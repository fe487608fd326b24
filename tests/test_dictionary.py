"""dcz (RFC 9842) through every host: the proxy serves rpcedge's dictionary at a path the operator
sets, with Use-As-Dictionary naming the RPC paths; a client that names the dictionary's hash in
Available-Dictionary and dcz in Accept-Encoding gets dcz answers, small ones included, each with
its exact length and decoding (against the dictionary the repository ships) to the node's answer;
a client with another hash, or none, gets what it would without the dictionary."""

import json

import pytest

from testbed import replay_corpus as rc
from testbed import wire
from testbed.envoy_harness import COMPRESSION_PLUGIN_CONFIG, run_envoy
from testbed.harness import CORPUS, LOOPBACK, free_port
from testbed.nginx_harness import start_nginx
from test_openresty import start_openresty

SMALL = "eth_getTransactionByBlockHashAndIndex/erigon-rpc-tests__mainnet__test_02.json"  # 659 B answer
MEDIUM = "erigon_getLatestLogs/erigon-rpc-tests__mainnet__test_10.json"  # 56 KiB
DICTIONARY_PATH = "/rpcedge/dictionary"
PATTERN = "/*"
CHROMIUM = "gzip, deflate, br, zstd, dcb, dcz"
ENCODINGS = ["dcz", "zstd", "gzip", "br", "deflate"]

NGINX = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_encodings dcz zstd gzip br deflate;
        location = {DICTIONARY_PATH} {{ rpcedge_dictionary "{PATTERN}"; }}
        location / {{ proxy_pass http://{LOOPBACK}:{replay_port}; }}
    }}
"""

SETTINGS = {"encodings": ENCODINGS, "dictionary": {"path": DICTIONARY_PATH, "match": PATTERN}}

OPENRESTY_LOCATION = (f'        location = {DICTIONARY_PATH} {{\n'
                      f'            content_by_lua_block {{ require("resty.rpcedge").dictionary("{PATTERN}") }}\n'
                      f'        }}\n\n')


@pytest.fixture(scope="module", params=["nginx", "envoy", "envoy-native", "openresty"])
def host(request, replay, tmp_path_factory):
    """A host that makes dcz and serves the dictionary: its port."""
    prefix = tmp_path_factory.mktemp(request.param)
    if request.param == "nginx":
        port = free_port()
        server = start_nginx(prefix, NGINX.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port,
                                                  DICTIONARY_PATH=DICTIONARY_PATH, PATTERN=PATTERN), [port])
        yield port
        server.stop()
    elif request.param == "openresty":
        # the binding serves the dictionary from a location of its own
        settings = json.dumps({"level": "auto", "encodings": ENCODINGS})
        port, process = start_openresty(prefix, replay.port, settings=settings,
                                        extra_locations=OPENRESTY_LOCATION)
        yield port
        process.stop()
    else:
        config = COMPRESSION_PLUGIN_CONFIG[:-1] + ", " + json.dumps(SETTINGS)[1:]
        adapter = {"envoy": "wasm", "envoy-native": "native"}[request.param]
        envoy = run_envoy(prefix, replay.port, plugin_config=config, adapter=adapter)
        yield envoy.port
        envoy.process.stop()


def call(port, path, accept_encoding, dictionary=None):
    request, _ = rc.read_pairs(CORPUS / path)[0]
    headers = {"Content-Type": "application/json"}
    if dictionary:
        headers["Available-Dictionary"] = dictionary
    return wire.request(port, f"/{rc.network_of(path)}", method="POST", body=rc.compact(request),
                        headers=headers, accept_encoding=accept_encoding)


def node(replay, path):
    request, _ = rc.read_pairs(CORPUS / path)[0]
    return replay.request("POST", f"/{rc.network_of(path)}", body=rc.compact(request))[2]


def test_the_dictionary_is_served_with_its_pattern_and_revalidated(host):
    served = wire.request(host, DICTIONARY_PATH)
    assert served.status == 200 and served.body == wire.dictionary()
    assert int(served.header("content-length")) == len(served.body)
    assert served.header("use-as-dictionary") == f'match="{PATTERN}"'
    assert served.header("cache-control") == "public, max-age=86400"
    assert served.header("content-type") == "application/octet-stream"
    assert served.header("access-control-allow-origin") == "*", "a dapp on another origin may read it"
    etag = served.header("etag")
    again = wire.request(host, DICTIONARY_PATH, headers={"If-None-Match": etag})
    assert (again.status, again.body, again.header("etag")) == (304, b"", etag)
    assert again.header("use-as-dictionary") == f'match="{PATTERN}"', "a revalidation keeps the dictionary's headers"
    head = wire.request(host, DICTIONARY_PATH, method="HEAD")
    assert (head.status, head.body, head.header("content-length")) == (200, b"", str(len(wire.dictionary())))
    refused = wire.request(host, DICTIONARY_PATH, method="POST", body=b"{}")
    assert (refused.status, refused.header("allow")) == (405, "GET, HEAD")


@pytest.mark.parametrize("path", [SMALL, MEDIUM])
def test_a_client_with_the_dictionary_gets_dcz_with_an_exact_length(host, replay, path):
    r = call(host, path, CHROMIUM, wire.available_dictionary())
    assert r.status == 200 and r.header("content-encoding") == "dcz"
    assert int(r.header("content-length")) == len(r.body)
    assert [v.strip() for v in r.header("vary").split(",")] == ["Accept-Encoding", "Available-Dictionary"]
    assert r.header_count("vary") == 1, "one field line, as the core's header edits give it to every host"
    assert r.decoded() == node(replay, path)
    if path == SMALL:
        plain = call(host, path, "zstd")
        assert plain.header("content-encoding") is None, "below min_length, without the dictionary"
        assert len(r.body) < len(plain.body) * 0.6, "the dictionary makes a small answer far smaller than it is"


@pytest.mark.parametrize("dictionary", [None, ":" + "A" * 43 + "=:"])
def test_a_client_without_the_dictionary_gets_what_it_would_without_one(host, replay, dictionary):
    small = call(host, SMALL, CHROMIUM, dictionary)
    assert small.header("content-encoding") is None and small.body == node(replay, SMALL)
    medium = call(host, MEDIUM, CHROMIUM, dictionary)
    assert medium.header("content-encoding") == "zstd" and medium.decoded() == node(replay, MEDIUM)
    # the answer would have been another with the dictionary: caches must know
    assert "Available-Dictionary" in [v.strip() for v in medium.header("vary").split(",")]
