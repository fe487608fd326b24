"""Requests for the cache's end-to-end tests, chosen from the recorded corpus by what they are (a
block by hash, a receipt, a null, an error, ...) rather than by file name, and the test stack
that both hosts put in front of them: a replay whose recorded blocks all count as final, and a
cache daemon that polls it for finality."""

import json
import time
from dataclasses import dataclass
from pathlib import Path

from testbed import replay_corpus as rc
from testbed.counters import scrape
from testbed.envoy_harness import (COMPRESSION_PLUGIN_CONFIG, ENVOY_HOSTS, run_envoy, with_route_timeouts,
                                   without_route_namespaces)
from testbed.harness import CORPUS, LOOPBACK, REPO, start_cached, start_replay
from testbed.nginx_harness import free_port, start_nginx
from testbed.stack import BEACON, NETWORKS

# every recorded block counts as final, as in `make run`
FINAL = 1_000_000_000


@dataclass
class Case:
    network: str
    method: str
    request: dict
    response: dict

    def body(self, id_=1, **json_args):
        """The request with `id_`, serialised with `json_args` (indent, sort_keys, ...)."""
        return json.dumps({**self.request, "id": id_}, **json_args).encode()

    def answer(self, id_=1):
        """The recorded answer with `id_`, as the replay writes it."""
        return rc.compact({**self.response, "id": id_})

    @property
    def path(self):
        return f"/{self.network}"


def _pairs(corpus=CORPUS):
    rows = rc.index_rows(corpus)
    for relative in rc.corpus_files(corpus):
        row = rows.get(relative, {})
        if relative.endswith(".tar") or row.get("file_bytes", 0) > 4 << 20:
            continue
        network = rc.network_of(relative)
        flags = row.get("pairs") or []
        for position, (request, response) in enumerate(rc.read_pairs(Path(corpus) / relative)):
            if position < len(flags) and flags[position].get("placeholder_response"):
                continue
            yield network, request, response


def find_all(predicate, limit=None, corpus=CORPUS):
    """The recorded single calls (and their answers) that `predicate(request, response)` takes,
    one per distinct call, at most `limit`."""
    found, seen = [], set()
    for network, request, response in _pairs(corpus):
        if network and isinstance(request, dict) and isinstance(response, dict) and predicate(request, response):
            call = (network, rc.request_key(request))
            if call not in seen:
                seen.add(call)
                found.append(Case(network, request["method"], request, response))
                if len(found) == limit:
                    break
    return found


def find(predicate, corpus=CORPUS):
    """The first recorded single call (and its answer) that `predicate(request, response)` takes."""
    found = find_all(predicate, 1, corpus)
    if not found:
        raise LookupError("no such pair in the corpus")
    return found[0]


def named_block(case):
    """(number, hash) of the one block `case`'s answer names (a block's own, or the block of what
    it holds: a transaction, a receipt, a block's receipts), or None."""
    result = case.response.get("result")
    item = result[0] if isinstance(result, list) and result else result
    if not isinstance(item, dict):
        return None
    for number, block_hash in (("number", "hash"), ("blockNumber", "blockHash")):
        if isinstance(item.get(number), str) and isinstance(item.get(block_hash), str):
            return int(item[number], 16), item[block_hash].lower()
    return None


def pinnable(calls):
    """`calls` without each that names a block an earlier one names by another hash, and the
    (number, hash) of every block they name, for CacheStack(pinned=...): the namespace `late`
    gathers calls of every network, whose block numbers collide, and a daemon keeps an answer
    at a final block only where its finality node gives that number the hash the answer names."""
    hashes, kept = {}, []
    for call in calls:
        block = named_block(call)
        if block and hashes.setdefault(*block) != block[1]:
            continue
        kept.append(call)
    return kept, sorted(hashes.items())


