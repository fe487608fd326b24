"""How long a one-shot compression holds up other requests on the same nginx worker.

One worker serves a ~1 MiB JSON file (compressed whole by rpcedge at level 6, or by stock gzip at
level 6) to 4 looping clients, while wrk measures the latency of a tiny uncompressed file on the
same worker. With `aio threads`, rpcedge compresses such bodies in nginx's thread pool instead
(the default pool, which `aio threads` creates). Run: .venv/bin/python loadtest/stall.py (needs
the module built: make -C nginx-module).
"""

import re
import subprocess
import tempfile
from pathlib import Path

from testbed.harness import CORPUS, LOOPBACK, free_port
from testbed.nginx_harness import start_nginx

BIG = "erigon_getBlockByTimestamp/erigon-rpc-tests__mainnet__test_06.json"  # 967 KiB compact
SECONDS = 10

COMPRESSION = {
    "none": "rpcedge off; gzip off;",
    "rpcedge level 6": "rpcedge on; rpcedge_level 6;",
    "rpcedge level 6 + aio threads": "rpcedge on; rpcedge_level 6; aio threads;",
    "stock gzip level 6": "rpcedge off; gzip on; gzip_comp_level 6; gzip_types application/json;",
}


def wrk(url, connections, headers=(), latency=False):
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{SECONDS}s", *(a for h in headers for a in ("-H", h))]
    out = subprocess.run([*argv, *(["--latency"] if latency else []), url],
                         capture_output=True, text=True, timeout=SECONDS + 30).stdout
    return out


def percentile(out, p):
    value, unit = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000}[unit]


def main():
    import json

    body = json.dumps(json.loads((CORPUS / BIG).read_text())[0]["response"], separators=(",", ":"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "www"
        root.mkdir()
        (root / "big.json").write_text(body)
        (root / "tiny.json").write_text('{"jsonrpc":"2.0","id":1,"result":"0x1"}')
        ports = {name: free_port() for name in COMPRESSION}
        servers = "".join(f"""
    server {{
        listen {LOOPBACK}:{ports[name]};
        root {root};
        types {{ application/json json; }}
        {directives}
    }}""" for name, directives in COMPRESSION.items())
        nginx = start_nginx(Path(tmp) / "nginx", servers, list(ports.values()))
        try:
            print(f"big body {len(body)} bytes; tiny-request latency on the same worker, {SECONDS} s each")
            print(f"{'big body compressed by':<29} {'big req/s':>9} {'tiny p50 ms':>11} {'tiny p99 ms':>11}")
            for name, port in ports.items():
                base = f"http://{LOOPBACK}:{port}"
                load = subprocess.Popen(["wrk", "-t1", "-c4", f"-d{SECONDS}s", "-H", "Accept-Encoding: gzip",
                                         f"{base}/big.json"], stdout=subprocess.PIPE, text=True)
                tiny = wrk(f"{base}/tiny.json", 2, latency=True)
                big = load.communicate(timeout=SECONDS + 30)[0]
                rate = float(re.search(r"Requests/sec:\s+([\d.]+)", big).group(1))
                print(f"{name:<29} {rate:>9.0f} {percentile(tiny, 50):>11.2f} {percentile(tiny, 99):>11.2f}")
        finally:
            nginx.stop()


if __name__ == "__main__":
    main()
