"""The shared cache cannot be poisoned: through real nginx and real Envoy (both adapters), in front
of the real daemon and a stand-in node that reads requests as Go's encoding/json does (go_node),
a request whose key would name one block while the node reads another stores nothing; an answer
that names another block than the one asked for stores nothing; the namespace is where the proxy
routed the request, never the client's Host or :authority."""

import json
import random
import string
import time
import uuid
from types import SimpleNamespace

import pytest

from testbed import wire
from testbed.cache_cases import envoy_plugin, start_proxy
from testbed.envoy_harness import ENVOY_HOSTS, RPCEDGE_ENTRY, run_envoy, without_route_namespaces
from testbed.go_node import GoNode
from testbed.harness import LOOPBACK, REPO, start_cached
from testbed.nginx_harness import free_port, start_nginx

A = "0x" + "a1" * 32
B = "0x" + "b2" * 32
# every host with the cache; those that are nginx (OpenResty's Lua binding, in both its forms)
NGINX_HOSTS = ["nginx", "openresty", "openresty-proxied"]
ALL_HOSTS = [*NGINX_HOSTS, *ENVOY_HOSTS]
# a store lands within this long of the answer's end
STORED_WITHIN = 1.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("cache-security")
    daemon = start_cached(log_dir, log_dir / "db")
    yield daemon
    daemon.process.stop()


@pytest.fixture
def proxy(request, tmp_path, daemon):
    """Starts a proxy of the test's host in front of a node, in a namespace of its own (the
    daemon is shared by the module)."""
    started = []

    def start(node, host=request.param, namespace=None, **options):
        stack = SimpleNamespace(replay=node, daemon=daemon)
        namespace = namespace or f"go-{uuid.uuid4().hex[:12]}"
        proxy = start_proxy(host, tmp_path / f"{host}-{len(started)}", stack, namespace=namespace, **options)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def call(members):
    return ("{" + members + "}").encode()


def by_hash(block_hash, id_=1):
    return call(f'"jsonrpc":"2.0","id":{id_},"method":"eth_getBlockByHash","params":["{block_hash}",false]')


def post(port, body, headers=None, path="/", host=LOOPBACK, host_header=None):
    headers = {"Content-Type": "application/json", **(headers or {})}
    return wire.request(port, path, "POST", headers, body, host=host, host_header=host_header)


def result(response):
    return json.loads(response.decoded())["result"]


def settle(port, body, host_header=None):
    """Asks until the answer is a HIT, or STORED_WITHIN has passed: the last answer."""
    deadline = time.monotonic() + STORED_WITHIN
    while True:
        response = post(port, body, host_header=host_header)
        if response.header("x-rpcedge-cache") == "HIT" or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def assert_never_stored(port, node, answered_hash, times=3):
    """Asks for block A `times`, a while apart: each time a MISS, the node's answer naming
    `answered_hash`, and the node asked every time."""
    for _ in range(times):
        response = post(port, by_hash(A))
        assert response.header("x-rpcedge-cache") == "MISS" and result(response)["hash"] == answered_hash
        time.sleep(STORED_WITHIN / times)
    assert len(node.requests) == times


SPELLINGS = {
    "Params": f'"Params":["{B}",false]',
    "PARAMS": f'"PARAMS":["{B}",false]',
    "escaped twice": f'"par\\u0061ms":["{B}",false]',
    "long s": f'"paramſ":["{B}",false]',
    "Method": '"Method":"eth_getBlockByNumber"',
    "trailing space": '"jsonrpc ":"2.0"',
}


@pytest.mark.parametrize("proxy", ALL_HOSTS, indirect=True)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_call_the_node_reads_otherwise_is_never_stored(proxy, spelling):
    node = GoNode("go")
    try:
        port = proxy(node).port
        base = f'"jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":["{A}",false]'
        poisoned = post(port, call(f"{base},{SPELLINGS[spelling]}"))
        assert poisoned.status == 200
        assert poisoned.header("x-rpcedge-cache") == "BYPASS", spelling
        # whatever the node read, the plain call for A is answered with block A: first by the
        # node, then from the cache
        first = post(port, by_hash(A))
        assert first.header("x-rpcedge-cache") == "MISS" and result(first)["hash"] == A
        again = settle(port, by_hash(A, id_=2))
        assert again.header("x-rpcedge-cache") == "HIT" and result(again)["hash"] == A
        assert post(port, by_hash(B)).header("x-rpcedge-cache") == "MISS"
    finally:
        node.stop()


