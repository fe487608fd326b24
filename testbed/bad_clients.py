"""Clients that misbehave, for the fault matrix's client cells (testbed/faults.py): each does its
one bad thing to a proxy once and returns what it saw, as `Seen`s for faults.judge_client.

The requests come from the matrix (faults.request_of); these only say how they are sent and read.
"""

import socket
import struct
import time
from dataclasses import dataclass

from testbed import wire

# what a client that names gzip sends; the answers are judged as such
ACCEPT_ENCODING = "gzip"
PIPELINED = 4
# a body past every host's limit (nginx's client_max_body_size, Envoy's buffer limits)
HUGE_BODY = 100 << 20
DEEP = 1000
# one header this long: past nginx's large_client_header_buffers (8 KiB) and Envoy's 60 KiB
LONG_HEADER = 70_000
# how long the slow reader reads, one byte a second
SLOW_READ_S = 3


@dataclass
class Seen:
    response: object = None  # the wire.Response, or None where the client left first
    request: object = None  # the faults.Request whose recording judges a 200 (None: none does)
    left: bool = False  # the client itself left before the end


def pipelining(port, requests):
    """`requests` written at once on one connection (the last asks to close); the answers read
    in order, each as its framing says."""
    data = b"".join(wire.head(port, r.path, "POST", {"Content-Type": "application/json"}, r.body, ACCEPT_ENCODING,
                              keep_alive=i < len(requests) - 1)
                    for i, r in enumerate(requests))
    received = read_all(port, data)
    seen = []
    for request in requests:
        response = first_response(received)
        seen.append(Seen(response, request))
        end = wire.framed_length(response) if response.complete else None
        if end is None:
            break
        received = received[response.head_length + end:]
    return seen


def first_response(data):
    """The first of the responses in `data`, read as its framing says."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return wire.parse(data)
    head = wire.parse(data[:head_end + 4], head_only=True)
    length = head.header("content-length")
    if head.chunked or length is None:
        return wire.parse(data)
    return wire.parse(data[:head_end + 4 + int(length)])


def whole(port, request):
    """`request` (a 10,000-call batch) sent and read as any client would."""
    return [Seen(wire.request(port, request.path, "POST", {"Content-Type": "application/json"}, request.body,
                              ACCEPT_ENCODING, timeout=60), request)]


def huge_body(port, request):
    """A call whose body is HUGE_BODY bytes (one long string parameter): no recording answers it."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_call","params":["' + b"a" * HUGE_BODY + b'"]}'
    return [Seen(send_raw(port, wire.head(port, request.path, "POST", {"Content-Type": "application/json"}, body,
                                          ACCEPT_ENCODING)))]


def deep_json(port, request):
    """A call whose parameters nest DEEP arrays deep: no recording answers it."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":' + b"[" * DEEP + b"]" * DEEP + b"}"
    return [Seen(wire.request(port, request.path, "POST", {"Content-Type": "application/json"}, body,
                              ACCEPT_ENCODING, timeout=60))]


def long_header(port, request):
    """The call with one header of LONG_HEADER bytes."""
    headers = {"Content-Type": "application/json", "X-Long": "a" * LONG_HEADER}
    return [Seen(send_raw(port, wire.head(port, request.path, "POST", headers, request.body, ACCEPT_ENCODING)),
                 request)]


def slow_reader(port, request):
    """Asks for a streamed trace with a small receive buffer and reads one byte a second for
    SLOW_READ_S seconds, then leaves."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect((wire.LOOPBACK, port))
        sock.sendall(wire.head(port, request.path, "POST", {"Content-Type": "application/json"}, request.body,
                               ACCEPT_ENCODING))
        for _ in range(SLOW_READ_S):
            if not sock.recv(1):
                break
            time.sleep(1)
        reset_on_close(sock)
    return [Seen(left=True)]


def close_mid_body(port, request):
    """Asks for a streamed trace, reads its head and 1 KiB of its body, and resets the
    connection."""
    with socket.socket() as sock:
        sock.settimeout(30)
        sock.connect((wire.LOOPBACK, port))
        sock.sendall(wire.head(port, request.path, "POST", {"Content-Type": "application/json"}, request.body,
                               ACCEPT_ENCODING))
        data = bytearray()
        while b"\r\n\r\n" not in data or len(data) - data.index(b"\r\n\r\n") < 1024:
            piece = sock.recv(4096)
            if not piece:
                return [Seen(wire.parse(bytes(data)), request)]
            data += piece
        reset_on_close(sock)
    return [Seen(left=True)]


# name: (what it does, the kind of the mix's request it sends (faults.request_of), how)
CLIENTS = {
    "pipelining": ("writes 4 calls at once on one connection", "block", pipelining),
    "huge-batch": ("sends a batch of 10,000 calls", "huge-batch", whole),
    "huge-body": ("sends a 100 MB body", "block", huge_body),
    "deep-json": ("sends params nested 1,000 arrays deep", "block", deep_json),
    "long-header": ("sends a 70,000-byte header", "block", long_header),
    "slow-reader": ("reads a streamed trace one byte a second", "trace", slow_reader),
    "close-mid-body": ("resets the connection 1 KiB into a streamed trace", "trace", close_mid_body),
}


def read_all(port, data, timeout=60):
    """Sends `data` on a fresh connection and reads to its end (a reset ends it too)."""
    received = bytearray()
    with socket.create_connection((wire.LOOPBACK, port), timeout=timeout) as sock:
        sock.sendall(data)
        while True:
            try:
                piece = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not piece:
                break
            received += piece
    return bytes(received)


def send_raw(port, data):
    """Sends `data` and reads the response; a proxy that answers and closes before taking it all
    leaves the send reset, and what it answered is read if it arrived."""
    received = bytearray()
    with socket.create_connection((wire.LOOPBACK, port), timeout=60) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while True:
            try:
                piece = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not piece:
                break
            received += piece
    return wire.parse(bytes(received))


def reset_on_close(sock):
    """An abortive close: a reset, as a client that crashes or is killed sends."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
