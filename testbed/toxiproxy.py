"""Toxiproxy (Shopify's, v2.5.0, built by `make` into build/bin) between the parts of a stack: a TCP
proxy per link whose toxics (latency, bandwidth, slicer, limit_data, reset_peer, timeout,
slow_close) are added and removed over its HTTP API while traffic flows.

    with Toxiproxy(log_dir) as toxiproxy:
        node = toxiproxy.link("node", replay.port)       # the port a proxy dials instead
        toxiproxy.add("node", "reset_peer", timeout=0)
        ...
        toxiproxy.reset()

A toxic on the "downstream" stream acts on what the far side (the node, the daemon) sends back,
"upstream" on what is sent to it.
"""

import json
import urllib.error
import urllib.request

from testbed.harness import LOOPBACK, REPO, Process, StartError, free_port

SERVER = REPO / "build" / "bin" / "toxiproxy-server"


class Toxiproxy:
    def __init__(self, log_dir):
        if not SERVER.exists():
            raise StartError(f"{SERVER} is missing: run `make build/bin/toxiproxy-server`")
        self.log_dir, self.port = log_dir, free_port()
        self.links = {}  # name: (listen port, upstream port)
        self.starts = 0
        self._start()

    def _start(self):
        self.starts += 1
        self.process = Process("toxiproxy", [SERVER, "-host", LOOPBACK, "-port", self.port],
                               self.log_dir / f"toxiproxy-{self.starts}.log")
        self.process.wait_for_port(self.port)
        for name, (port, upstream_port) in self.links.items():
            self._create(name, port, upstream_port)

    def _create(self, name, port, upstream_port):
        self._call("POST", "/proxies", {"name": name, "listen": f"{LOOPBACK}:{port}",
                                        "upstream": f"{LOOPBACK}:{upstream_port}", "enabled": True})

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{LOOPBACK}:{self.port}{path}", data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"toxiproxy {method} {path}: {error.code} {error.read()[:300]!r}") from None
        return json.loads(text) if text else None

    def link(self, name, upstream_port):
        """A proxy named `name` in front of loopback `upstream_port`: the port to dial instead."""
        port = free_port()
        self._create(name, port, upstream_port)
        self.links[name] = (port, upstream_port)
        return port

    def add(self, link, kind, stream="downstream", toxicity=1.0, **attributes):
        """Adds a toxic of type `kind` to `link`."""
        self._call("POST", f"/proxies/{link}/toxics", {"name": f"{kind}_{stream}", "type": kind, "stream": stream,
                                                        "toxicity": toxicity, "attributes": attributes})

    def redirect(self, link, upstream_port):
        """`link` leads to loopback `upstream_port` until the next reset."""
        self._call("POST", f"/proxies/{link}", {"upstream": f"{LOOPBACK}:{upstream_port}"})

    def set_enabled(self, link, enabled):
        """A disabled link refuses connections and cuts the open ones: the far side is down."""
        self._call("POST", f"/proxies/{link}", {"enabled": enabled})

    def reset(self):
        """Every link enabled and without toxics, by a fresh server on the same ports: v2.5.0's
        API can hang for good removing a toxic from a link whose connections the far side closed
        under it (Shopify/toxiproxy#412, #558), which the proxies' timeouts do. The connections
        open through the links are cut, as at the end of a network fault."""
        self.process.proc.kill()
        self.process.stop()
        self._start()

    def stop(self):
        self.process.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