@pytest.mark.parametrize("proxy", ALL_HOSTS, indirect=True)
def test_an_answer_that_names_another_block_is_never_stored(proxy):
    liar = GoNode("liar", lie_hash=B)
    try:
        assert_never_stored(proxy(liar).port, liar, B)
    finally:
        liar.stop()


@pytest.mark.parametrize("proxy", ALL_HOSTS, indirect=True)
def test_the_host_a_client_sends_changes_nothing(proxy):
    node = GoNode("go")
    try:
        port = proxy(node).port
        assert post(port, by_hash(A)).header("x-rpcedge-cache") == "MISS"
        assert settle(port, by_hash(A)).header("x-rpcedge-cache") == "HIT"
        asked = len(node.requests)
        rng = random.Random(24)
        for _ in range(8):
            name = "".join(rng.choices(string.ascii_lowercase, k=8)) + rng.choice([".example", ":8545", ""])
            response = post(port, by_hash(A), host_header=name)
            assert response.header("x-rpcedge-cache") == "HIT" and result(response)["hash"] == A, name
        assert len(node.requests) == asked
    finally:
        node.stop()


def two_networks(port, mainnet, sepolia, cached_port):
    """nginx with a server per network, each named and each in front of its own node, and the
    cache in each server's default namespace (its server_name and location)."""
    servers = "".join(f"""
    upstream {name}_node {{
        server {LOOPBACK}:{node.port};
    }}

    server {{
        listen {LOOPBACK}:{port};
        server_name {name}.example;
        rpcedge on;
        rpcedge_cache on;
        include rpcedge-cache.conf;

        location / {{
            proxy_pass http://{name}_node;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
""" for name, node in (("mainnet", mainnet), ("sepolia", sepolia)))
    return f"""
    upstream rpcedge_cached {{
        server {LOOPBACK}:{cached_port};
    }}
{servers}"""


def test_nginx_keys_where_it_routed_not_the_host_header(tmp_path, daemon):
    """An absolute request line picks the server block, whatever Host says: the answer of the
    node behind it lands in that server's namespace, not in the one Host names."""
    mainnet, sepolia = GoNode("mainnet-node"), GoNode("sepolia-node")
    (tmp_path / "rpcedge-cache.conf").write_text((REPO / "configs/nginx/rpcedge-cache.conf").read_text())
    port = free_port()
    nginx = start_nginx(tmp_path, two_networks(port, mainnet, sepolia, daemon.port), [port])
    try:
        absolute = post(port, by_hash(A), path="http://sepolia.example/", host_header="mainnet.example")
        assert result(absolute)["miner"] == "sepolia-node"
        time.sleep(STORED_WITHIN)
        # mainnet's namespace holds nothing: its node answers, and its answer is kept
        first = post(port, by_hash(A), host_header="mainnet.example")
        assert first.header("x-rpcedge-cache") == "MISS" and result(first)["miner"] == "mainnet-node"
        again = settle(port, by_hash(A, id_=2), host_header="mainnet.example")
        assert again.header("x-rpcedge-cache") == "HIT" and result(again)["miner"] == "mainnet-node"
        # and sepolia's kept its own node's answer
        theirs = post(port, by_hash(A), host_header="sepolia.example")
        assert theirs.header("x-rpcedge-cache") == "HIT" and result(theirs)["miner"] == "sepolia-node"
        assert len(sepolia.requests) == 1
    finally:
        nginx.stop()
        mainnet.stop()
        sepolia.stop()


RBAC_DENY_FLAGGED = """\
          - name: envoy.filters.http.rbac
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC
              rules:
                action: DENY
                policies:
                  deny-flagged:
                    permissions: [{any: true}]
                    principals: [{header: {name: x-deny, present_match: true}}]
"""


@pytest.mark.parametrize("host", ENVOY_HOSTS)
def test_a_request_envoy_denies_is_never_answered_from_the_cache(tmp_path, daemon, host):
    """rpcedge after RBAC, as the example configs place it: a hit ends the chain, so a filter
    that refuses requests must come first, and then refuses them whatever the cache holds."""
    node = GoNode("go")
    namespace = f"go-{uuid.uuid4().hex[:12]}"
    text = without_route_namespaces().replace(RPCEDGE_ENTRY, RBAC_DENY_FLAGGED + RPCEDGE_ENTRY, 1)
    envoy = run_envoy(tmp_path, node.port, envoy_plugin(namespace=namespace), text=text,
                      cached_port=daemon.port, adapter=ENVOY_HOSTS[host])
    try:
        assert post(envoy.port, by_hash(A)).header("x-rpcedge-cache") == "MISS"
        assert settle(envoy.port, by_hash(A)).header("x-rpcedge-cache") == "HIT"
        asked = len(node.requests)
        denied = post(envoy.port, by_hash(A), headers={"x-deny": "1"})
        assert denied.status == 403 and A.encode() not in denied.decoded()
        assert denied.header("x-rpcedge-cache") is None
        assert len(node.requests) == asked
    finally:
        envoy.process.stop()
        node.stop()


