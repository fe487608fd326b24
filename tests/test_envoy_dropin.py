"""The drop-in contract in real Envoy (1.40): where rpcedge has no work on an exchange, the client,
the node and every other filter see what they would without rpcedge, and every request gets its
answer.

One Envoy config runs without rpcedge ("plain") and with it: the native module, the Wasm filter
as its drop-in snippet ships ("wasm") and the Wasm filter with Envoy's default for
`allow_on_headers_stop_iteration` ("wasm-default", off). Its listeners put rpcedge where
envoy-filter/README.md says, after Envoy's compressor ("documented"), and before it
("rpcedge-first"); a Lua filter after rpcedge reports the Accept-Encoding it saw, routes match on
request headers, and an access log records the request headers as Envoy logs them. Two more put
Envoy's response decompressor after rpcedge and before it, and one has rpcedge's cache on
("cached"). The node is the delivery upstream (testbed/delivery_upstream.py), which says what it
was asked."""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed import wire
from testbed.delivery_upstream import Delivery, page
from testbed.envoy_harness import COMPRESSION_PLUGIN_CONFIG, Envoy, native_entry, ready, start_envoy, wasm_entry
from testbed.harness import LOOPBACK, free_port

VARIANTS = ("native", "wasm", "wasm-default")
LISTENERS = ("documented", "rpcedge-first", "decompressing", "decompressing-first", "cached")
CACHE_PLUGIN_CONFIG = COMPRESSION_PLUGIN_CONFIG[:-1] + ', "cache": {"cluster": "rpcedge_cached", "timeout_ms": 50}}'
# How long any answer may take here (a held head waits at most COMPRESSION_PLUGIN_CONFIG's
# stream_delay_ms, 100, for its body).
ANSWER_TIMEOUT = 5
# Headers that differ between any two answers.
VOLATILE = {"date", "x-envoy-upstream-service-time"}

COMPRESSOR = """\
          - name: envoy.filters.http.compressor
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor
              response_direction_config:
                common_config:
                  min_content_length: 30
              compressor_library:
                name: gzip
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip
"""
# A filter after rpcedge, as many read the request: what Accept-Encoding it saw, in the answer.
LATER_FILTER = """\
          - name: later
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(request)
                    local seen = request:headers():get("accept-encoding") or "none"
                    request:streamInfo():dynamicMetadata():set("later", "accept-encoding", seen)
                  end
                  function envoy_on_response(response)
                    local later = response:streamInfo():dynamicMetadata():get("later") or {}
                    response:headers():add("x-later-accept-encoding", later["accept-encoding"] or "unseen")
                  end
"""
# Asks the node for gzip (adding it to the request's Accept-Encoding), and decodes its answer.
DECOMPRESSOR = """\
          - name: envoy.filters.http.decompressor
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.decompressor.v3.Decompressor
              decompressor_library:
                name: gzip
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.compression.gzip.decompressor.v3.Gzip
"""
ROUTER = """\
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"""
LISTENER = """\
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    per_connection_buffer_limit_bytes: 2097152
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {access_log}
              log_format:
                text_format_source:
                  inline_string: "%REQ(X-DROPIN-ID)% accept-encoding=%REQ(ACCEPT-ENCODING)% accept=%REQ(ACCEPT)%\\n"
          route_config:
            virtual_hosts:
            - name: delivery
              domains: ["*"]
              routes:
              - match: {{prefix: "/routed", headers: [{{name: accept-encoding, present_match: true}}]}}
                route: {{cluster: delivery, timeout: 30s}}
                response_headers_to_add: [{{header: {{key: x-route, value: with-accept-encoding}}}}]
              - match: {{prefix: "/routed"}}
                route: {{cluster: delivery, timeout: 30s}}
                response_headers_to_add: [{{header: {{key: x-route, value: without-accept-encoding}}}}]
              - match: {{prefix: "/"}}
                metadata: {{filter_metadata: {{rpcedge: {{cache_namespace: dropin}}}}}}
                route: {{cluster: delivery, timeout: 30s}}
          http_filters:
{filters}"""
CONFIG = """\
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
{listeners}
  clusters:
  - name: delivery
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: delivery
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
  # the cache's daemon, which is not there: every lookup fails, and the request goes to the node
  - name: rpcedge_cached
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: rpcedge_cached
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {cached}}}}}}}}}]}}]
"""


