"""`make deb`'s packages (packaging/build-deb) installed as an operator installs them: with apt, into
the Docker stack's Debian 12 base image (made by docker/engine.sh, as the Docker test does), apt
bringing Debian's nginx for the module's nginx-abi dependency. The module comes enabled,
`nginx -t` passes, nginx and the daemon (as its systemd unit runs it: its user, its directories,
its socket) start, and a gzip answer and a cache hit come back through nginx over the host's
network; `apt remove` of the module leaves nginx working, its link kept aside as Debian's own
module packages do.

The container shares the host's network (for apt's mirror and the test's requests), on ports
free here; it skips only where no Docker engine can be started."""

import gzip
import json
import shutil
import time

import pytest

from testbed import cache_cases as cc
from testbed import replay_corpus as rc
from testbed import wire
from testbed.docker_engine import checked, run, start_engine
from testbed.harness import REPLAY_BIN, REPO, SAMPLE_CORPUS, free_port, port_accepts

# Runs on one pytest-xdist worker with the other tests of the host's fixed ports and Docker engine
# (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("host")

BASE = "debian:bookworm-slim"
NAME = "rpcedge-deb-test"
MODULE_PACKAGE = "libnginx-mod-http-rpcedge-filter"
BLOCK = "eth_getBlockByNumber/erigon-rpc-tests__mainnet__test_04.json"  # 126 KiB: compressed

SITE = """upstream ethereum_node {{ server 127.0.0.1:{node}; keepalive 16; }}
upstream rpcedge_cached {{ server unix:/run/rpcedge-cached/cached.sock; keepalive 16; }}
server {{
    listen 127.0.0.1:{port};
    rpcedge on;
    rpcedge_cache on;
    include /test/rpcedge-cache.conf;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
{locations}
}}
"""
PLAIN_SITE = """server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://127.0.0.1:{node}; }}
}}
"""

# the daemon as its systemd unit runs it (no systemd in the container): the unit's own
# ExecStart, user, state and runtime directories, and options file
START_DAEMON = """set -eu
. /etc/default/rpcedge-cached
export RPCEDGE_CACHED_OPTS
install -d -o rpcedge-cached -g rpcedge-cached -m 0750 /var/lib/rpcedge-cached /run/rpcedge-cached
command=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/rpcedge-cached.service)
setsid runuser -u rpcedge-cached -- sh -c "exec $command" >/tmp/cached.log 2>&1 </dev/null &
for _ in $(seq 100); do [ -S /run/rpcedge-cached/cached.sock ] && exit 0; sleep 0.1; done
cat /tmp/cached.log; exit 1
"""


def inside(script, timeout=600):
    return checked(["docker", "exec", NAME, "bash", "-c", script], timeout)


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    start_engine(BASE)
    debs = checked(["packaging/build-deb"], timeout=600).stdout.split()
    assert sorted(deb.rsplit("/", 1)[1].split("_")[0] for deb in debs) == [MODULE_PACKAGE, "rpcedge-cached"]
    test = tmp_path_factory.mktemp("deb")
    shutil.copyfile(REPO / "configs/nginx/rpcedge-cache.conf", test / "rpcedge-cache.conf")
    shutil.copyfile(REPLAY_BIN, test / "rpcedge-replay")
    (test / "rpcedge-replay").chmod(0o755)
    shutil.copytree(SAMPLE_CORPUS, test / "corpus")
    (test / "start-daemon").write_text(START_DAEMON)
    run(["docker", "rm", "-f", NAME], timeout=600)
    checked(["docker", "run", "-d", "--rm", "--name", NAME, "--network", "host", "-v", f"{REPO / 'build/deb'}:/debs:ro",
             "-v", f"{test}:/test:ro", BASE, "sleep", "900"], timeout=600)
    try:
        yield test
    finally:
        run(["docker", "rm", "-f", NAME], timeout=600)


def post(port, path, body):
    return wire.request(port, path, method="POST", body=body, headers={"Content-Type": "application/json"},
                        accept_encoding="gzip")


