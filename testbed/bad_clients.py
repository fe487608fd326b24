"""Clients that misbehave, for the fault matrix's client cells (testbed/faults.py): each does its
one bad thing to a proxy once and returns what it saw, as `Seen`s for judged_load.judge_client.

The requests come from the matrix (judged_load.request_of); these only say how they are sent and read.
"""

import contextlib
import functools
import socket
import struct
import time
from dataclasses import dataclass, field

from h2 import events as h2_events
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError

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
# what the HTTP/2 client hands its connection at once (less than a frame's least size, 16 KiB)
H2_PIECE = 1024
JSON = {"Content-Type": "application/json"}
# how long a smuggling client waits, after its answer, for a second one it never asked for
SMUGGLE_LINGER_S = 1
# the slowloris client's connections, and how long each round keeps them, one byte of each one's
# request sent a second
SLOWLORIS_CONNECTIONS = 1000
SLOWLORIS_S = 5


@dataclass
class Seen:
    response: object = None  # the wire.Response (as far as it was read)
    request: object = None  # the judged_load.Request whose recording judges a 200 (None: none does)
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


def h2_reset_one(port, requests, timeout):
    """Two streamed traces on one HTTP/2 connection (prior knowledge): the first stream reset
    (RST_STREAM, CANCEL) once READ_BEFORE_RESET bytes of its body came, the second read to its
    end, then a GOAWAY sent and the connection closed."""
    h2 = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    h2.initiate_connection()
    streams = {}
    for request in requests:
        stream = h2.get_next_available_stream_id()
        h2.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":authority", f"{wire.LOOPBACK}:{port}"),
                                 (":path", request.path), ("content-type", "application/json"),
                                 ("content-length", str(len(request.body))), ("accept-encoding", ACCEPT_ENCODING)])
        h2.send_data(stream, request.body, end_stream=True)
        streams[stream] = H2Stream(request)
    first, *_ = streams
    with socket.create_connection((wire.LOOPBACK, port), timeout=timeout) as sock:
        sock.sendall(h2.data_to_send())
        while not all(stream.over for stream in streams.values()):
            data = sock.recv(65536)
            if not data:
                break
            # fed a little at a time, so that the first stream is reset between two of its frames,
            # as a client that acts on each frame would, not only once its whole body came
            for at in range(0, len(data), H2_PIECE):
                try:
                    events = h2.receive_data(data[at:at + H2_PIECE])
                except ProtocolError:
                    return [Seen(request=request, garbled=True) for request in requests]
                for event in events:
                    if isinstance(event, h2_events.ConnectionTerminated):
                        # h2 takes no frame after a GOAWAY: what has not ended is cut
                        for stream in streams.values():
                            stream.reset = stream.reset or not stream.over
                        return [stream.seen() for stream in streams.values()]
                    if (stream := streams.get(getattr(event, "stream_id", None))) and not stream.over:
                        stream.take(event, h2)
                reset = streams[first]
                if not reset.over and len(reset.body) >= READ_BEFORE_RESET:
                    h2.reset_stream(first, ErrorCodes.CANCEL)
                    reset.left = True
            sock.sendall(h2.data_to_send())
        h2.close_connection()
        with contextlib.suppress(OSError):
            sock.sendall(h2.data_to_send())
    return [stream.seen() for stream in streams.values()]


def chunked(body):
    """`body` in one chunk, and the last."""
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


# One call framed two ways at once (RFC 9112 6.3; the request smuggling of "HTTP Desync
# Attacks"): the framing headers and the body. Whichever way a proxy reads it, what follows its
# reading of the body must be nothing, or it is a request the client's bytes smuggled in.
SMUGGLED = {
    # Content-Length covers an empty chunked body and a second call: read by length, the second
    # call is the node's to find; read as chunked (TE wins), it is a second request here
    "cl-te": lambda port, request: (
        {"Transfer-Encoding": "chunked"},
        b"0\r\n\r\n" + smuggled(port, request)),
    # chunked says the whole call, Content-Length only its chunk's size line: read by length, the
    # call is a second request
    "te-cl": lambda port, request: (
        {"Transfer-Encoding": "chunked", "Content-Length": str(len(f"{len(request.body):x}\r\n"))},
        chunked(request.body)),
    # two lengths: the call's, and the call's with a second call behind it
    "duplicate-cl": lambda port, request: (
        {"Content-Length": [str(len(request.body)), str(len(request.body) + len(smuggled(port, request)))]},
        request.body + smuggled(port, request)),
    # a length no grammar allows (RFC 9110 8.6: 1*DIGIT)
    "signed-cl": lambda port, request: ({"Content-Length": f"+{len(request.body)}"}, request.body),
}


def smuggled(port, request):
    """The second call a smuggling client hides in its first."""
    return wire.head(port, request.path, "POST", JSON, request.body, ACCEPT_ENCODING)


def smuggling(port, requests, timeout):
    """Sends one call framed two ways at once, each of SMUGGLED's ways on a connection of its own
    that it keeps open, and reads to its end or until SMUGGLE_LINGER_S passes after a whole answer:
    bytes past that answer are garbled (an answer to a request the client never made)."""
    seen = []
    for request, framed in zip(requests, SMUGGLED.values()):
        framing, body = framed(port, request)
        if "Content-Length" not in framing:
            framing["Content-Length"] = str(len(body))
        data = wire.head(port, request.path, "POST", {**JSON, **framing}, b"", ACCEPT_ENCODING, keep_alive=True)
        with socket.create_connection((wire.LOOPBACK, port), timeout=timeout) as sock:
            sock.sendall(data + body)
            received, reset = lingering(sock, timeout)
        response = first_response(received, reset)
        end = wire.framed_length(response) if response.complete else None
        past = received[response.head_length + end:] if end is not None else b""
        seen.append(Seen(response, request, garbled=bool(past)))
    return seen