def immutable(request, response):
    """A call whose answer never changes once its block is final, with a result to keep."""
    return (request["method"] in ("eth_getBlockByHash", "eth_getBlockByNumber", "eth_getTransactionReceipt",
                                  "eth_getTransactionByHash", "eth_getBlockReceipts")
            and response.get("result") not in (None, [], {}) and "error" not in response
            and size(response) <= 1 << 20 and "latest" not in json.dumps(request.get("params")))


def size(response):
    return len(rc.compact(response))


def block_by_hash(request, response):
    """A block by hash, large enough to be compressed."""
    return (request["method"] == "eth_getBlockByHash" and isinstance(response.get("result"), dict)
            and 4096 <= size(response) <= 1 << 20)


def receipt(request, response):
    """A transaction receipt, cacheable once its block is final."""
    result = response.get("result")
    return (request["method"] == "eth_getTransactionReceipt" and isinstance(result, dict)
            and isinstance(result.get("blockNumber"), str))


def null_result(request, response):
    return request["method"] in ("eth_getBlockByHash", "eth_getTransactionByHash",
                                 "eth_getTransactionReceipt") and "result" in response and response["result"] is None


def error_answer(request, response):
    return request["method"] in ("eth_getBlockByHash", "eth_getTransactionByHash", "eth_getTransactionReceipt",
                                 "eth_getBlockByNumber", "debug_traceTransaction") and "error" in response


def at_tag(request, response):
    params = request.get("params") or []
    return (request["method"] == "eth_getBalance" and len(params) > 1 and params[1] == "latest"
            and "result" in response)


def not_in_the_table(request, response):
    """A method the cache never takes (the table is an allow-list)."""
    return request["method"] == "eth_blockNumber" and "result" in response


# the transaction methods whose answers name no block: the daemon places them by the receipt
PLACED_BY_RECEIPT = ("debug_traceTransaction", "trace_replayTransaction", "ots_traceTransaction",
                     "ots_getTransactionError", "ots_getInternalOperations")


def trace_by_transaction(request, response):
    """An answer about a transaction that names no block (a trace), of a modest size."""
    params = request.get("params") or [None]
    return (request["method"] in PLACED_BY_RECEIPT and isinstance(params[0], str) and len(params[0]) == 66
            and response.get("result") not in (None, [], {}, "", "0x") and size(response) < 256 * 1024)


def _log_filter(request, response):
    """The filter of an eth_getLogs call that found logs, or None."""
    params = request.get("params") or [None]
    found = request["method"] == "eth_getLogs" and isinstance(response.get("result"), list) and response["result"]
    return params[0] if found and isinstance(params[0], dict) else None


def logs_by_hash(request, response):
    """Logs of a block named by its hash, kept for good."""
    return "blockHash" in (_log_filter(request, response) or {})


def logs_by_range(request, response):
    """Logs of blocks from one number to a higher one, kept once the higher is final."""
    ends = [(_log_filter(request, response) or {}).get(end) for end in ("fromBlock", "toBlock")]
    numbers = all(isinstance(end, str) and end.startswith("0x") for end in ends)
    return numbers and int(ends[0], 16) < int(ends[1], 16)


# the proxies' max_buffer in the tests: a longer answer streams
MAX_BUFFER = 1 << 20
TRACE_METHODS = ("debug_traceBlockByNumber", "debug_traceBlockByHash", "debug_traceTransaction", "trace_block",
                 "trace_replayBlockTransactions", "trace_replayTransaction")


def streamed_traces(limit=3, corpus=CORPUS):
    """Recorded traces whose answers are over max_buffer (and under 8 MiB, to keep rounds of
    them short), each with its network."""
    found = []
    for relative in rc.corpus_files(corpus):
        if Path(relative).parts[0] not in TRACE_METHODS or not rc.network_of(relative):
            continue
        if (Path(corpus) / relative).stat().st_size > 8 << 20:
            continue
        for request, response in rc.read_pairs(Path(corpus) / relative):
            if isinstance(request, dict) and isinstance(response, dict) and MAX_BUFFER < size(response) < 8 << 20:
                found.append(Case(rc.network_of(relative), request["method"], request, response))
                break
        if len(found) == limit:
            break
    assert found, "the corpus has traces over max_buffer"
    return found


