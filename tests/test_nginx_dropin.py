"""The drop-in contract in nginx: one operator's config, with rpcedge on and without it. Where
rpcedge has no work on an exchange (a page, a file, an encoded answer of another upstream), the
client, nginx's own modules (gzip, gunzip, gzip_static, proxy_cache's Vary) and the access log see
exactly what they would without rpcedge; where it has work (a JSON-RPC call, a Beacon-API read),
the node alone is asked for identity."""

import gzip
import json
import socket
import time

import pytest

from testbed import wire
from testbed.nginx_harness import LOOPBACK, free_port, start_nginx

PAGE = b"<html><body>" + b"a page that nginx's gzip compresses " * 2 + b"</body></html>\n"  # 86 B
CALL = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
JSON = {"Content-Type": "application/json"}

# The backend stands for every upstream: it answers with what it was asked (the node's view),
# serves a page, and a gzipped file to whichever client (gunzip's case).
BACKEND = """
    server {{
        listen {host}:{backend};
        default_type text/html;

        # the node: what it was asked, in its answer
        location /asked {{
            default_type application/json;
            return 200 "{{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1,\\"result\\":\\"$http_accept_encoding\\"}}";
        }}

        # a page's upstream: what it was asked, in its head
        location /page {{
            add_header X-Asked-Accept-Encoding "$http_accept_encoding" always;
            return 200 "<html><body>a page made for this request, long enough for gzip</body></html>";
        }}

        location /eth/ {{
            default_type application/json;
            add_header X-Asked-Accept-Encoding "$http_accept_encoding" always;
            return 200 "{{\\"data\\":{{\\"is_syncing\\":false,\\"asked\\":\\"$http_accept_encoding\\"}}}}";
        }}

        location /varies {{
            gzip on;
            gzip_min_length 10;
            gzip_vary on;
            gzip_proxied any;
            root {root};
        }}

        location /always {{
            gzip_static always;
            root {root};
        }}
    }}
"""

FRONT = """
    log_format dropin '$request_uri "$http_accept_encoding" "$http_accept"';
    proxy_cache_path {prefix}/cache keys_zone=dropin:1m;

    server {{
        listen {host}:{front};
        access_log {prefix}/dropin.log dropin;
        gzip on;
        gzip_min_length 10;
        gzip_proxied any;
        {rpcedge}

        location /static/ {{
            root {root};
        }}

        location /page {{
            proxy_pass http://{host}:{backend};
        }}

        location / {{
            proxy_pass http://{host}:{backend}/asked;
        }}

        location /eth/ {{
            proxy_pass http://{host}:{backend};
        }}

        location /varies/ {{
            proxy_cache dropin;
            proxy_cache_valid 200 1m;
            proxy_pass http://{host}:{backend};
        }}

        location /always/ {{
            gunzip on;
            proxy_pass http://{host}:{backend};
        }}
    }}
"""


def files(root):
    (root / "static").mkdir(parents=True)
    (root / "static" / "index.html").write_bytes(PAGE)
    (root / "varies").mkdir()
    (root / "varies" / "page.html").write_bytes(PAGE * 4)
    (root / "always").mkdir()
    (root / "always" / "page.html.gz").write_bytes(gzip.compress(PAGE * 4, mtime=0))


@pytest.fixture(scope="module")
def proxies(tmp_path_factory):
    """Two nginx, the same config but for `rpcedge on;` in one of them: {name: (nginx, port)}."""
    started = {}
    try:
        for name, on in (("stock", False), ("rpcedge", True)):
            prefix = tmp_path_factory.mktemp(name)
            files(prefix / "root")
            front, backend = free_port(), free_port()
            values = dict(host=LOOPBACK, front=front, backend=backend, prefix=prefix, root=prefix / "root",
                          rpcedge="rpcedge on;" if on else "")
            # the stock nginx's log format names no rpcedge variable: the harness's is left out
            nginx = start_nginx(prefix, BACKEND.format(**values) + FRONT.format(**values), [front, backend],
                                rpcedge=on)
            started[name] = (nginx, front)
        yield started
    finally:
        for nginx, _ in started.values():
            nginx.stop()


def both(proxies, path, **kwargs):
    """The same request to both: {name: wire.Response}."""
    return {name: wire.request(port, path, **kwargs) for name, (_, port) in proxies.items()}