def rpcedge_entry(variant, plugin_config):
    """The variant's http_filters entry for rpcedge ("" for none)."""
    if variant == "plain":
        return ""
    if variant == "native":
        return native_entry(plugin_config)
    return wasm_entry(plugin_config, allow_on_headers_stop_iteration=variant == "wasm")


def listeners(variant, ports, logs):
    """The variant's listeners, with its rpcedge in each."""
    chains = {
        "documented": COMPRESSOR + rpcedge_entry(variant, COMPRESSION_PLUGIN_CONFIG) + LATER_FILTER,
        "rpcedge-first": rpcedge_entry(variant, COMPRESSION_PLUGIN_CONFIG) + COMPRESSOR + LATER_FILTER,
        "decompressing": rpcedge_entry(variant, COMPRESSION_PLUGIN_CONFIG) + DECOMPRESSOR,
        "decompressing-first": DECOMPRESSOR + rpcedge_entry(variant, COMPRESSION_PLUGIN_CONFIG),
        "cached": rpcedge_entry(variant, CACHE_PLUGIN_CONFIG),
    }
    return "".join(LISTENER.format(name=f"{variant}-{name}", port=ports[name], access_log=logs[name],
                                   filters=chains[name] + ROUTER)
                   for name in LISTENERS)


class Proxy:
    """One variant: its Envoy, its listeners' ports and access logs."""

    def __init__(self, envoy, ports, logs):
        self.envoy, self.ports, self.logs = envoy, ports, logs

    def request(self, listener, path, **kwargs):
        return wire.request(self.ports[listener], path, timeout=ANSWER_TIMEOUT, **kwargs)

    def logged(self, listener, request_id):
        """The access log's line for the request of this x-dropin-id (Envoy writes it once the stream
        is over, and flushes within --file-flush-interval-msec)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lines = [line for line in self.logs[listener].read_text().splitlines() if line.startswith(f"{request_id} ")]
            if lines:
                return lines[0]
            time.sleep(0.02)
        raise AssertionError(f"no access log line for {request_id}")


@pytest.fixture(scope="module")
def upstream():
    delivery = Delivery()
    yield delivery
    delivery.stop()


# The variants each Envoy runs: both Wasm ones share one, whose V8 compiles the module once.
ENVOYS = {"plain": ("plain",), "native": ("native",), "wasm": ("wasm", "wasm-default")}


@pytest.fixture(scope="module")
def proxies(upstream, tmp_path_factory):
    """Every variant, its Envoy started with the others'."""
    workdir = tmp_path_factory.mktemp("envoy-dropin")
    started, envoys = {}, []
    try:
        for name, variants in ENVOYS.items():
            admin, texts = free_port(), []
            for variant in variants:
                ports = {listener: free_port() for listener in LISTENERS}
                logs = {listener: workdir / f"{variant}-{listener}.access.log" for listener in LISTENERS}
                for log in logs.values():
                    log.touch()
                texts.append(listeners(variant, ports, logs))
                started[variant] = Proxy(None, ports, logs)
            text = CONFIG.format(admin=admin, listeners="".join(texts), upstream=upstream.port, cached=free_port())
            process = start_envoy(workdir, text, f"envoy-{name}", concurrency=1, args=("--file-flush-interval-msec", "20"))
            envoys.append(Envoy(process, None, admin, None))
            for variant in variants:
                started[variant].envoy = envoys[-1]
        for envoy in envoys:
            ready(envoy)
        yield started
    finally:
        for envoy in envoys:
            envoy.process.stop()