def test_the_packages_install_serve_and_leave_nginx_working_when_removed(container):
    installed = inside("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                       "--no-install-recommends /debs/*.deb >/dev/null && dpkg-query -W -f='${Package} ${Status}\\n' "
                       f"nginx {MODULE_PACKAGE} rpcedge-cached && readlink /etc/nginx/modules-enabled/*rpcedge* "
                       "&& id -nG www-data && dpkg-query -W -f='${Depends}' " + MODULE_PACKAGE, timeout=900).stdout
    assert "nginx install ok installed" in installed, installed
    assert "/usr/share/nginx/modules-available/mod-http-rpcedge-filter.conf" in installed
    assert "rpcedge-cached" in installed.splitlines()[-2].split(), "www-data may use the daemon's socket"
    assert installed.splitlines()[-1].startswith("nginx-abi-"), installed

    port, node = free_port(), free_port()
    assert not port_accepts(port) and not port_accepts(node)
    block_request, block_answer = rc.read_pairs(SAMPLE_CORPUS / "rpc" / BLOCK)[0]
    case = next(case for case in cc.find_all(cc.immutable, corpus=SAMPLE_CORPUS / "rpc")
                if case.request["params"] != block_request["params"])
    networks = sorted({rc.network_of(BLOCK), case.network})
    locations = "".join(f"    location = /{network} {{ rpcedge_cache_namespace {network}; "
                        f"proxy_pass http://ethereum_node/{network}; }}\n" for network in networks)
    site = SITE.format(node=node, port=port, locations=locations)
    # (Debian's default site would take the host's port 80)
    inside(f"rm -f /etc/nginx/sites-enabled/default && cat > /etc/nginx/conf.d/rpcedge.conf <<'SITE'\n{site}SITE\n"
           "nginx -t 2>&1")
    inside("bash /test/start-daemon")
    inside(f"setsid /test/rpcedge-replay --listen 127.0.0.1:{node} --corpus /test/corpus/rpc "
           "--witnesses /test/corpus/witness/ethrex-replay --ssz-dir /test/corpus/ssz >/tmp/replay.log 2>&1 "
           "</dev/null & nginx")
    deadline = time.monotonic() + 60
    while not (port_accepts(port) and port_accepts(node)):
        assert time.monotonic() < deadline, inside("cat /tmp/replay.log /var/log/nginx/error.log").stdout
        time.sleep(0.2)

    r = post(port, f"/{rc.network_of(BLOCK)}", rc.compact(block_request))
    assert r.status == 200 and r.header("content-encoding") == "gzip"
    assert int(r.header("content-length")) == len(r.body)
    assert json.loads(gzip.decompress(r.body)) == block_answer
    first = post(port, case.path, case.body(7))
    assert first.header("x-rpcedge-cache") == "MISS", first.headers
    deadline = time.monotonic() + 10  # the store lands after the answer
    while (again := post(port, case.path, case.body(7))).header("x-rpcedge-cache") != "HIT":
        assert time.monotonic() < deadline, (again.header("x-rpcedge-cache"), inside("cat /tmp/cached.log").stdout)
        time.sleep(0.2)
    assert again.decoded() == case.answer(7)
    owner = inside("stat -c '%U:%G %a' /run/rpcedge-cached/cached.sock /var/lib/rpcedge-cached").stdout.split("\n")
    assert owner[:2] == ["rpcedge-cached:rpcedge-cached 660", "rpcedge-cached:rpcedge-cached 750"], owner

    # removed: the module's link set aside, the site that used it taken out, nginx goes on
    removed = inside(f"DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq {MODULE_PACKAGE} >/dev/null && "
                     "ls /etc/nginx/modules-enabled/ && rm /etc/nginx/conf.d/rpcedge.conf && "
                     f"cat > /etc/nginx/conf.d/plain.conf <<'SITE'\n{PLAIN_SITE.format(port=port, node=node)}SITE\n"
                     "nginx -t 2>&1 && nginx -s reload && sleep 1 && dpkg-query -W -f='${Status}' nginx").stdout
    assert "50-mod-http-rpcedge-filter.conf.removed" in removed and "install ok installed" in removed, removed
    assert "50-mod-http-rpcedge-filter.conf\n" not in removed
    deadline = time.monotonic() + 10
    while (plain := post(port, f"/{rc.network_of(BLOCK)}", rc.compact(block_request))).header("content-encoding"):
        assert time.monotonic() < deadline, "nginx still compresses with the module removed"
        time.sleep(0.2)
    assert plain.status == 200 and json.loads(plain.body) == block_answer
