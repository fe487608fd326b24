"""`make bench`, transcoding's part: what an SSZ client gets beside a JSON client for the same
execution witnesses and Beacon-API blocks, through each proxy.

    .venv/bin/python loadtest/transcode_bench.py [--seconds 5] [--runs 3]

1. Wire bytes: each witness of the replay (hoodi blocks 0x134ff8 and 0x138c2d) and each Beacon-API
   block below as JSON and as SSZ, each identity and gzip (nginx; SSZ gzipped where
   application/octet-stream is listed in rpcedge_types, which it is not by default).
2. wrk (1 thread, 8 connections, Accept-Encoding: gzip) through nginx and through Envoy, a JSON
   client (no Accept) beside an SSZ client (Accept: application/octet-stream) making the same
   request (the larger witness's call; a GET of the deneb block); req/s and latency, the median of
   `--runs` runs. The proxy runs on a CPU of its own
   (taskset); wrk and the replay node share the others.
"""

import argparse
import itertools
import json
import statistics
from pathlib import Path

from bench import split_cpus
from testbed import provenance, wire
from testbed.envoy_harness import run_envoy
from testbed.harness import LOOPBACK, REPO, corpus_description, free_port, start_replay
from testbed.nginx_harness import start_nginx
from testbed.wrk import run_wrk

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "transcode"
RESULTS = LOADTEST / "results" / "transcode.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/wrk.py", "loadtest/wrk"]
SCRIPT = LOADTEST / "wrk" / "transcode.lua"
BLOCKS = ["0x134ff8", "0x138c2d"]
# the replay's Beacon-API blocks: the largest deneb ssz_static case, and the real blinded block
BEACON_BLOCKS = ["/eth/v2/beacon/blocks/deneb:case_2", "/eth/v1/beacon/blinded_blocks/348241"]
SSZ = "application/octet-stream"
CONNECTIONS = 8
ENVOY_PLUGIN_CONFIG = '{"transcode": true, "buffer_limit": 68157440}'

SERVER = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_transcode on;
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
            proxy_http_version 1.1;
        }}
        location /ssz-gzip/ {{
            rpcedge_types application/json application/octet-stream;
            proxy_pass http://{LOOPBACK}:{replay_port}/;
            proxy_http_version 1.1;
        }}
    }}
"""


def call(block):
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "debug_executionWitness", "params": [block]}).encode()


def post(port, path, body, accept, accept_encoding):
    headers = {"Content-Type": "application/json", **({"Accept": accept} if accept else {})}
    r = wire.request(port, path, method="POST", headers=headers, body=body, accept_encoding=accept_encoding)
    assert r.status == 200 and r.complete, r.status
    return r


def get(port, path, accept, accept_encoding):
    r = wire.request(port, path, headers={"Accept": accept} if accept else {}, accept_encoding=accept_encoding)
    assert r.status == 200 and r.complete, r.status
    return r


def wire_bytes(port):
    rows = []
    for path in BEACON_BLOCKS:
        rows.append({
            "object": path,
            "json": len(get(port, path, None, None).body),
            "json_gzip": len(get(port, path, None, "gzip").body),
            "ssz": len(get(port, path, SSZ, None).body),
            "ssz_gzip": len(get(port, "/ssz-gzip" + path, SSZ, "gzip").body),
        })
    for block in BLOCKS:
        body = call(block)
        sizes = {
            "json": len(post(port, "/hoodi", body, None, None).body),
            "json_gzip": len(post(port, "/hoodi", body, None, "gzip").body),
            "ssz": len(post(port, "/hoodi", body, SSZ, None).body),
            "ssz_gzip": len(post(port, "/ssz-gzip/hoodi", body, SSZ, "gzip").body),
        }
        rows.append({"object": f"witness {block}", **sizes})
    return rows


def wrk(port, path, body_file, accept, expected_length, seconds):
    result, _ = run_wrk(["-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", SCRIPT, f"http://{LOOPBACK}:{port}{path}",
                         "--", body_file or "-", accept or "-", "gzip", str(expected_length or "-")], seconds)
    if result["broken"]:
        raise RuntimeError(f"{result['broken']} broken answers: {result}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    started = provenance.now()
    WORK.mkdir(parents=True, exist_ok=True)
    proxy_cpu, _ = split_cpus()
    pin = ("taskset", "-c", str(proxy_cpu)) if proxy_cpu is not None else ()
    print(f"replay upstream over {corpus_description()}", flush=True)
    replay = start_replay(WORK)
    stopping = [replay.process]
    try:
        port = free_port()
        nginx = start_nginx(WORK / "nginx", SERVER.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port),
                            [port], argv_prefix=pin)
        stopping.append(nginx)
        envoy = run_envoy(WORK, replay.port, ENVOY_PLUGIN_CONFIG, concurrency=1, argv_prefix=pin)
        stopping.append(envoy.process)
        results = {"wire_bytes": wire_bytes(nginx.port), "wrk": []}
        block = BLOCKS[-1]
        body_file = WORK / f"witness-{block}.json"
        body_file.write_bytes(call(block))
        requests = [(f"witness {block}", "/hoodi", body_file), ("block deneb:case_2", BEACON_BLOCKS[0], None)]
        for proxy, proxy_port in [("nginx", nginx.port), ("envoy", envoy.port)]:
            for (what, path, body), (client, accept) in itertools.product(requests, [("json", None), ("ssz", SSZ)]):
                r = post(proxy_port, path, call(block), accept, "gzip") if body else get(proxy_port, path, accept, "gzip")
                length = len(r.body)
                exact = length if r.header("content-length") else None
                wrk(proxy_port, path, body, accept, exact, 2)  # warm-up
                runs = [wrk(proxy_port, path, body, accept, exact, args.seconds) for _ in range(args.runs)]
                rps = [r["answered"] / r["seconds"] for r in runs]
                results["wrk"].append({
                    "request": what, "proxy": proxy, "client": client, "body_bytes": length,
                    "req_s": statistics.median(rps),
                    "p50_ms": statistics.median(r["p50_us"] for r in runs) / 1000,
                    "p99_ms": statistics.median(r["p99_us"] for r in runs) / 1000,
                })
        provenance.write(RESULTS, results, started)
        print("| object | JSON | JSON gzip | SSZ | SSZ gzip | SSZ/JSON | SSZ gzip/JSON gzip |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in results["wire_bytes"]:
            print(f"| {r['object']} | {r['json']:,} | {r['json_gzip']:,} | {r['ssz']:,} | {r['ssz_gzip']:,} "
                  f"| {r['ssz'] / r['json']:.3f} | {r['ssz_gzip'] / r['json_gzip']:.3f} |")
        print(f"\nwrk, Accept-Encoding: gzip, {CONNECTIONS} connections, median of {args.runs} x {args.seconds} s")
        print("| request | proxy | client | body bytes | req/s | p50 ms | p99 ms |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
        for r in results["wrk"]:
            print(f"| {r['request']} | {r['proxy']} | {r['client']} | {r['body_bytes']:,} | {r['req_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
    finally:
        for process in reversed(stopping):
            process.stop()


if __name__ == "__main__":
    main()