def batch_case(corpus=CORPUS):
    """A recorded batch, sent as it was."""
    for network, request, response in _pairs(corpus):
        if network and isinstance(request, list) and request:
            return Case(network, "batch", request, response)
    raise LookupError("no batch in the corpus")


# the hot tier's size when `hot` is True; a number is its size in bytes
HOT_BYTES = 1024 * 1024


def hot_bytes(hot):
    return HOT_BYTES if hot is True else int(hot)


# the cache's settings as the plugin JSON names them, and nginx's directive for each value
NGINX_CACHE_SETTINGS = {
    "max_request": "rpcedge_cache_max_request {};",
    "max_entry": "rpcedge_cache_max_entry {};",
    "chain_ttl_s": "rpcedge_cache_chain_ttl {}s;",
    "store_timeout_s": "rpcedge_cache_store_timeout {}s;",
    "status_reason": "rpcedge_cache_status_reason {};",
    "lock_timeout_ms": "rpcedge_cache_lock_timeout {}ms;",
}


# The lookup timeout the tests run with, unless a test is about the timeout: the product's 50 ms
# expires on a loaded machine (a test's daemon shares two CPUs with the proxy, the node and the
# test), which turns an expected MISS or HIT into ERROR.
LOOKUP_TIMEOUT_MS = 1000


def node_upstream(replay_port):
    """The node's upstream block, with keepalive, and the WebSocket upgrade's map, as the example
    configs have them."""
    return f"""
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ""      "";
    }}
    upstream ethereum_node {{
        server {LOOPBACK}:{replay_port};
        keepalive 8;
    }}"""


def nginx_server(port, replay_port, cached_port, cache=True, timeout_ms=LOOKUP_TIMEOUT_MS, namespace=None, hot=False,
                 extra="", settings=None, transcode=False, encodings=None, address=LOOPBACK, cached_address=LOOPBACK):
    """An http block's upstreams and server: nginx with rpcedge on `address` in front of the node,
    asking the daemon on `cached_address`, and `extra` in the server. As in the example config, each network has its location and its namespace
    (the network's name), and Beacon-API reads theirs (`beacon`); `namespace` instead puts every
    request of the server in that one.
    `settings` are the cache's, named as in the plugin JSON; `encodings`, the codings made."""
    cache = "on" if cache else "off"
    if transcode:
        extra += "\n        rpcedge_transcode on;"
    if encodings:
        extra += f"\n        rpcedge_encodings {' '.join(encodings)};"
    for name, value in (settings or {}).items():
        value = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
        extra += "\n        " + NGINX_CACHE_SETTINGS[name].format(value)
    if namespace:
        extra += f"\n        rpcedge_cache_namespace {namespace};"
        networks = ""
    else:
        networks = "".join(f"""
        location = /{network} {{
            rpcedge_cache_namespace {network};
            proxy_pass http://ethereum_node;
        }}""" for network in NETWORKS)
        networks += f"""
        location /eth/ {{
            rpcedge_cache_namespace {BEACON};
            proxy_pass http://ethereum_node;
        }}"""
    if hot:
        extra += f"\n        rpcedge_cache_hot rpcedge_hot:{hot_bytes(hot) // 1024}k;"
    return f"""
{node_upstream(replay_port)}
    upstream rpcedge_cached {{
        server {cached_address}:{cached_port};
        keepalive 4;
    }}

    server {{
        listen {address}:{port};
        client_max_body_size 8m;
        rpcedge on;
        rpcedge_cache {cache};
        rpcedge_cache_timeout {timeout_ms}ms;
        include rpcedge-cache.conf;
        {extra}

        proxy_http_version 1.1;
        proxy_set_header Connection $connection_upgrade;
        proxy_set_header Upgrade $http_upgrade;
        # as the example: geth and erigon accept an IP address or "localhost" as Host
        proxy_set_header Host localhost;
{networks}

        location / {{
            proxy_pass http://ethereum_node;
        }}
    }}
"""


