"""A static upstream that says what it was asked, for the drop-in tests (tests/test_envoy_dropin.py):
they send the same requests through Envoy with and without rpcedge and compare what the client
got and what reached the node.

Every answer carries the request headers a proxy may change on the way (`ASKED`) back as
`x-asked-<name>` response headers (absent where the request had none), and the request body's
length and SHA-256 as `x-asked-body-length` and `x-asked-body-sha256`, its chunked framing
undone. The path chooses the body:

- `/page?size=N&type=T` (a page of N bytes of type T; 213 bytes of text/html by default), and
  `&framing=chunked&chunks=K&gap_ms=M` to send it in K chunks M ms apart, without a length;
- anything else: a JSON-RPC answer (application/json) whose result names the request's method,
  path and body length, padded to `?size=N` bytes if asked: the same answer through any proxy
  that passes the request on.

With `&coding=gzip`, a body goes gzipped to a request whose Accept-Encoding names gzip, as a node
does.
"""

import gzip
import hashlib
import json
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from testbed.harness import StandIn

# The request headers a proxy in front may change, said back as `x-asked-<name>`.
ASKED = ("accept-encoding", "accept", "content-length", "content-type", "transfer-encoding")
PAGE_SIZE = 213
PAGE_TYPE = "text/html"


def page(size, content_type=PAGE_TYPE):
    """The page of `size` bytes the upstream serves (text that compresses, as a page does)."""
    line = b"<p>rpcedge passes what it has no work on as it came</p>\n" if "html" in content_type \
        else b"rpcedge passes what it has no work on as it came\n"
    return (line * (size // len(line) + 1))[:size]


class Delivery(StandIn):
    """The upstream, on a free loopback port until stop(); `asked` holds the request headers of
    each request in the order they came (lower-case names, repeats kept)."""

    def __init__(self):
        self.asked = []
        asked = self.asked

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.answer()

            do_POST = do_PUT = do_HEAD = do_GET

            def answer(self):
                headers = [(name.lower(), value) for name, value in self.headers.items()]
                asked.append(headers)
                body = self.read_body()
                url = urlsplit(self.path)
                query = {name: values[-1] for name, values in parse_qs(url.query).items()}
                echo = [(f"x-asked-{name}", value) for name, value in headers if name in ASKED]
                echo += [("x-asked-body-length", str(len(body))),
                         ("x-asked-body-sha256", hashlib.sha256(body).hexdigest())]
                if url.path == "/page":
                    content_type = query.get("type", PAGE_TYPE)
                    answer = page(int(query.get("size", PAGE_SIZE)), content_type)
                else:
                    content_type = "application/json"
                    result = {"method": self.command, "path": self.path, "body_length": len(body), "pad": ""}
                    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()
                    result["pad"] = "0" * (int(query.get("size", 0)) - len(answer))
                    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()
                if query.get("coding") == "gzip" and "gzip" in (self.headers.get("accept-encoding") or ""):
                    answer = gzip.compress(answer, mtime=0)
                    echo.append(("content-encoding", "gzip"))
                self.send(answer, content_type, echo,
                          chunks=int(query["chunks"]) if query.get("framing") == "chunked" else 0,
                          gap=int(query.get("gap_ms", 0)) / 1000)

            def read_body(self):
                if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                    body = bytearray()
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        body += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                return self.rfile.read(int(self.headers.get("content-length") or 0))

            def send(self, body, content_type, echo, chunks=0, gap=0.0):
                self.send_response(200)
                self.send_header("content-type", content_type)
                for name, value in echo:
                    self.send_header(name, value)
                if not chunks:
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)
                    return
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                step = -(-len(body) // chunks) or 1
                for at in range(0, len(body), step):
                    if at:
                        time.sleep(gap)
                    piece = body[at:at + step]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        super().__init__(Handler)
