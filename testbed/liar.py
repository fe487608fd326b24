"""A liar (issue 47's content faults): an HTTP/1.1 server in front of a real one (the replay node,
or the cache daemon) that passes each request on and, while a lie is set, answers a share of the
requests with that lie instead of the true answer. It runs as its own process, so that its work
never slows the clients of a load in the harness's process:

    python -m testbed.liar --port P --upstream U

and is told which lie to tell over its own route, `POST /_lie` with {"lie": name, "share": 0.3}
({"lie": null} to stop lying); `Liar` does both.

The lies, each a function of the true answer (`LIES`); the node's:

    short-length   Content-Length as the whole answer, half the bytes, then the connection closed
    long-length    the whole answer, then a second, smuggled response on the same connection
    garbage        half the answer and some bytes that are no JSON, framed exactly (a 200)
    error-storm    429 with Retry-After, 503, or a 200 with a JSON-RPC "limit exceeded" error
    unasked-gzip   the answer gzipped (Content-Encoding: gzip) whatever the request accepted
    fork           a receipt from a fork: its block hash another's (the block not yet final, while
                   the finality node says it is: faults.FaultedStack lies about that)

and the cache daemon's (or any store's):

    bitflip        one bit of the body flipped, anywhere (the status and headers as they came)

`relayed` says which bodies a client may receive as the node's own lie passed on unchanged: what a
proxy cannot know to be false (garbage framed exactly, an error the node sent as a 200).
"""

import argparse
import gzip
import http.client
import json
import random
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from testbed.harness import LOOPBACK, REPO, Process

# what the garbage lie puts after half of the answer: no JSON ends this way
GARBAGE = b"\n\xff\xfe<liar: garbage>"
SMUGGLED_BODY = b'{"jsonrpc":"2.0","id":1,"result":"0xsmuggled by the liar"}'
SMUGGLED = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(SMUGGLED_BODY)) + SMUGGLED_BODY
LIMIT_CODE, LIMIT_MESSAGE = -32005, "limit exceeded (liar)"
# request headers not passed on: the connection's own, and Accept-Encoding (the node answers
# identity, so that every lie is told of the answer's bytes)
NOT_PASSED = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "accept-encoding", "host"}
# response headers not passed on: the framing, which the liar sets itself
NOT_RETURNED = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def request_id(request_body):
    """The id of a single JSON-RPC call, or None (a batch, no JSON)."""
    try:
        call = json.loads(request_body)
    except ValueError:
        return None
    return call.get("id") if isinstance(call, dict) else None


def limit_error(request_body):
    return json.dumps({"jsonrpc": "2.0", "id": request_id(request_body),
                       "error": {"code": LIMIT_CODE, "message": LIMIT_MESSAGE}}, separators=(",", ":")).encode()