def envoy_plugin(cache=True, timeout_ms=LOOKUP_TIMEOUT_MS, namespace=None, cluster="rpcedge_cached", hot=False,
                 settings=None, transcode=False, encodings=None):
    """The plugin configuration: compression (and with `transcode`, SSZ for clients that ask,
    within the example listener's buffer limit; with `encodings`, those codings), and the cache
    unless `cache` is false, with `settings` in its section."""
    plugin = COMPRESSION_PLUGIN_CONFIG
    if transcode:
        plugin = plugin[:-1] + ', "transcode": true, "buffer_limit": 68157440}'
    if encodings:
        plugin = plugin[:-1] + f', "encodings": {json.dumps(encodings)}}}'
    if not cache:
        return plugin
    settings = {"cluster": cluster, "timeout_ms": timeout_ms, **(settings or {})}
    if hot:
        settings["hot_bytes"] = hot_bytes(hot)
    if namespace:
        settings["namespace"] = namespace
    return plugin[:-1] + f', "cache": {json.dumps(settings)}}}'


# the Lua binding's shared library, built by `make build`
CORE_LIB = REPO / "target" / "release" / "librpcedge.so"
LUA_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")


def openresty_server(port, replay_port, cached_port, cache=True, timeout_ms=LOOKUP_TIMEOUT_MS, namespace=None,
                     hot=False, settings=None, form="capture", extra="", transcode=False):
    """OpenResty (Debian's nginx with its Lua module) with the Lua binding's daemon form in front of
    the node, laid out as `nginx_server`: each network's location names its namespace (`namespace`
    instead puts every request in that one). `form`: "capture" (the node asked with a subrequest)
    or "proxied" (proxy_pass, the binding in the access phase and the filters); `extra` in the
    server."""
    assert not hot, "the Lua binding keeps no hot tier"
    plugin = envoy_plugin(cache=cache, timeout_ms=timeout_ms, cluster=f"{LOOPBACK}:{cached_port}",
                          settings=settings, transcode=transcode)
    if form == "capture":
        answer = """content_by_lua_block { rpcedge_answer(@NS@) }"""
    else:
        answer = """access_by_lua_block { require("resty.rpcedge").access(rpcedge_settings, @NS@) }
            proxy_pass http://ethereum_node;
            header_filter_by_lua_block { require("resty.rpcedge").header_filter() }
            body_filter_by_lua_block { require("resty.rpcedge").body_filter() }"""
    lua_string = lambda name: "nil" if name is None else json.dumps(name)  # noqa: E731
    routes = [(f"= /{network}", namespace or network) for network in NETWORKS]
    routes += [("/eth/", namespace or BEACON), ("/", namespace)]
    locations = "".join(f"""
        location {route} {{
            {answer.replace("@NS@", lua_string(ns))}
        }}""" for route, ns in routes)
    return f"""
    lua_package_path "{REPO}/nginx-module/lua/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_shared_dict rpcedge_counters 1m;
    init_by_lua_block {{
        local rpcedge = require "resty.rpcedge"
        rpcedge_settings = rpcedge.settings([[{plugin}]])
        function rpcedge_answer(namespace)
            ngx.req.read_body()
            local exchange = rpcedge.exchange(rpcedge_settings)
            exchange:respond(exchange:capture("/__node", namespace))
        end
    }}

{node_upstream(replay_port)}
    server {{
        listen {LOOPBACK}:{port};
        client_max_body_size 8m;
        log_by_lua_block {{ require("resty.rpcedge").log() }}
        {extra}

        proxy_http_version 1.1;
        proxy_set_header Connection $connection_upgrade;
        proxy_set_header Upgrade $http_upgrade;
        # as the example: geth and erigon accept an IP address or "localhost" as Host
        proxy_set_header Host localhost;

        location /__node/ {{
            internal;
            proxy_pass http://ethereum_node/;
        }}

        location = /rpcedge_status {{
            content_by_lua_block {{ require("resty.rpcedge").status() }}
        }}
{locations}
    }}
"""


