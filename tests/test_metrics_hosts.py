"""One vocabulary of counters on every host (rpcedge_core::metrics): the same requests through nginx,
Envoy's Wasm filter and Envoy's native module, each with the cache daemon before the same node,
give the same counter names and the same values in Prometheus' text format, the native module's
after the relabelling docs/metrics.md gives (and docker/prometheus.yml uses). Each host has its hot tier
on; Envoy runs one worker, as the Wasm filter's hot tier is its worker's own."""

import json
import re
import time

import pytest

from testbed import cache_cases as cc
from testbed import wire
from testbed.cache_cases import envoy_plugin, nginx_server
from testbed.counters import parse, scrape
from testbed.envoy_harness import ENVOY_HOSTS, run_envoy
from testbed.harness import REPO
from testbed.nginx_harness import free_port, start_nginx
from test_nginx import BUCKETS

# the relabelling docker/prometheus.yml gives the native module's counters, as Prometheus applies it
# (the regex anchored, $1 its group)
PROMETHEUS_YML = (REPO / "docker" / "prometheus.yml").read_text()
RELABEL = (re.search(r"regex: (\S+)", PROMETHEUS_YML).group(1),
           re.search(r"replacement: (\S+)", PROMETHEUS_YML).group(1).replace("$1", r"\1"))