def seen(response, unlike=()):
    """What a client sees of an answer that may be compared: its status, its headers but those that
    differ between any two answers (and `unlike`), and its body decoded."""
    headers = sorted((n, v) for n, v in response.headers if n not in VOLATILE and n not in unlike)
    return response.status, headers, response.decoded()


def json_rpc(size=0):
    """A JSON-RPC call (and the path of an answer of `size` bytes), as a client POSTs it."""
    call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}).encode()
    return f"/rpc?size={size}", {"content-type": "application/json"}, call


# Pages rpcedge has no work on: under its min_length, or of a type it does not compress. Envoy's
# compressor compresses each. (rpcedge holds a chunked one until it knows its length is under
# min_length: its compressed bytes are the same page in other deflate blocks.)
PAGES = {
    "213 B html": "/page",
    "900 B html, chunked": "/page?size=900&framing=chunked&chunks=3",
    "4 KiB svg": "/page?size=4096&type=image/svg%2Bxml",
}


@pytest.mark.parametrize("listener", ["documented", "rpcedge-first"])
@pytest.mark.parametrize("name", list(PAGES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_page_rpcedge_has_no_work_on_reaches_everyone_as_without_it(proxies, variant, name, listener):
    # The client gets the compressor's answer; the node, the later filter and the access log see the
    # client's Accept-Encoding and Accept: the page's answer says so.
    headers = {"accept": "text/html", "x-dropin-id": f"page-{variant}-{listener}"}
    without, through = (proxies[v].request(listener, PAGES[name], headers=headers) for v in ("plain", variant))
    assert without.header("content-encoding") == "gzip" and without.header("x-asked-accept-encoding") == "gzip"
    assert seen(through) == seen(without)
    if not without.chunked:
        assert through.body == without.body
    assert proxies[variant].logged(listener, headers["x-dropin-id"]) == proxies["plain"].logged(listener, headers["x-dropin-id"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_route_matchers_see_the_clients_headers(proxies, variant):
    path, headers, call = json_rpc()
    for method, body in (("GET", b""), ("POST", call)):
        without, through = (proxies[v].request("documented", f"/routed{path}", method=method, headers=headers, body=body)
                            for v in ("plain", variant))
        assert without.header("x-route") == "with-accept-encoding"
        # rpcedge has work on the POST: Envoy's Wasm host routes it again as the node gets it
        # (envoy-filter/README.md)
        if method == "GET" or variant == "native":
            assert through.header("x-route") == without.header("x-route"), method


@pytest.mark.parametrize("size", [200, 20_000])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_json_rpc_post_asks_the_node_without_accept_encoding(proxies, variant, size):
    # rpcedge has work on the answer: the node is asked for identity, and the client gets it
    # compressed, by the compressor (a small one, as without rpcedge) or by rpcedge.
    path, headers, call = json_rpc(size)
    headers["x-dropin-id"] = f"rpc-{variant}-{size}"
    without, through = (proxies[v].request("documented", path, method="POST", headers=headers, body=call)
                        for v in ("plain", variant))
    assert without.header("x-asked-accept-encoding") == "gzip"
    # the node, and the filters after rpcedge, read the request rpcedge sends the node
    assert through.header("x-asked-accept-encoding") is None
    assert through.header("x-later-accept-encoding") == "none"
    assert through.header("content-encoding") == "gzip"
    assert through.decoded() == without.decoded()
    if size < 1024:
        # under min_length: Envoy's compressor compresses it, as it read the client's Accept-Encoding
        # before rpcedge; after rpcedge it reads the node's, and does not
        for_the_node = ("x-asked-accept-encoding", "x-later-accept-encoding")
        assert seen(through, for_the_node) == seen(without, for_the_node)
        assert through.body == without.body
        first = proxies[variant].request("rpcedge-first", path, method="POST", headers=headers, body=call)
        assert first.header("content-encoding") is None
    if variant == "native":
        # the request headers as Envoy logs them are the client's again (the Wasm host lets a
        # filter change them only while it holds them: README.md)
        logged = proxies[variant].logged("documented", headers["x-dropin-id"])
        assert logged == proxies["plain"].logged("documented", headers["x-dropin-id"])


def exchange(port, request, timeout=ANSWER_TIMEOUT):
    """One raw request on a fresh connection: its answer, read to the end of the connection
    (status 0 when none came in time)."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
        sock.sendall(request)
        try:
            data, reset = wire.receive(sock)
        except socket.timeout:
            return wire.parse(b"")
    return wire.parse(data, reset=reset)


def chunked_post(port, path, body, content_type):
    """A POST whose body comes in chunks, without a length."""
    head = (f"POST {path} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nConnection: close\r\nAccept-Encoding: gzip\r\n"
            f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    third = -(-len(body) // 3) or 1
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[at:at + third]), body[at:at + third]) for at in range(0, len(body), third))
    return head + chunks + b"0\r\n\r\n"


# Answers of each size, type and framing, to GETs; requests with bodies of each size and framing.
ANSWERS = [f"/page?size={size}&type={kind}{framing}"
           for size in (0, 213, 1500, 20_000, 300_000)
           for kind in ("text/html", "application/json", "application/octet-stream")
           for framing in ("", "&framing=chunked&chunks=4&gap_ms=5")]
BODIES = [(b"", "application/json"), (b"x" * 100, "text/plain"), (json_rpc()[2], "application/json"),
          (b"{" + b"0" * 70_000 + b"}", "application/json")]


@pytest.mark.parametrize("listener", ["documented", "cached"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_request_gets_its_answer(proxies, variant, listener):
    port = proxies[variant].ports[listener]

    def get(path):
        return path, exchange(port, wire.head(port, path))

    def post(case):
        (body, content_type), chunked = case
        path = "/page?size=1500&type=application/json"
        if chunked:
            return f"chunked {len(body)} B", exchange(port, chunked_post(port, path, body, content_type))
        return f"{len(body)} B", exchange(port, wire.head(port, path, "POST", {"content-type": content_type}, body))

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(get, ANSWERS)) + list(pool.map(post, [(b, c) for b in BODIES for c in (False, True)]))
    unanswered = [name for name, response in answers if not (response.status == 200 and response.complete)]
    assert not unanswered, f"no answer within {ANSWER_TIMEOUT} s: {unanswered}"
    for path, response in answers[:len(ANSWERS)]:
        query = dict(part.split("=") for part in path.split("?")[1].split("&"))
        assert response.decoded() == page(int(query["size"]), query["type"]), path
    for (name, response), ((body, _), _) in zip(answers[len(ANSWERS):], [(b, c) for b in BODIES for c in (False, True)]):
        assert response.header("x-asked-body-length") == str(len(body)), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_envoys_decompressor_and_rpcedge(proxies, variant):
    # Envoy's decompressor asks the node for gzip and decodes its answer. After rpcedge, a page
    # reaches the client as without rpcedge; before it, it decodes what rpcedge compressed.
    page_path = "/page?coding=gzip"
    without, through = (proxies[v].request("decompressing", page_path) for v in ("plain", variant))
    assert without.header("x-asked-accept-encoding") == "gzip" and without.header("content-encoding") is None
    assert seen(through) == seen(without)
    path, headers, call = json_rpc(20_000)
    path += "&coding=gzip"
    undone = proxies[variant].request("decompressing-first", path, method="POST", headers=headers, body=call)
    assert undone.header("content-encoding") is None
    if variant == "wasm":
        # it ends a body in trailers of its own, which Envoy shows a filter that holds the body only
        # in their own callback, and the Wasm filter cannot read them sooner (README.md)
        return
    answer = proxies[variant].request("decompressing", path, method="POST", headers=headers, body=call)
    assert answer.header("x-asked-accept-encoding") == "gzip"
    # (Envoy's default for the Wasm filter passes no body to a held head: there, rpcedge lets the
    # answer it would compress whole go as it came)
    assert answer.header("content-encoding") == (None if variant == "wasm-default" else "gzip")
    plain = proxies["plain"].request("decompressing", path, method="POST", headers=headers, body=call)
    assert answer.decoded() == plain.decoded()