class PrometheusCounters(dict):
    """Counters as the Lua binding prints them (`rpcedge_cache_responses_hit`), read by the names
    Envoy gives them (`cache.responses.hit`)."""

    def __getitem__(self, name):
        return super().__getitem__("rpcedge_" + name.replace(".", "_"))


def lua_counters(port):
    return PrometheusCounters(scrape(port))


class Proxy:
    def __init__(self, host, port, stop, counters=None, pids=None, nginx=None, envoy=None, address=LOOPBACK):
        self.host, self.port, self.stop, self.counters = host, port, stop, counters
        # where it listens (a loopback address)
        self.address = address
        # the processes whose CPU time the proxy's is
        self.pids = pids
        # nginx_harness.Nginx, for nginx and OpenResty: its master and workers
        self.nginx = nginx
        # envoy_harness.Envoy, for either Envoy
        self.envoy = envoy
        # where it takes HTTP/2 with prior knowledge (h2c), where that was asked for
        self.h2_port = None


def start_proxy(host, workdir, stack, argv_prefix=(), workers=1, **options):
    """nginx (`workers` workers), OpenResty ("openresty": the Lua binding; "openresty-proxied": its
    proxy_pass form) or Envoy with either adapter (`ENVOY_HOSTS`; one worker thread per
    CPU of `argv_prefix`'s, 2 without) with the cache on (unless cache=False), in front of the
    stack's node; `node_timeout_s`, how long the node may take to answer (the hosts' defaults
    otherwise); `listener_file`, Envoy's listener read from a file it watches; `drain_time_s`, how
    long Envoy drains what a change of it replaced; `address` (nginx, Envoy), the loopback address
    it listens on, and `cached_address`, the daemon's."""
    workdir.mkdir(parents=True, exist_ok=True)
    node_timeout_s = options.pop("node_timeout_s", None)
    if node_timeout_s and not host.startswith("envoy"):
        options["extra"] = options.get("extra", "") + f"\n        proxy_read_timeout {node_timeout_s}s;"
    # `cache_pass`: the shipped location rpcedge_cache_pass names, changed (a function of its text)
    cache_pass = options.pop("cache_pass", lambda text: text)
    # `address`: where the proxy listens; `cached_address`, where it asks the daemon
    address, cached_address = options.pop("address", LOOPBACK), options.pop("cached_address", LOOPBACK)
    if host == "nginx":
        port = free_port()
        (workdir / "rpcedge-cache.conf").write_text(cache_pass((REPO / "configs" / "nginx" / "rpcedge-cache.conf").read_text()))
        nginx = start_nginx(workdir, nginx_server(port, stack.replay.port, stack.daemon.port, address=address,
                                                  cached_address=cached_address, **options), [port],
                            argv_prefix=argv_prefix, workers=workers, address=address)
        return Proxy(host, port, nginx.stop, pids=[nginx.process.proc.pid, *nginx.worker_pids()], nginx=nginx,
                     address=address)
    if host.startswith("openresty"):
        port = free_port()
        form = "proxied" if host == "openresty-proxied" else "capture"
        nginx = start_nginx(workdir, openresty_server(port, stack.replay.port, stack.daemon.port, form=form, **options),
                            [port], modules=LUA_MODULES, rpcedge=False, main=f"env RPCEDGE_LIB={CORE_LIB};",
                            argv_prefix=argv_prefix, workers=workers)
        return Proxy(host, port, nginx.stop, lambda: lua_counters(port),
                     pids=[nginx.process.proc.pid, *nginx.worker_pids()], nginx=nginx)
    # the example's routes name each network's namespace; `namespace` puts every request in one
    text = without_route_namespaces() if options.get("namespace") else None
    if node_timeout_s:
        text = with_route_timeouts(node_timeout_s, text)
    listener_file, drain_time_s = options.pop("listener_file", False), options.pop("drain_time_s", None)
    envoy = run_envoy(workdir, stack.replay.port, envoy_plugin(**options), text=text, cached_port=stack.daemon.port,
                      argv_prefix=argv_prefix, concurrency=1 if argv_prefix else 2, adapter=ENVOY_HOSTS[host],
                      listener_file=listener_file, drain_time_s=drain_time_s, address=address,
                      cached_address=cached_address)
    return Proxy(host, envoy.port, envoy.process.stop, envoy.counters, pids=[envoy.process.proc.pid], envoy=envoy,
                 address=address)