# what differs by the clock alone
TIMED = {"rpcedge_compress_time_us"}
# what a streamed answer's compressed bytes are depends on where its flushes fell (how the upstream's
# reads came, the stream delay): the test compares the bytes out of everything else
STREAMED_OUT = "rpcedge_body_bytes_out"
SSZ = "application/octet-stream"
STATUS = """
        location = /rpcedge_status {
            rpcedge_status;
            rpcedge off;
            rpcedge_cache off;
        }
        rpcedge_transcode on;"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    networks = [cc.find(cc.block_by_hash).network, cc.find(cc.null_result).network, cc.batch_case().network]
    stack = cc.CacheStack(tmp_path_factory.mktemp("metrics-stack"), networks)
    yield stack
    stack.stop()


def relabelled(name):
    match = re.fullmatch(RELABEL[0], name)
    return match.expand(RELABEL[1]) if match else name


def envoy_counters(text):
    """The counters Envoy prints under rpcedge's names, relabelled: each `# TYPE` line with its
    sample, as nginx prints them (histograms and Envoy's own stats left out)."""
    lines = text.splitlines()
    rpcedge = []
    for at, line in enumerate(lines):
        declared = re.fullmatch(r"# TYPE (\S+) counter", line)
        if declared and relabelled(declared.group(1)).startswith("rpcedge_"):
            rpcedge += [f"# TYPE {relabelled(declared.group(1))} counter", relabelled(lines[at + 1])]
    return parse("\n".join(rpcedge))


class Host:
    def __init__(self, name, stack, workdir):
        workdir.mkdir(parents=True, exist_ok=True)
        if name == "nginx":
            self.port = free_port()
            (workdir / "rpcedge-cache.conf").write_text((REPO / "configs/nginx/rpcedge-cache.conf").read_text())
            server = nginx_server(self.port, stack.replay.port, stack.daemon.port, hot=True, extra=STATUS)
            nginx = start_nginx(workdir, server, [self.port], workers=2)
            self.stop = nginx.stop
            self.scrape = lambda: scrape(self.port)
        else:
            plugin = json.loads(envoy_plugin(hot=True))
            plugin.update(transcode=True, buffer_limit=68157440)  # the example listener's limit
            envoy = run_envoy(workdir, stack.replay.port, json.dumps(plugin), cached_port=stack.daemon.port,
                              adapter=ENVOY_HOSTS[name], concurrency=1)
            self.port, self.stop = envoy.port, envoy.process.stop
            self.scrape = lambda: envoy_counters(envoy.admin_get("/stats/prometheus"))

    def settled(self, until):
        """The counters once `until` holds of them and two scrapes agree."""
        deadline = time.monotonic() + 10
        before = self.scrape()
        while True:
            time.sleep(0.3)
            now = self.scrape()
            if (now == before and until(now)) or time.monotonic() > deadline:
                return now
            before = now


def post(port, case, id_=1, body=None):
    return wire.request(port, case.path, "POST", {"Content-Type": "application/json"}, body or case.body(id_),
                        accept_encoding="gzip")


def traffic(host):
    """One sequence of requests, the same for every host; the counters it leaves, the streamed
    answer's bytes out of rpcedge_body_bytes_out."""
    compressed, small, streamed = BUCKETS["16-256 KiB"], BUCKETS["under 1 KiB"], BUCKETS["1-4 MiB"]
    for path, encoding in ((compressed, "gzip"), (compressed, None), (small, "gzip")):
        assert wire.request(host.port, f"/corpus/{path}", accept_encoding=encoding).complete
    stream = wire.request(host.port, f"/corpus/{streamed}")
    assert stream.complete and stream.header("content-encoding") == "gzip"
    beacon = wire.request(host.port, "/eth/v2/beacon/blocks/deneb:case_0", headers={"Accept": SSZ})
    assert beacon.header("content-type") == SSZ
    # a miss, stored, then the daemon's hit, kept in the hot tier, then the hot tier's
    block = cc.find(cc.block_by_hash)
    assert post(host.port, block).header("x-rpcedge-cache") == "MISS"
    host.settled(lambda counters: counters["rpcedge_cache_stores_taken"] == 1)
    for id_ in (2, 3):
        assert post(host.port, block, id_=id_).header("x-rpcedge-cache") == "HIT"
    # a GET where the cache is on bypasses it as not a POST
    assert wire.request(host.port, block.path).header("x-rpcedge-cache") == "BYPASS"
    # a bypass, with its reason, and an answer the core refuses to store
    batch = cc.batch_case()
    assert post(host.port, batch, body=json.dumps(batch.request).encode()).header("x-rpcedge-cache") == "BYPASS"
    assert post(host.port, cc.find(cc.null_result)).header("x-rpcedge-cache") == "MISS"
    counters = host.settled(lambda counters: counters["rpcedge_cache_stores_refused_null"] == 1)
    counters[STREAMED_OUT] -= len(stream.body)
    return counters


def test_the_same_traffic_counts_the_same_on_every_host(stack, tmp_path):
    counted = {}
    for name in ["nginx", *ENVOY_HOSTS]:
        stack.fresh_daemon()
        host = Host(name, stack, tmp_path / name)
        try:
            counted[name] = traffic(host)
        finally:
            host.stop()
    nginx = counted["nginx"]
    for name in ENVOY_HOSTS:
        assert sorted(counted[name]) == sorted(nginx), name
        differ = {c: (nginx[c], counted[name][c]) for c in nginx if c not in TIMED and nginx[c] != counted[name][c]}
        assert not differ, f"nginx and {name} counted otherwise (nginx, {name}): {differ}"
    # what the traffic was meant to count, so that the comparison compares something: the answers
    # to the two GETs for the corpus's 56 KiB (gzip, identity), its 102 B, its 1.5 MiB and the
    # Beacon block (SSZ, not compressed), and to the block by hash (a miss), its two hits (the
    # daemon's, then the hot tier's), a GET on the block's path (neither a JSON-RPC call nor a
    # Beacon-API read: the node is asked as the client asked, and its gzip goes out untouched),
    # a batch and a null (a miss); the Beacon block's GET names it by no root or
    # slot (malformed), and every other GET goes to the node past the cache, whose namespaces
    # name only the JSON-RPC paths and the Beacon-API's
    expected = {
        "rpcedge_responses_oneshot": 2, "rpcedge_responses_untouched": 3, "rpcedge_responses_small": 3,
        "rpcedge_responses_stream": 1, "rpcedge_transcode_done": 1,
        "rpcedge_cache_responses_miss": 2, "rpcedge_cache_responses_hit": 2, "rpcedge_cache_hot_hits": 1, "rpcedge_cache_responses_bypass": 7,
        "rpcedge_cache_bypass_namespace": 4, "rpcedge_cache_bypass_batch": 1,
        "rpcedge_cache_bypass_route": 1, "rpcedge_cache_bypass_malformed": 1,
        "rpcedge_cache_stores_taken": 1, "rpcedge_cache_stores_refused": 1, "rpcedge_cache_stores_refused_null": 1,
    }
    bytes_counted = {"rpcedge_body_bytes_in", "rpcedge_body_bytes_out", *TIMED}
    seen = {name: nginx[name] for name in nginx if nginx[name] and name not in bytes_counted}
    assert seen == expected
    assert all(counted[name]["rpcedge_compress_time_us"] > 0 for name in counted)