# geth's CORS handler (rs/cors) on an allowed origin: the origin echoed, and Vary: Origin whether
# or not the request had one
CORS = [("Vary", "Origin"), ("Access-Control-Allow-Origin", "{origin}"), ("Access-Control-Expose-Headers", "X-Node")]


@pytest.mark.parametrize("proxy", ALL_HOSTS, indirect=True)
def test_each_origin_gets_on_a_hit_what_the_node_gave_it(proxy):
    node = GoNode("go", headers=CORS)
    try:
        port = proxy(node).port
        node_headers = ("access-control-allow-origin", "access-control-expose-headers")
        for origin in ["https://a.example", "https://b.example", None, "https://a.example"]:
            headers = {"Origin": origin} if origin else {}
            first = post(port, by_hash(A), headers=headers)
            assert first.header("x-rpcedge-cache") == "MISS", origin
            assert first.header("access-control-allow-origin") == origin
            deadline = time.monotonic() + STORED_WITHIN
            while (hit := post(port, by_hash(A, id_=2), headers=headers)).header("x-rpcedge-cache") != "HIT":
                assert time.monotonic() < deadline, f"{origin}: never a hit"
                time.sleep(0.05)
            assert result(hit)["hash"] == A
            for name in node_headers:
                assert hit.header(name) == first.header(name), (origin, name)
            assert "origin" in [v.strip().lower() for v in hit.header("vary").split(",")], hit.headers
    finally:
        node.stop()


@pytest.mark.parametrize("proxy", ALL_HOSTS, indirect=True)
@pytest.mark.parametrize("header", [("Set-Cookie", "session=1; HttpOnly"), ("Cache-Control", "no-store"),
                                    ("Cache-Control", "private, max-age=60"), ("Vary", "*")])
def test_an_answer_a_shared_cache_must_not_keep_is_never_stored(proxy, header):
    node = GoNode("go", headers=[header])
    try:
        assert_never_stored(proxy(node).port, node, A)
    finally:
        node.stop()


@pytest.mark.parametrize("proxy", NGINX_HOSTS, indirect=True)
def test_what_nginx_adds_itself_is_not_kept_as_the_nodes(proxy):
    """add_header puts its own CORS header on every answer: a hit must not carry a stored copy
    beside it (browsers refuse two), nor keep a header nginx hides from the node's answer."""
    node = GoNode("go", headers=[("X-Node-Secret", "1")])
    try:
        port = proxy(node, extra='add_header Access-Control-Allow-Origin "*" always;\n'
                                  '        proxy_hide_header X-Node-Secret;').port
        first = post(port, by_hash(A))
        assert first.header("x-rpcedge-cache") == "MISS" and first.header_count("access-control-allow-origin") == 1
        hit = settle(port, by_hash(A, id_=2))
        assert hit.header("x-rpcedge-cache") == "HIT"
        assert hit.header_count("access-control-allow-origin") == 1
        assert hit.header("x-node-secret") is None
    finally:
        node.stop()


def test_nginx_takes_no_namespace_from_a_server_name_two_servers_share(tmp_path, daemon):
    """One server_name on two ports, one network each: neither may default to it."""
    mainnet, sepolia = GoNode("mainnet-node"), GoNode("sepolia-node")
    (tmp_path / "rpcedge-cache.conf").write_text((REPO / "configs/nginx/rpcedge-cache.conf").read_text())
    ports = [free_port(), free_port()]
    servers = "".join(f"""
    server {{
        listen {LOOPBACK}:{port};
        server_name rpc.example;
        rpcedge on;
        rpcedge_cache on;
        include rpcedge-cache.conf;

        location / {{
            proxy_pass http://{LOOPBACK}:{node.port};
        }}
    }}
""" for port, node in zip(ports, (mainnet, sepolia)))
    nginx = start_nginx(tmp_path, f"upstream rpcedge_cached {{ server {LOOPBACK}:{daemon.port}; }}\n{servers}",
                        ports)
    try:
        for port in ports:
            for _ in range(2):
                assert post(port, by_hash(A)).header("x-rpcedge-cache") == "BYPASS"
        assert "whose server_name is another server's too" in (tmp_path / "error.log").read_text()
    finally:
        nginx.stop()
        mainnet.stop()
        sepolia.stop()