# A daemon that hears finality move within a test: polled often, each word believed at once (a
# jump is not held: tests/test_cached.py tests the hold).
def finality_args(hold, poll="100ms"):
    """A daemon's finality polled every `poll`, each node held to what it said over `hold`."""
    return ("--finality-poll", poll, "--finality-hold", hold)


QUICK_FINALITY = finality_args("0s")
# The daemon's own hold on a jump of finality (--finality-hold's default), for a stack whose
# finality moves only as a lie does (the fault matrix's)
DAEMON_HOLD = "1m"


class CacheStack:
    """The node (a replay of the corpus, which counts the requests it answers), a second replay
    without recordings that only says which block is finalized, and each recorded block's hash
    (so that the daemon's polls and pins are not counted as the node's work), and a cache daemon that polls it for the namespaces, one per
    network and named after it: every recorded block is final there. The namespace `late` starts
    at block 0: finality never moves back, so tests move this one forward."""

    LATE = "late"
    # The namespace of Beacon-API reads, whose finalized slot the heads replay says (`beacon`):
    # each daemon starts just before the real blinded block's slot (348241); tests move it.
    BEACON = BEACON
    BEACON_FINAL = 348240

    def __init__(self, log_dir, networks, daemon_args=(), placed=(), pinned=(), finality_hold=None, finality_poll=None):
        self.networks = sorted(set(networks))
        # `finality_poll`: how often its daemons ask (a stack of many daemons whose finality
        # does not move asks less often)
        self.finality = finality_args(finality_hold or "0s", finality_poll or "100ms")
        finals = [arg for network in self.networks for arg in ("--finalized", f"{network}={FINAL}")]
        finals += ["--finalized", f"{self.LATE}=0", "--finalized", f"beacon={self.BEACON_FINAL}"]
        self.log_dir = Path(log_dir)
        # the replay wants one recording to start; the heads are all it serves here
        heads_only = self.log_dir / "heads-only"
        heads_only.mkdir(exist_ok=True)
        (heads_only / "heads.json").write_text(json.dumps([{
            "request": {"jsonrpc": "2.0", "id": 1, "method": "web3_clientVersion", "params": []},
            "response": {"jsonrpc": "2.0", "id": 1, "result": "heads-only"}}]))
        # in `late`, the receipts of `placed` (transaction hash, block): where the daemon finds
        # the block of an answer that names none
        (heads_only / f"test__{self.LATE}__receipts.json").write_text(json.dumps([{
            "request": {"jsonrpc": "2.0", "id": 1, "method": "eth_getTransactionReceipt", "params": [tx.lower()]},
            "response": {"jsonrpc": "2.0", "id": 1,
                         "result": {"transactionHash": tx.lower(), "blockNumber": hex(block), "status": "0x1"}},
        } for tx, block in placed]))
        # and the headers of `pinned` (block number, hash): the hash of a block its answers name
        (heads_only / f"test__{self.LATE}__headers.json").write_text(json.dumps([{
            "request": {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": [hex(number), False]},
            "response": {"jsonrpc": "2.0", "id": 1, "result": {"number": hex(number), "hash": block_hash}},
        } for number, block_hash in pinned]))
        self.replay = start_replay(log_dir, name="rpcedge-replay-node")
        # and the hash of each recorded block, by which the daemon pins what it keeps
        self.heads = start_replay(log_dir, corpus=heads_only, args=[*finals, "--hashes-from", CORPUS],
                                  name="rpcedge-replay-heads")
        self.daemon_args = list(daemon_args)
        self.daemon = None
        self.start_daemon()

    def fresh_daemon(self, port=None):
        """Replaces the daemon with one on an empty store (on `port`, or a free one), and the
        `late` namespace's finality with block 0, so that a test starts from nothing."""
        if self.daemon:
            self.daemon.process.stop()
        self.daemons_started = getattr(self, "daemons_started", 0) + 1
        assert self.heads.request("PUT", f"/head/{self.LATE}/finalized", b"0")[0] == 200
        assert self.heads.request("PUT", f"/head/{self.BEACON}/finalized", str(self.BEACON_FINAL).encode())[0] == 200
        self.start_daemon(db_name=f"db-{self.daemons_started}", port=port)
        self.wait_for_finality(self.LATE, 0)
        return self.daemon

    def another_daemon(self, name, args=(), address=LOOPBACK):
        """A second daemon with the same finality sources (another host's, on `address`), with
        `args` too; the caller stops it."""
        current = self.daemon
        try:
            return self.start_daemon(db_name=name, args=args, address=address)
        finally:
            self.daemon = current

    def start_daemon(self, db_name="db", port=None, args=(), address=LOOPBACK):
        """A daemon on the store `db_name` (in the log directory, or where an absolute path says),
        with the stack's arguments and `args`, listening on `address`."""
        upstreams = [arg for network in [*self.networks, self.LATE] for arg in
                     ("--finality-upstream",
                      f"{network}=http://{LOOPBACK}:{self.heads.port}/{network}")]
        upstreams += ["--beacon-upstream", f"{self.BEACON}=http://{LOOPBACK}:{self.heads.port}/"]
        self.daemon = start_cached(self.log_dir, self.log_dir / db_name, port=port,
                                   args=[*upstreams, *self.finality, *self.daemon_args, *args], address=address)
        for network in self.networks:
            self.wait_for_finality(network, FINAL)
        self.wait_for_finality(self.BEACON, self.BEACON_FINAL, what="finalized_slot")
        return self.daemon

    def wait_for_finality(self, network, number, timeout=10, what="finalized_block"):
        deadline = time.monotonic() + timeout
        name = f'{what}{{namespace="{network}"}}'
        while self.daemon.stats().get(name) != number:
            assert time.monotonic() < deadline, f"the daemon never heard {network} finalize {number}"
            time.sleep(0.05)

    def say_finalized(self, number):
        """Makes the finality node say `number` is finalized in every network (not `late`, nor
        the beacon chain), without waiting for the daemon."""
        for network in self.networks:
            assert self.heads.request("PUT", f"/head/{network}/finalized", str(number).encode())[0] == 200

    def finalize_late(self, number):
        """Moves the `late` namespace's finalized block to `number`, and waits until the daemon
        has heard it."""
        assert self.heads.request("PUT", f"/head/{self.LATE}/finalized", str(number).encode())[0] == 200
        self.wait_for_finality(self.LATE, number)

    def finalize_slot(self, slot):
        """Moves the beacon chain's finalized slot to `slot`, and waits until the daemon has heard
        it."""
        assert self.heads.request("PUT", f"/head/{self.BEACON}/finalized", str(slot).encode())[0] == 200
        self.wait_for_finality(self.BEACON, slot, what="finalized_slot")

    def node_requests(self, kind="rpc_requests"):
        """JSON-RPC requests the replay has answered (`beacon_requests`: Beacon-API ones)."""
        status, _, body = self.replay.request("GET", "/stats")
        assert status == 200
        return json.loads(body)[kind]

    def stop(self):
        if self.daemon:
            self.daemon.process.stop()
        self.replay.process.stop()
        self.heads.process.stop()
