"""The Docker reference stack (docker/), built from this build and brought up as an operator
would, then used from the host through its published ports: gzip with an exact length through
each proxy, small answers untouched, cache hits, Prometheus' scrapes, and a bounded load run with
no errors; then torn down (containers, networks, volumes; the images stay for the next run).

It starts a Docker engine and makes the base image itself where needed (docker/engine.sh); it skips
only where no engine can be started at all."""

import gzip
import hashlib
import json
import sys
import time
import urllib.parse
import urllib.request

import pytest

from testbed import cache_cases as cc
from testbed import replay_corpus as rc
from testbed import wire
from testbed.docker_engine import checked, run, stack_up
from testbed.harness import REPO, SAMPLE_CORPUS

# Runs on one pytest-xdist worker with the other tests of the host's fixed ports and Docker engine
# (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("host")

COMPOSE = ["docker-compose", "-f", str(REPO / "docker" / "compose.yaml"), "-p", "rpcedge-test"]
NGINX, ENVOY, ENVOY_ADMIN, PROMETHEUS = 18080, 18081, 19901, 19090
PROXIES = {"nginx": NGINX, "envoy": ENVOY}
UP_WITHIN = 60  # seconds from `up` to every service healthy, once the images exist
BLOCK = "eth_getBlockByNumber/erigon-rpc-tests__mainnet__test_04.json"  # 126 KiB: compressed
SMALL = "eth_blockNumber/execution-apis__hive-testchain__simple-test.io"  # 40 B: untouched


@pytest.fixture(scope="module")
def stack():
    yield from stack_up(COMPOSE, "rpcedge-test", (NGINX, ENVOY, ENVOY_ADMIN, PROMETHEUS), wait_healthy, UP_WITHIN)


def wait_healthy(deadline):
    while True:
        ids = checked(COMPOSE + ["ps", "-q"]).stdout.split()
        states = checked(["docker", "inspect", "--format", "{{.Name}} {{.State.Health.Status}}", *ids]).stdout.splitlines()
        if len(ids) == 5 and all(line.endswith(" healthy") for line in states):
            return
        assert time.monotonic() < deadline, f"not healthy: {states}"
        time.sleep(0.5)


def post(port, path):
    """The recorded request of `path` (a recording of the sample) to its network's route."""
    request, _ = recorded(path)
    return wire.request(port, f"/{rc.network_of(path)}", method="POST", body=rc.compact(request),
                        headers={"Content-Type": "application/json"}, accept_encoding="gzip")


def recorded(path):
    """The first (request, response) of a recording of the sample."""
    return rc.read_pairs(SAMPLE_CORPUS / "rpc" / path)[0]


def image_file_digest(image, path):
    out = checked(["docker", "run", "--rm", "--entrypoint", "sha256sum", image, path]).stdout
    return out.split()[0]


def test_the_images_carry_this_build(stack):
    """No stale module: what runs in the stack is what `make build` made here."""
    for image, inside, built in [
        ("rpcedge/nginx", "/usr/lib/nginx/modules/ngx_http_rpcedge_filter_module.so",
         REPO / "build/nginx/objs/ngx_http_rpcedge_filter_module.so"),
        ("rpcedge/envoy", "/usr/lib/rpcedge/rpcedge_envoy_filter.wasm",
         REPO / "target/wasm32-wasip1/release/rpcedge_envoy_filter.wasm"),
        ("rpcedge/envoy", "/usr/lib/rpcedge/librpcedge_envoy_native.so", REPO / "target/release/librpcedge_envoy_native.so"),
    ]:
        assert image_file_digest(image, inside) == hashlib.sha256(built.read_bytes()).hexdigest(), image


def test_envoy_runs_the_native_module_and_the_wasm_filter_is_one_setting_away(stack):
    with urllib.request.urlopen(f"http://127.0.0.1:{ENVOY_ADMIN}/stats?filter=rpcedge", timeout=10) as answer:
        stats = answer.read().decode()
    assert "dynamicmodulescustom.rpcedge." in stats and "wasmcustom.rpcedge." not in stats, stats[:2000]
    for adapter, config in [("wasm", "envoy-wasm.yaml"), ("native", "envoy-native.yaml")]:
        valid = checked(["docker", "run", "--rm", "--network", "none", "-e", f"RPCEDGE_ENVOY={adapter}", "rpcedge/envoy",
                         "--mode", "validate"], timeout=120)
        assert f"configuration '/etc/rpcedge/envoy/{config}' OK" in valid.stdout + valid.stderr
    bad = run(["docker", "run", "--rm", "--network", "none", "-e", "RPCEDGE_ENVOY=lua", "rpcedge/envoy"], timeout=60)
    assert bad.returncode == 2 and "RPCEDGE_ENVOY must be native or wasm" in bad.stderr


