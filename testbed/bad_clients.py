"""Clients that misbehave, for the fault matrix's client cells (testbed/faults.py): each does its
one bad thing to a proxy once and returns what it saw, as `Seen`s for faults.judge_client.

The requests come from the matrix (faults.request_of); these only say how they are sent and read.
"""

import functools
import socket
import struct
import time
from dataclasses import dataclass

from testbed import wire

# what a client that names gzip sends; the answers are judged as such
ACCEPT_ENCODING = "gzip"
# a body past every host's limit (nginx's client_max_body_size, Envoy's buffer limits)
HUGE_BODY = 100 << 20
DEEP = 1000
# one header this long: past nginx's large_client_header_buffers (8 KiB) and Envoy's 60 KiB
LONG_HEADER = 70_000
# how long the slow reader reads the body, one byte a second
SLOW_READ_S = 3
# how much of the body the client that resets reads first
READ_BEFORE_RESET = 1024
JSON = {"Content-Type": "application/json"}


@dataclass
class Seen:
    response: object = None  # the wire.Response (as far as it was read)
    request: object = None  # the faults.Request whose recording judges a 200 (None: none does)
    left: bool = False  # the client itself left before the end
    garbled: bool = False  # bytes where a response should be that are none


def pipelining(port, requests, timeout):
    """`requests` written at once on one connection (the last asks to close); the answers read
    in order, each as its framing says."""
    data = b"".join(wire.head(port, r.path, "POST", JSON, r.body, ACCEPT_ENCODING, keep_alive=i < len(requests) - 1)
                    for i, r in enumerate(requests))
    received, reset = exchange(port, data, timeout)
    seen = []
    for request in requests:
        try:
            response = first_response(received, reset)
        except (AssertionError, IndexError, ValueError):
            seen.append(Seen(request=request, garbled=True))
            break
        seen.append(Seen(response, request))
        end = wire.framed_length(response) if response.complete else None
        if end is None:
            break
        received = received[response.head_length + end:]
    return seen


def batch(port, requests, timeout):
    """The request (a 10,000-call batch) sent and read as any client would."""
    request = requests[0]
    return [Seen(wire.request(port, request.path, "POST", JSON, request.body, ACCEPT_ENCODING, timeout=timeout),
                 request)]


def huge_body(port, requests, timeout):
    """A call whose body is HUGE_BODY bytes (one long string parameter): no recording answers it."""
    body = huge_call()
    head = wire.head(port, requests[0].path, "POST", {**JSON, "Content-Length": str(len(body))}, b"", ACCEPT_ENCODING)
    return [Seen(answer(port, head, timeout, body))]


@functools.cache
def huge_call():
    return b'{"jsonrpc":"2.0","id":1,"method":"eth_call","params":["' + b"a" * HUGE_BODY + b'"]}'


def deep_json(port, requests, timeout):
    """A call whose parameters nest DEEP arrays deep: no recording answers it."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":' + b"[" * DEEP + b"]" * DEEP + b"}"
    return [Seen(wire.request(port, requests[0].path, "POST", JSON, body, ACCEPT_ENCODING, timeout=timeout))]


def long_header(port, requests, timeout):
    """The call with one header of LONG_HEADER bytes."""
    request = requests[0]
    data = wire.head(port, request.path, "POST", {**JSON, "X-Long": "a" * LONG_HEADER}, request.body, ACCEPT_ENCODING)
    return [Seen(answer(port, data, timeout), request)]


def slow_reader(port, requests, timeout):
    """Asks for a streamed trace with a small receive buffer, reads its head, then one byte of
    its body a second for SLOW_READ_S seconds, and leaves."""
    return [read_then_leave(port, requests[0], timeout, slowly=True)]


def close_mid_body(port, requests, timeout):
    """Asks for a streamed trace, reads its head and READ_BEFORE_RESET bytes of its body, and
    resets the connection."""
    return [read_then_leave(port, requests[0], timeout, slowly=False)]


@dataclass(frozen=True)
class Client:
    what: str
    kind: str  # of the mix's requests it sends (faults.request_of)
    requests: int
    send: object
    # what it may see; anything else fails the cell
    allowed: frozenset


CLIENTS = {
    "pipelining": Client("writes 4 calls at once on one connection", "block", 4, pipelining, frozenset({"right"})),
    "huge-batch": Client("sends a batch of 10,000 calls", "huge-batch", 1, batch, frozenset({"right", "refused"})),
    "huge-body": Client("sends a 100 MB body", "block", 1, huge_body, frozenset({"refused", "cut"})),
    "deep-json": Client("sends params nested 1,000 arrays deep", "block", 1, deep_json,
                        frozenset({"answered", "refused"})),
    "long-header": Client("sends a 70,000-byte header", "block", 1, long_header, frozenset({"refused", "cut"})),
    "slow-reader": Client("reads a streamed trace one byte a second", "trace", 1, slow_reader, frozenset({"left"})),
    "close-mid-body": Client("resets the connection 1 KiB into a streamed trace", "trace", 1, close_mid_body,
                             frozenset({"left"})),
}


def first_response(data, reset=False):
    """The first of the responses in `data`, read as its framing says."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return wire.parse(data, reset=reset)
    head = wire.parse(data[:head_end + 4], head_only=True)
    length = head.header("content-length")
    if head.chunked or length is None:
        return wire.parse(data, reset=reset)
    return wire.parse(data[:head_end + 4 + int(length)], reset=reset)


def exchange(port, data, timeout, more=b""):
    """Sends `data` (and `more`) on a fresh connection and reads to its end: (bytes, whether a
    reset ended it). A proxy that answers and closes before it took everything resets the send;
    what it answered is still read."""
    with socket.create_connection((wire.LOOPBACK, port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.sendall(more)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return wire.receive(sock)


def answer(port, data, timeout, more=b""):
    """The response to `data` (and `more`), sent on a fresh connection."""
    received, reset = exchange(port, data, timeout, more)
    return wire.parse(received, reset=reset)


def read_then_leave(port, request, timeout, slowly):
    """`request` sent; its head and the first body bytes read (slowly: a byte a second for
    SLOW_READ_S seconds, else READ_BEFORE_RESET bytes at once), then the connection reset."""
    with socket.socket() as sock:
        if slowly:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(timeout)
        sock.connect((wire.LOOPBACK, port))
        sock.sendall(wire.head(port, request.path, "POST", JSON, request.body, ACCEPT_ENCODING))
        data = bytearray()
        while b"\r\n\r\n" not in data:
            piece = sock.recv(1 if slowly else 4096)
            if not piece:
                return Seen(wire.parse(bytes(data)), request)
            data += piece
        body_at = data.index(b"\r\n\r\n") + 4
        wanted = SLOW_READ_S if slowly else READ_BEFORE_RESET
        while len(data) - body_at < wanted:
            piece = sock.recv(1 if slowly else 4096)
            if not piece:
                return Seen(wire.parse(bytes(data)), request)
            data += piece
            if slowly:
                time.sleep(1)
        # an abortive close: a reset, as a client that crashes or is killed sends
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return Seen(wire.parse(bytes(data)), request, left=True)
