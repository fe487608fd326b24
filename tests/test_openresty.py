"""The OpenResty binding (resty.rpcedge over the core's shared library) in Debian's nginx with
libnginx-mod-http-lua and lua-resty-core, running the shipped example config."""

import gzip

import pytest

import replay_corpus as rc
import wire
from conftest import CORPUS, REPO
from harness import Process, free_port
from nginx_harness import NGINX_BIN, check_conf

CORE_LIB = REPO / "target" / "release" / "librpcedge_core.so"
MEDIUM = "erigon_getLatestLogs/erigon-rpc-tests__mainnet__test_10.json"  # 56 KiB answer
SMALL = "eth_call/erigon-rpc-tests__arb-sepolia__test_13.json"  # 102 B answer


@pytest.fixture(scope="module")
def openresty(replay, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("openresty")
    port = free_port()
    text = (REPO / "configs" / "openresty" / "nginx.conf").read_text()
    for old, new in {
        "/opt/rpcedge/target/release/librpcedge_core.so": str(CORE_LIB),
        "/opt/rpcedge/": f"{REPO}/",
        "127.0.0.1:18545": f"127.0.0.1:{replay.port}",
        "127.0.0.1:18082": f"127.0.0.1:{port}",
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    for temp in ("body", "proxy"):
        (prefix / temp).mkdir()
    text = (f"daemon off;\nuser root;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log info;\n"
            + text.replace("http {\n", f"http {{\n    client_body_temp_path {prefix}/body;\n"
                           f"    proxy_temp_path {prefix}/proxy;\n    access_log off;\n", 1))
    conf = prefix / "nginx.conf"
    conf.write_text(text)
    code, output = check_conf(conf, prefix)
    assert code == 0, output
    process = Process("openresty", [NGINX_BIN, "-p", prefix, "-c", conf, "-e", prefix / "error.log"],
                      prefix / "openresty.out")
    process.wait_for_port(port)
    yield port
    process.stop()


def post(port, path, accept_encoding):
    request, _ = rc.read_pairs(CORPUS / path)[0]
    return wire.request(port, f"/{rc.network_of(path)}", method="POST", body=rc.compact(request),
                        headers={"Content-Type": "application/json"}, accept_encoding=accept_encoding)


def direct(replay, path):
    request, _ = rc.read_pairs(CORPUS / path)[0]
    return replay.request("POST", f"/{rc.network_of(path)}", body=rc.compact(request))[2]


def test_lua_compresses_whole_bodies_with_an_exact_length(openresty, replay):
    r = post(openresty, MEDIUM, "gzip;q=0.9, br")
    assert r.status == 200 and r.complete
    assert r.header("content-encoding") == "gzip"
    assert r.header("content-length") == str(len(r.body))
    assert gzip.decompress(r.body) == direct(replay, MEDIUM)
    assert r.header("vary") == "Accept-Encoding"


def test_lua_negotiates_like_the_module(openresty, replay):
    assert post(openresty, MEDIUM, "deflate").header("content-encoding") == "deflate"
    assert post(openresty, MEDIUM, "gzip;q=0").header("content-encoding") is None
    assert post(openresty, MEDIUM, None).decoded() == direct(replay, MEDIUM)


def test_lua_leaves_small_bodies_alone(openresty, replay):
    r = post(openresty, SMALL, "gzip")
    assert r.header("content-encoding") is None
    assert r.body == direct(replay, SMALL)
