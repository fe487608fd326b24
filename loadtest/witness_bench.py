"""`make bench`, the witnesses provers fetch: made-up execution witnesses of 100, 300 and 500 MB of
content (the replay's /generated/witness, at the proportions of the corpus's real ones; their JSON
is about twice that), fetched through nginx and the native Envoy module as JSON (identity), JSON
gzip (rpcedge's streaming gzip, the default level) and SSZ, the last also from a node that sends
the JSON chunked, without a Content-Length (as geth and erigon do).

    .venv/bin/python loadtest/witness_bench.py [--sizes 100,300,500] [--runs 1]

Per fetch: time to the last byte and bytes on the wire (curl), and the proxy's peak RSS above its
idle RSS (VmHWM after clear_refs). On loopback, then through a 1 Gbit/s link between the proxy and
its client: the whole run moves into a network namespace of its own (127.0.0.1 there too), where
traffic from the proxies' ports is shaped by `tc netem rate 1gbit`, or by an htb class of the same
rate where the kernel lacks sch_netem (said in the report); without root or tc, loopback only.
Then ten concurrent SSZ clients of the 300 MB witness under a 1 GiB transcode budget (each answer
checked against the SSZ or the JSON by its sha256), and a client that goes away halfway through
its witness (the proxy's RSS a moment later).
The proxy runs on a CPU of its own (taskset); the replay node and the clients share the others.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import pinned
from testbed import provenance
from testbed.envoy_harness import run_envoy
from testbed.harness import LOOPBACK, REPO, free_port, start_replay
from testbed.nginx_harness import start_nginx

LOADTEST = Path(__file__).resolve().parent
WORK = REPO / "build" / "bench" / "witness"
RESULTS = LOADTEST / "results" / "witness.json"
# What its figures measure: a change to these since its run makes them stale (tools/stale_figures.py).
MEASURES = ["shared-core", "nginx-module", "envoy-filter", "configs", "Cargo.lock"]
CALL = b'{"jsonrpc":"2.0","id":1,"method":"debug_executionWitness","params":["0x1"]}'
SSZ = "application/octet-stream"
MB = 1_000_000
LINK = "1gbit"
NAMESPACE = f"rpcedge-bench-{os.getpid()}"
BUDGET = 1 << 30
# what each way of fetching sends: (Accept, Accept-Encoding, how the replay node sends the JSON)
CHUNKED = ("X-Replay-Mode: chunked", "X-Replay-Chunk-Size: 65536")
WAYS = {"json": ("application/json", "identity", ()), "json-gzip": ("application/json", "gzip", ()),
        "ssz": (SSZ, "identity", ()), "ssz-chunked": (SSZ, "identity", CHUNKED)}

SERVER = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        rpcedge_transcode on;
        rpcedge_transcode_budget {budget};
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
            proxy_http_version 1.1;
        }}
    }}
"""
ENVOY_PLUGIN_CONFIG = json.dumps({"transcode": True, "buffer_limit": 68157440, "transcode_budget": BUDGET})


def path(size_mb):
    return f"/generated/witness?bytes={size_mb * MB}"