def head(status, reason, length, headers=(), content_type="application/json"):
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}", f"Content-Length: {length}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def short_length(answer, request_body, rng):
    return head(200, "OK", len(answer)) + answer[:len(answer) // 2], True


def long_length(answer, request_body, rng):
    return head(200, "OK", len(answer)) + answer + SMUGGLED, False


def garbled(answer):
    """The garbage lie's body: half of `answer`, then bytes that are no JSON."""
    return answer[:len(answer) // 2] + GARBAGE


def garbage(answer, request_body, rng):
    body = garbled(answer)
    return head(200, "OK", len(body)) + body, False


def error_storm(answer, request_body, rng):
    kind = rng.randrange(3)
    if kind == 0:
        body = limit_error(request_body)
        return head(429, "Too Many Requests", len(body), ["Retry-After: 1"]) + body, False
    if kind == 1:
        body = b"upstream overloaded\n"
        return head(503, "Service Unavailable", len(body), content_type="text/plain") + body, False
    body = limit_error(request_body)
    return head(200, "OK", len(body)) + body, False


RECEIPT = "eth_getTransactionReceipt"
BLOCK_HASH = re.compile(rb'"blockHash"\s*:\s*"(0x[0-9a-fA-F]{64})"')


def forked(answer, request_body):
    """`answer` as a fork would give it: a receipt's block hash, wherever it is named, another
    block's; any other answer as it is."""
    try:
        call = json.loads(request_body)
    except ValueError:
        return answer
    found = BLOCK_HASH.search(answer) if isinstance(call, dict) and call.get("method") == RECEIPT else None
    if found is None:
        return answer
    block_hash = found.group(1)
    return answer.replace(block_hash, b"0x" + block_hash[2:][::-1])


def fork(answer, request_body, rng):
    body = forked(answer, request_body)
    return None if body == answer else (head(200, "OK", len(body)) + body, False)


def unasked_gzip(answer, request_body, rng):
    body = gzip.compress(answer, 6)
    return head(200, "OK", len(body), ["Content-Encoding: gzip"]) + body, False


def bitflip(answer, request_body, rng):
    """Told of the whole response (`answer` is its status line and headers too): one bit after
    the head flipped."""
    at = answer.index(b"\r\n\r\n") + 4
    if at == len(answer):
        return answer, False
    flipped = bytearray(answer)
    flipped[rng.randrange(at, len(answer))] ^= 1 << rng.randrange(8)
    return bytes(flipped), False


LIES = {
    "short-length": short_length,
    "long-length": long_length,
    "garbage": garbage,
    "error-storm": error_storm,
    "unasked-gzip": unasked_gzip,
    "bitflip": bitflip,
    "fork": fork,
}
# the lies told of the whole true response rather than of its body
WHOLE = {"bitflip"}


def relayed(lie, body, request_body, answer, batch):
    """Whether `body` (a 200's, decoded) is the node's `lie` about `answer` passed on unchanged:
    the garbage lie's body, or the storm's 200 error for this request's id. A batch's answer is
    judged as JSON elsewhere, so its garbage is known by its end alone."""
    if lie == "garbage":
        return body.endswith(GARBAGE) if batch else body == garbled(answer)
    if lie == "fork":
        return not batch and body != answer and body == forked(answer, request_body)
    if lie == "error-storm":
        try:
            return json.loads(body) == json.loads(limit_error(request_body))
        except ValueError:
            return False
    return False


class LyingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "liar"
    lie, share, rng = None, 0.0, random.Random(47)
    told = 0  # lies told since the last one was set
    lock = threading.Lock()
    upstream = None  # set by main
    local = threading.local()

    def log_message(self, *args):
        pass

    def body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_POST(self):
        body = self.body()
        if self.path == "/_lie":
            if self.command == "GET":
                told = json.dumps({"told": self.told}).encode()
                return self.send(head(200, "OK", len(told)) + told, False)
            lie = json.loads(body)
            with self.lock:
                LyingHandler.lie, LyingHandler.share = lie["lie"], float(lie.get("share", 0.3))
                LyingHandler.told = 0
            return self.send(head(204, "No Content", 0), False)
        status, reason, headers, answer = self.ask_node(body)
        with self.lock:
            lie = self.lie if self.lie and status == 200 and self.rng.random() < self.share else None
            rng = random.Random(self.rng.random())
        passed = [f"{name}: {value}" for name, value in headers if name.lower() not in NOT_RETURNED]
        wire = ("\r\n".join([f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(answer)}", *passed])
                + "\r\n\r\n").encode() + answer
        # a lie with nothing to tell of this answer (a fork of no receipt) gives None
        told = LIES[lie](wire if lie in WHOLE else answer, body, rng) if lie else None
        if told is None:
            return self.send(wire, False)
        with self.lock:
            LyingHandler.told += 1
        return self.send(*told)

    do_GET = do_PUT = do_DELETE = do_POST

    def ask_node(self, body):
        headers = {name: value for name, value in self.headers.items() if name.lower() not in NOT_PASSED}
        for attempt in range(2):  # a kept connection the node has closed meanwhile is opened again once
            connection = getattr(self.local, "connection", None)
            if connection is None:
                connection = self.local.connection = http.client.HTTPConnection(LOOPBACK, self.upstream, timeout=60)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                return response.status, response.reason, response.getheaders(), response.read()
            except (http.client.HTTPException, OSError):
                connection.close()
                self.local.connection = None
                if attempt:
                    raise

    def send(self, wire, close):
        self.wfile.write(wire)
        self.wfile.flush()
        self.close_connection = close


class Liar:
    """A liar as a child process in front of `upstream_port`."""

    def __init__(self, name, log_dir, port, upstream_port):
        self.port = port
        self.process = Process(name, [sys.executable, "-m", "testbed.liar", "--port", port, "--upstream",
                                      upstream_port], log_dir / f"{name}.log", cwd=REPO)
        self.process.wait_for_port(port)

    def tell(self, lie, share=0.3):
        """Lies `lie` (a name in LIES, or None for the truth) on `share` of the answers from now on."""
        assert lie is None or lie in LIES, lie
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=10)
        try:
            connection.request("POST", "/_lie", json.dumps({"lie": lie, "share": share}))
            assert connection.getresponse().status == 204
        finally:
            connection.close()

    def told(self):
        """The lies told since the lie was set."""
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=10)
        try:
            connection.request("GET", "/_lie")
            return json.loads(connection.getresponse().read())["told"]
        finally:
            connection.close()

    def stop(self):
        self.process.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    args = parser.parse_args()
    LyingHandler.upstream = args.upstream
    server = ThreadingHTTPServer((LOOPBACK, args.port), LyingHandler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