def seen(response):
    """What a client can tell apart: status, the headers that matter, the decoded body."""
    names = ("content-encoding", "vary", "content-type", "x-asked-accept-encoding")
    return response.status, {name: response.header(name) for name in names}, response.decoded()


def test_a_page_nginx_serves_is_gzipped_as_without_rpcedge(proxies):
    for path in ("/static/index.html", "/page"):
        got = both(proxies, path, accept_encoding="gzip")
        assert got["stock"].header("content-encoding") == "gzip", path
        assert seen(got["rpcedge"]) == seen(got["stock"]), path
        assert got["rpcedge"].body == got["stock"].body, path


def test_an_upstream_other_than_the_node_is_asked_as_the_client_asked(proxies):
    # a GET of a page, and a POST that is no JSON-RPC call (a form): the client's Accept-Encoding
    for kwargs in ({}, {"method": "POST", "body": b"a=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}):
        got = both(proxies, "/page", accept_encoding="gzip, br", **kwargs)
        assert got["stock"].header("x-asked-accept-encoding") == "gzip, br"
        assert seen(got["rpcedge"]) == seen(got["stock"]), kwargs


def test_the_node_alone_is_asked_for_identity(proxies):
    # a JSON-RPC call and a Beacon-API read: rpcedge's work, so the node answers identity
    got = both(proxies, "/", method="POST", body=CALL, headers=JSON, accept_encoding="gzip")
    assert json.loads(got["stock"].decoded())["result"] == "gzip"
    assert json.loads(got["rpcedge"].decoded())["result"] == ""
    got = both(proxies, "/eth/v1/node/syncing", accept_encoding="gzip")
    assert json.loads(got["stock"].decoded())["data"]["asked"] == "gzip"
    assert json.loads(got["rpcedge"].decoded())["data"]["asked"] == ""


def test_a_call_whose_body_comes_later_asks_the_node_for_identity_too(proxies):
    # the node's request is made once the body is in, after the content handler has returned
    _, port = proxies["rpcedge"]
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        sock.sendall(wire.head(port, "/", "POST", headers={**JSON, "Content-Length": str(len(CALL))},
                               accept_encoding="gzip"))
        time.sleep(0.3)
        sock.sendall(CALL)
        data, reset = wire.receive(sock)
    response = wire.parse(data, reset=reset)
    assert response.status == 200
    assert json.loads(response.decoded())["result"] == ""


def test_the_log_sees_the_clients_accept_encoding(proxies):
    for name, (nginx, port) in proxies.items():
        wire.request(port, "/page?log", accept_encoding="gzip, zstd")
        wire.request(port, "/?log", method="POST", body=CALL, headers=JSON, accept_encoding="gzip, zstd")
    wanted = ['/page?log "gzip, zstd" "-"', '/?log "gzip, zstd" "-"']
    for name, (nginx, _) in proxies.items():
        # nginx logs a request once its answer has gone out: the line may follow the answer
        deadline = time.monotonic() + 5
        while (logged := [line for line in (nginx.prefix / "dropin.log").read_text().splitlines() if "?log" in line]) != wanted:
            assert time.monotonic() < deadline, (name, logged)
            time.sleep(0.05)


def test_proxy_cache_keeps_its_variants_by_accept_encoding(proxies):
    for name, (_, port) in proxies.items():
        first = wire.request(port, "/varies/page.html", accept_encoding="gzip")
        plain = wire.request(port, "/varies/page.html", accept_encoding=None)
        again = wire.request(port, "/varies/page.html", accept_encoding="gzip")
        assert first.header("content-encoding") == "gzip", name
        assert plain.header("content-encoding") is None and plain.body == PAGE * 4, name
        assert again.header("content-encoding") == "gzip", name


def test_gunzip_decodes_only_for_a_client_that_takes_no_gzip(proxies):
    for accept_encoding in ("gzip", None):
        got = both(proxies, "/always/page.html", accept_encoding=accept_encoding)
        assert seen(got["rpcedge"]) == seen(got["stock"]), accept_encoding
        assert got["rpcedge"].body == got["stock"].body, accept_encoding
        assert got["rpcedge"].decoded() == PAGE * 4
    assert got["stock"].header("content-encoding") is None
