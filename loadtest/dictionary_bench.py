"""`make bench`, the dcz dictionary's part: the load test's method mix (its thousand requests) sent
one by one through nginx with rpcedge making dcz and serving the dictionary, as four clients:
none (identity), gzip only, a browser without the dictionary (Chromium's Accept-Encoding) and a
browser that has it (dcz and Available-Dictionary). Bytes of body per answer, for the answers
under 1 KiB and for the whole mix, each answer decoded and checked against the node's. Bytes
only: the mix's CPU per request, browser against gzip-only, is bench.py's.

    .venv/bin/python loadtest/dictionary_bench.py
"""

import random
from pathlib import Path

from testbed import provenance, scenarios, wire
from testbed.harness import CORPUS, LOOPBACK, REPO, free_port, start_replay
from testbed.nginx_harness import start_nginx

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "dictionary"
RESULTS = LOADTEST / "results" / "dictionary.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "nginx-module", "envoy-filter", "configs", "Cargo.lock", "testbed/scenarios.py"]
SMALL = 1024
BROWSER = "gzip, deflate, br, zstd"
CLIENTS = {
    "identity": (None, {}),
    "gzip": ("gzip", {}),
    "browser": (BROWSER, {}),
    "browser with the dictionary": (BROWSER + ", dcb, dcz", {"Available-Dictionary": wire.available_dictionary()}),
}
NGINX = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_encodings dcz zstd gzip br deflate;
        location = /rpcedge/dictionary {{ rpcedge_dictionary "/*"; }}
        location / {{ proxy_pass http://{LOOPBACK}:{replay_port}; }}
    }}
"""


def main():
    started = provenance.now()
    WORK.mkdir(parents=True, exist_ok=True)
    replay = start_replay(WORK)
    port = free_port()
    server = start_nginx(WORK / "nginx", NGINX.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port), [port])
    try:
        requests = scenarios.mix_requests(replay, CORPUS, scenarios.real_pairs(CORPUS), random.Random(scenarios.SEED))
        sent = {name: [0, 0] for name in CLIENTS}  # bytes of answers under SMALL, of all
        small = sum(1 for request in requests if request.answer_bytes < SMALL)
        for request in requests:
            node = None
            for name, (accept_encoding, headers) in CLIENTS.items():
                r = wire.request(port, f"/{request.network}", method="POST", body=request.body.encode(),
                                 headers={"Content-Type": "application/json", **headers}, accept_encoding=accept_encoding)
                assert r.status == 200, (request.recording, r.status)
                node = node or r.decoded()
                assert r.decoded() == node, f"{name}: {request.recording} decodes to another answer"
                sent[name][0] += len(r.body) if request.answer_bytes < SMALL else 0
                sent[name][1] += len(r.body)
    finally:
        server.stop()
        replay.process.stop()
    identity = sent["identity"]
    rows = [{"client": name, "small_bytes_per_answer": s / small, "small_of_identity": s / identity[0],
             "bytes_per_answer": a / len(requests), "of_identity": a / identity[1]} for name, (s, a) in sent.items()]
    provenance.write(RESULTS, {"answers": len(requests), "small_answers": small, "rows": rows}, started)
    print(f"the mix, {len(requests)} answers ({small} under {SMALL} B), through nginx + rpcedge:\n")
    print("| client | B per answer under 1 KiB | of identity | B per answer, whole mix | of identity |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['client']} | {row['small_bytes_per_answer']:.0f} | {row['small_of_identity']:.3f} "
              f"| {row['bytes_per_answer']:.0f} | {row['of_identity']:.3f} |")


if __name__ == "__main__":
    main()
