"""rpcedge's counters as a status location prints them (nginx's `rpcedge_status`, the Lua
binding's `rpcedge.status()`): Prometheus' text format as Envoy prints a counter."""

import re

from testbed import wire


def parse(text):
    """Counters by name from Prometheus' text format as Envoy prints a counter: its TYPE line, then
    `name{} value`."""
    lines = text.splitlines()
    counters = {}
    for declared, sample in zip(lines[::2], lines[1::2]):
        name = re.fullmatch(r"# TYPE (rpcedge_[a-z0-9_]+) counter", declared).group(1)
        value = re.fullmatch(rf"{name}\{{\}} (\d+)", sample).group(1)
        assert name not in counters, name
        counters[name] = int(value)
    assert len(lines) == 2 * len(counters), "every line a counter's"
    return counters


def scrape(port, path="/rpcedge_status"):
    r = wire.request(port, path, accept_encoding=None)
    assert r.status == 200 and r.header("content-type") == "text/plain; version=0.0.4", r.status
    return parse(r.body.decode())