def fetch(port, size_mb, way, headers=(), max_time=None):
    """One fetch with curl: (seconds to the last byte, bytes on the wire, status, content type,
    sha256 of the body as it came)."""
    accept, encoding, node = WAYS[way]
    argv = ["curl", "-s", "-o", "-", "-X", "POST", "--data-binary", "@-", "-w",
            "%{stderr}%{time_total} %{size_download} %{http_code} %{content_type}",
            "-H", "Content-Type: application/json", "-H", f"Accept: {accept}", "-H", f"Accept-Encoding: {encoding}"]
    argv += [arg for header in (*node, *headers) for arg in ("-H", header)]
    if max_time:
        argv += ["--max-time", str(max_time)]
    curl = subprocess.Popen([*argv, f"http://{LOOPBACK}:{port}{path(size_mb)}"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    curl.stdin.write(CALL)
    curl.stdin.close()
    digest = hashlib.sha256()
    while piece := curl.stdout.read(1 << 20):
        digest.update(piece)
    curl.wait()
    took, size, status, content_type = (curl.stderr.read().decode().split(" ", 3) + [""] * 4)[:4]
    return float(took), int(size), status, content_type.strip(), digest.hexdigest()


class Rss:
    """A process's resident memory: idle, and the peak since the last reset."""

    def __init__(self, pid):
        self.pid = pid
        self.started = self.now()

    def field(self, name):
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(name)

    def now(self):
        return self.field("VmRSS")

    def reset_peak(self):
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def peak(self):
        return self.field("VmHWM")


def start_proxies(replay, proxy_argv):
    """{host: (its stop, its port, its RSS)}."""
    for name in ("nginx", "envoy"):
        (WORK / name).mkdir()
    port = free_port()
    nginx = start_nginx(WORK / "nginx", SERVER.format(LOOPBACK=LOOPBACK, port=port, replay_port=replay.port,
                                                       budget=f"{BUDGET // (1 << 20)}m"),
                        [port], argv_prefix=proxy_argv)
    envoy = run_envoy(WORK / "envoy", replay.port, ENVOY_PLUGIN_CONFIG, adapter="native", concurrency=1,
                      argv_prefix=proxy_argv)
    return {"nginx": (nginx.stop, nginx.port, Rss(nginx.worker_pids()[0])),
            "envoy-native": (envoy.process.stop, envoy.port, Rss(envoy.process.proc.pid))}


def shape(ports):
    """Shapes what leaves `ports` on this namespace's loopback to the link's rate: netem, or htb
    where the kernel has no netem. The qdisc used."""
    tc = lambda *args: subprocess.run(["tc", *args], capture_output=True, text=True)  # noqa: E731
    tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20")
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", "100gbit")
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", LINK, "ceil", LINK,
       "burst", "256kb", "cburst", "256kb")
    netem = tc("qdisc", "add", "dev", "lo", "parent", "1:10", "handle", "10:", "netem", "rate", LINK)
    if netem.returncode == 0:
        # netem sets the pace; the class only lets it through
        tc("class", "change", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit")
    for port in ports:
        tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
           "match", "ip", "sport", str(port), "0xffff", "flowid", "1:10")
    return "netem" if netem.returncode == 0 else "htb (this kernel has no sch_netem)"


def measure(args, link):
    """Every size, host and way on this namespace's loopback, shaped or not."""
    proxy_cpu, proxy_argv = pinned(WORK)
    replay = start_replay(WORK)
    proxies = start_proxies(replay, proxy_argv)
    qdisc = shape([port for _, port, _ in proxies.values()]) if link != "loopback" else None
    rows = []
    try:
        for size in args.sizes:
            fetch(replay.port, size, "json")  # made once, then kept by the replay
            for host, (_, port, rss) in proxies.items():
                for way in WAYS:
                    runs = []
                    for _ in range(args.runs):
                        idle = rss.now()
                        rss.reset_peak()
                        took, wire_bytes, status, content_type, digest = fetch(port, size, way)
                        runs.append((took, wire_bytes, rss.peak() - idle, status, content_type, digest))
                    took, wire_bytes, rss_above, status, content_type, digest = sorted(runs)[len(runs) // 2]
                    rows.append({"link": link, "size_mb": size, "host": host, "way": way, "seconds": took,
                                 "wire_bytes": wire_bytes, "rss_above_idle": rss_above, "status": status,
                                 "content_type": content_type, "sha256": digest})
                    print(f"{link:9} {size:4} MB {host:13} {way:10} {took:7.2f} s {wire_bytes / MB:8.1f} MB "
                          f"rss +{rss_above / MB:7.1f} MB {status} {content_type}", flush=True)
        extra = concurrent_and_abandoned(args, replay, proxies) if link == "loopback" else {}
    finally:
        for stop, _, _ in proxies.values():
            stop()
        replay.process.stop()
    return {"link": link, "qdisc": qdisc, "proxy_cpu": proxy_cpu, "rows": rows, **extra}


def concurrent_and_abandoned(args, replay, proxies):
    """A client that goes away halfway through the 300 MB witness, the proxy's RSS a moment later
    (first, while the proxy's heap is as the fetches left it); then ten SSZ clients of it at once,
    each answer checked."""
    size = 300
    expected = {"ssz": {}, "json": fetch(replay.port, size, "json")[4]}
    out = {"concurrent": {}, "abandoned": {}}
    for host, (_, port, rss) in proxies.items():
        expected["ssz"][host] = fetch(port, size, "ssz")[4]
        # the node sends the JSON over ~6 s; the client leaves after 2
        idle = rss.now()
        rss.reset_peak()
        slow = ["X-Replay-Chunk-Size: 4000000", "X-Replay-Chunk-Delay-Ms: 40"]
        fetch(port, size, "ssz", headers=slow, max_time=2)
        time.sleep(1.5)
        out["abandoned"][host] = {"rss_peak_above_idle": rss.peak() - idle, "rss_after_above_idle": rss.now() - idle,
                                  "rss_after_above_start": rss.now() - rss.started}
        print(f"a client gone after 2 s through {host}: peak +{(rss.peak() - idle) / MB:.1f} MB, 1.5 s later "
              f"+{(rss.now() - idle) / MB:.1f} MB (+{(rss.now() - rss.started) / MB:.1f} MB over the proxy "
              f"at its start)", flush=True)
        idle = rss.now()
        rss.reset_peak()
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: fetch(port, size, "ssz"), range(10)))
        kinds = [("ssz" if digest == expected["ssz"][host] else "json" if digest == expected["json"] else "wrong")
                 for _, _, _, _, digest in answers]
        out["concurrent"][host] = {"clients": 10, "ssz": kinds.count("ssz"), "json": kinds.count("json"),
                                   "wrong": kinds.count("wrong"), "rss_above_idle": rss.peak() - idle,
                                   "budget": BUDGET, "seconds": max(a[0] for a in answers)}
        print(f"10 x {size} MB SSZ through {host}: {kinds.count('ssz')} SSZ, {kinds.count('json')} JSON as it "
              f"came, {kinds.count('wrong')} wrong; peak RSS +{(rss.peak() - idle) / MB:.1f} MB "
              f"(budget {BUDGET / MB:.0f} MB)", flush=True)
    return out