def lingering(sock, timeout):
    """What `sock` brings until it ends, or until SMUGGLE_LINGER_S passes with nothing more after
    a whole response, or `timeout` in all: (bytes, whether a reset ended it); a TimeoutError where
    no whole response came by then."""
    data, deadline = bytearray(), time.monotonic() + timeout
    while True:
        try:
            response = first_response(bytes(data)) if data else None
            whole = response is not None and response.complete
        except (AssertionError, IndexError, ValueError):
            whole = False
        left = deadline - time.monotonic()
        if left <= 0:
            if whole:
                return bytes(data), False
            raise TimeoutError(f"no whole response within {timeout} s")
        sock.settimeout(min(SMUGGLE_LINGER_S, left) if whole else left)
        try:
            piece = sock.recv(1 << 16)
        except ConnectionResetError:
            return bytes(data), True
        except TimeoutError:
            if whole:
                return bytes(data), False
            raise
        if not piece:
            return bytes(data), False
        data += piece


@dataclass
class H2Stream:
    """What came on one HTTP/2 stream."""
    request: object
    status: int = 0
    headers: list = field(default_factory=list)
    body: bytes = b""
    ended: bool = False  # END_STREAM came: the body is whole
    reset: bool = False  # the proxy reset it, or ended the connection first
    left: bool = False  # the client reset it

    @property
    def over(self):
        return self.ended or self.reset or self.left

    def take(self, event, h2):
        """One of the connection's events for this stream."""
        if isinstance(event, h2_events.ResponseReceived):
            self.status = int(dict(event.headers)[":status"])
            self.headers = [(name, value) for name, value in event.headers if not name.startswith(":")]
        elif isinstance(event, h2_events.DataReceived):
            self.body += event.data
            h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2_events.StreamEnded):
            self.ended = True
        elif isinstance(event, h2_events.StreamReset):
            self.reset = True

    def seen(self):
        response = wire.Response(self.status, self.headers, 0, self.body, [], reset=self.reset, body=self.body,
                                 complete=self.ended)
        return Seen(response, self.request, left=self.left)


def slowloris(port, requests, timeout):
    """SLOWLORIS_CONNECTIONS connections at once, each sent its request a byte a second for
    SLOWLORIS_S seconds (never whole), then left: on each, what the proxy sent meanwhile (a 408 or
    400, a close), or that the client left with nothing."""
    request = requests[0]
    data = wire.head(port, request.path, "POST", JSON, request.body, ACCEPT_ENCODING)
    connections = []
    try:
        for _ in range(SLOWLORIS_CONNECTIONS):
            sock = socket.create_connection((wire.LOOPBACK, port), timeout=timeout)
            sock.setblocking(False)
            connections.append(SlowConnection(sock))
        deadline = time.monotonic() + SLOWLORIS_S
        for sent in range(len(data) - 1):
            for connection in connections:
                connection.trickle(data[sent:sent + 1])
            if time.monotonic() + 1 >= deadline:
                break
            time.sleep(1)
        for connection in connections:
            connection.trickle(b"")
    finally:
        for connection in connections:
            connection.sock.close()
    return [connection.seen() for connection in connections]


@dataclass
class SlowConnection:
    """One of the slowloris client's connections, and what came back on it."""
    sock: socket.socket
    received: bytearray = field(default_factory=bytearray)
    closed: bool = False
    reset: bool = False

    def trickle(self, byte):
        """Sends `byte` (unless the proxy closed), then takes what came."""
        if self.closed:
            return
        try:
            self.sock.send(byte)
            while data := self.sock.recv(65536):
                self.received += data
            self.closed = True
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            self.closed = self.reset = True

    def seen(self):
        """Left with nothing; or the proxy's answer, judged by its framing (a head cut short, or a
        body the proxy had not finished, is cut)."""
        if not self.received:
            return Seen(wire.parse(b""), left=not self.closed)
        try:
            return Seen(first_response(bytes(self.received), self.reset))
        except (AssertionError, IndexError, ValueError):
            return Seen(garbled=True)


@dataclass(frozen=True)
class Client:
    what: str
    kind: str  # of the mix's requests it sends (judged_load.request_of)
    requests: int
    send: object
    # what it may see; anything else fails the cell
    allowed: frozenset
    http2: bool = False  # it speaks HTTP/2 (prior knowledge), to the proxy's h2_port


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
    "h2-reset": Client("resets one HTTP/2 stream 1 KiB into a streamed trace, reads another on the same connection",
                       "trace", 2, h2_reset_one, frozenset({"left", "right"}), http2=True),
    "slowloris": Client(f"holds {SLOWLORIS_CONNECTIONS:,} connections, each sent its request a byte a second",
                        "block", 1, slowloris, frozenset({"left", "refused", "cut"})),
    "smuggling": Client("frames a call two ways at once (Content-Length with Transfer-Encoding either way, two "
                        "lengths, a signed length), each on a connection it keeps open", "block", len(SMUGGLED),
                        smuggling, frozenset({"refused", "right"})),
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