@pytest.mark.parametrize("proxy", PROXIES)
def test_a_large_answer_is_gzip_with_its_exact_length(stack, proxy):
    _, response = recorded(BLOCK)
    r = post(PROXIES[proxy], BLOCK)
    assert r.status == 200 and r.header("content-encoding") == "gzip"
    assert int(r.header("content-length")) == len(r.body)
    assert json.loads(gzip.decompress(r.body)) == response


@pytest.mark.parametrize("proxy", PROXIES)
def test_a_small_answer_goes_out_untouched(stack, proxy):
    _, response = recorded(SMALL)
    r = post(PROXIES[proxy], SMALL)
    assert r.status == 200 and r.header("content-encoding") is None
    assert r.body == rc.compact(response)


def cacheable_call(proxy):
    """A final block's call with a result to keep, of the sample, one per proxy (the block of the
    other tests is cached by then)."""
    cases = [case for case in cc.find_all(cc.immutable, corpus=SAMPLE_CORPUS / "rpc")
             if case.request["params"] != recorded(BLOCK)[0]["params"]]
    return cases[list(PROXIES).index(proxy)]


@pytest.mark.parametrize("proxy", PROXIES)
def test_a_cacheable_answer_is_a_hit_the_second_time(stack, proxy):
    case = cacheable_call(proxy)

    def ask():
        return wire.request(PROXIES[proxy], case.path, method="POST", body=case.body(7),
                            headers={"Content-Type": "application/json"}, accept_encoding="gzip")

    first = ask()
    assert first.header("x-rpcedge-cache") == "MISS" and first.header("x-replay-recording")
    deadline = time.monotonic() + 10  # the store lands after the answer
    while (again := ask()).header("x-rpcedge-cache") != "HIT":
        assert time.monotonic() < deadline, again.header("x-rpcedge-cache")
        time.sleep(0.2)
    assert again.decoded() == case.answer(7)
    # the node's own headers come back with the hit, the recording's name among them
    assert again.header("x-replay-recording") == first.header("x-replay-recording")


def prometheus_query(query):
    url = f"http://127.0.0.1:{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def test_prometheus_scraped_the_rpcedge_counters(stack):
    # the requests above are counted; the next scrape (every 5 s) carries them
    wanted = {"rpcedge-envoy": 'rpcedge_responses_oneshot{job="rpcedge-envoy"} > 0',
              "rpcedge-nginx": '{job="rpcedge-nginx", __name__=~"rpcedge_.*"} > 0',
              "rpcedge-cached": 'rpcedge_cached_hits_total{job="rpcedge-cached"} > 0'}
    deadline = time.monotonic() + 30
    missing = dict(wanted)
    while missing:
        missing = {job: query for job, query in missing.items() if not prometheus_query(query)}
        assert time.monotonic() < deadline, f"not scraped: {missing}"
        time.sleep(1)


def test_the_load_container_runs_through_each_proxy_without_errors(stack):
    # An answer slower than 4 s is an error: below the lock timeout (5 s), so that a key left held
    # for it fails the run (nginx's run ends by cutting its clients, and Envoy's asks the same
    # keys of the same daemon); above wrk's 2 s, which an answer on two cores shared with the
    # other tests' load has missed.
    load = run(COMPOSE + ["run", "--rm", "-e", "RPCEDGE_LOAD_DURATION=3s", "-e", "RPCEDGE_LOAD_TIMEOUT=4s", "load"],
               timeout=120)
    print(load.stdout)
    assert load.returncode == 0, load.stdout + load.stderr
    results = [json.loads(line.removeprefix("RESULT ")) for line in load.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2
    for result in results:
        assert result["requests"] > 0 and not any(result["errors"].values())
        assert not any(count for name, count in result["checks"].items() if name.startswith("bad_") or name == "unknown")


def test_the_base_image_takes_its_mirrors_from_this_machines_apt(tmp_path):
    """engine.sh's debootstrap and the image's sources use the mirrors apt is configured with:
    one-line and deb822 sources, options, comments, deb-src and disabled stanzas as apt reads them."""
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://source.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian/ bookworm main\n")
    (tmp_path / "sources.list.d" / "security.sources").write_text(
        "Types: deb\nURIs: http://off.example/debian-security\nSuites: bookworm-security\nEnabled: no\n\n"
        "Types: deb deb-src\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n")
    (tmp_path / "sources.list.d" / "other.list.disabled").write_text("deb http://disabled.example bookworm main\n")
    out = checked([sys.executable, "docker/apt_sources.py", "bookworm", str(tmp_path)]).stdout
    assert out.splitlines() == ["MIRROR=http://mirror.example/debian",
                                "SECURITY_MIRROR=http://security.example/debian-security"]
    out = checked([sys.executable, "docker/apt_sources.py", "trixie", str(tmp_path)]).stdout
    assert out.splitlines() == ["MIRROR=''", "SECURITY_MIRROR=''"]
    # and no mirror of its own
    assert "debian.org" not in (REPO / "docker" / "engine.sh").read_text()