def shaped_run(args):
    """The measurements again inside a namespace of their own, whose loopback carries the link."""
    if os.geteuid() != 0 or not shutil.which("tc") or not shutil.which("ip"):
        return {"link": LINK, "skipped": "needs root, ip and tc: loopback figures only"}
    if subprocess.run(["ip", "netns", "add", NAMESPACE], capture_output=True).returncode != 0:
        return {"link": LINK, "skipped": "cannot make a network namespace: loopback figures only"}
    result = WORK.parent / "witness-shaped.json"
    try:
        subprocess.run(["ip", "netns", "exec", NAMESPACE, "ip", "link", "set", "lo", "up"], check=True)
        argv = [sys.executable, __file__, "--inside", str(result), "--sizes", ",".join(map(str, args.sizes)),
                "--runs", str(args.runs)]
        subprocess.run(["ip", "netns", "exec", NAMESPACE, *argv], check=True)
        return json.loads(result.read_text())
    finally:
        subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,300,500", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        Path(args.inside).write_text(json.dumps(measure(args, LINK)))
        return
    started = provenance.now()
    loopback = measure(args, "loopback")
    shaped = shaped_run(args)
    if "skipped" in shaped:
        print(f"{LINK} link: {shaped['skipped']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    provenance.write(RESULTS, {"loopback": loopback, "link": shaped}, started)
    report(loopback, shaped)


def report(loopback, shaped):
    def row(result, size, host, way):
        return next(r for r in result["rows"] if (r["size_mb"], r["host"], r["way"]) == (size, host, way))
    print("\n| link | witness | host | JSON | JSON gzip | SSZ | SSZ, node chunked | SSZ vs JSON | "
          "SSZ RSS / JSON size (chunked) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in [loopback] + ([shaped] if "rows" in shaped else []):
        for r in result["rows"]:
            if r["way"] != "ssz":
                continue
            json_row = row(result, r["size_mb"], r["host"], "json")
            gzip_row = row(result, r["size_mb"], r["host"], "json-gzip")
            chunked_row = row(result, r["size_mb"], r["host"], "ssz-chunked")
            cells = [f"{x['seconds']:.2f} s / {x['wire_bytes'] / MB:.0f} MB" for x in (json_row, gzip_row, r, chunked_row)]
            print(f"| {result['link']}{' (' + result['qdisc'] + ')' if result.get('qdisc') else ''} | "
                  f"{r['size_mb']} MB | {r['host']} | {' | '.join(cells)} | "
                  f"{json_row['seconds'] / r['seconds']:.2f}x faster | "
                  f"{r['rss_above_idle'] / json_row['wire_bytes']:.2f} "
                  f"({chunked_row['rss_above_idle'] / json_row['wire_bytes']:.2f}) |")


if __name__ == "__main__":
    main()
