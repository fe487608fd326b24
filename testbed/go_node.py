"""A stand-in JSON-RPC node that reads a request as geth, erigon, op-geth and bor do: Go's
encoding/json matches a member name to a struct field case-insensitively (with Unicode simple
folding: "ſ" is an "s", the Kelvin sign a "k") and the last matching member wins. It answers
eth_getBlockByHash with a block that names the hash it read, its own name in `miner`, and the
response headers it was told to add (`headers`, with "{origin}" replaced by the request's Origin,
as geth's CORS handler echoes it). A liar (`lie_hash`) answers that hash instead, whatever was
asked. For the cache's security tests: a key that covers another call than this node reads would
store a wrong answer for everyone."""

import json
from http.server import BaseHTTPRequestHandler

from testbed.harness import StandIn

FIELDS = ("jsonrpc", "id", "method", "params")


def fold(name):
    """The name as Go's encoding/json compares it: the smallest rune of each rune's fold set."""
    return "".join(ch.lower().upper() for ch in name)


def go_decode(body):
    """The request's fields as Go reads them into `jsonrpcMessage`."""
    members = json.loads(body, object_pairs_hook=lambda pairs: pairs)
    read = {}
    for name, value in members:
        for field in FIELDS:
            if fold(name) == fold(field):
                read[field] = value  # the last one wins
    return read


class GoNode(StandIn):
    def __init__(self, name, lie_hash=None, headers=()):
        self.name, self.lie_hash, self.headers = name, lie_hash, list(headers)
        self.requests = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                node.requests.append((self.path, dict(self.headers), body))
                call = go_decode(body)
                params = call.get("params") or []
                block_hash = node.lie_hash or (params[0] if params else None)
                if call.get("method") == "eth_getBlockByHash":
                    result = {"hash": block_hash, "number": "0x10", "miner": node.name,
                              "transactions": ["0x" + "ab" * 32]}
                else:
                    result = None
                answer = json.dumps({"jsonrpc": "2.0", "id": call.get("id"), "result": result}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                origin = self.headers.get("Origin", "")
                for name, value in node.headers:
                    if "{origin}" in value and not origin:
                        continue
                    self.send_header(name, value.replace("{origin}", origin))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        super().__init__(Handler)
