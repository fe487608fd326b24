"""A raw HTTP/1.1 client for the end-to-end tests: what went over the socket, when, and framed how.

The proxies are judged by the bytes on the wire, so this reads the connection to its end itself
instead of trusting a client library to hide framing, resets or timing.
"""

import base64
import functools
import gzip
import hashlib
import re
import socket
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import brotli
import zstandard

LOOPBACK = "127.0.0.1"
# rpcedge's dcz dictionary (RFC 9842), as a browser keeps it once the proxy served it
DICTIONARY_PATH = Path(__file__).resolve().parent.parent / "shared-core" / "dictionary" / "jsonrpc.dict"
DCZ_MAGIC = bytes([0x5E, 0x2A, 0x4D, 0x18, 0x20, 0x00, 0x00, 0x00])


@dataclass
class Response:
    status: int
    headers: list  # (lower-case name, value), in order, repeats kept
    head_length: int  # bytes of the status line and headers
    raw: bytes  # everything after the head, as it came
    arrivals: list  # (seconds after sending, bytes of the response so far) per socket read
    reset: bool = False  # the connection ended with a reset
    body: bytes = b""  # de-chunked, not decoded
    chunk_sizes: list = field(default_factory=list)
    complete: bool = False  # the framing says the whole body arrived

    def header(self, name):
        """All values of a header joined as one list; None when absent."""
        values = [value for n, value in self.headers if n == name]
        return ", ".join(values) if values else None

    def header_count(self, name):
        return sum(1 for n, _ in self.headers if n == name)

    @property
    def chunked(self):
        return "chunked" in (self.header("transfer-encoding") or "")

    def decoded(self):
        return decode(self.header("content-encoding"), self.body)

    def decoded_over_time(self):
        """(seconds after sending, decoded body bytes readable by then) per socket read."""
        progress = []
        for seconds, total in self.arrivals:
            raw = self.raw[:max(0, total - self.head_length)]
            body = dechunk(raw)[0] if self.chunked else raw
            progress.append((seconds, len(decode_prefix(self.header("content-encoding"), body))))
        return progress


def decode(coding, body):
    """The body a client decodes, checked whole (a cut stream fails)."""
    if coding == "gzip":
        return gzip.decompress(body)
    if coding == "deflate":
        return zlib.decompress(body)
    if coding == "zstd":
        # frame after frame, each whole (RFC 8878: a body may be several)
        out, rest = b"", body
        while True:
            frame = zstandard.ZstdDecompressor().decompressobj()
            out += frame.decompress(rest)
            assert frame.eof, "zstd: the body ends inside a frame"
            rest = frame.unused_data
            if not rest:
                return out
    if coding == "br":
        return brotli.decompress(body)
    if coding == "dcz":
        header, frame = body[:40], body[40:]
        assert header == DCZ_MAGIC + hashlib.sha256(dictionary()).digest(), "dcz: the header names the dictionary"
        decoder = undcz()
        out = decoder.decompress(frame)
        assert decoder.eof and not decoder.unused_data, "dcz: one whole frame"
        return out
    assert coding is None, f"unexpected Content-Encoding {coding}"
    return body


@functools.cache
def dictionary():
    return DICTIONARY_PATH.read_bytes()


def available_dictionary():
    """The Available-Dictionary a client that has the dictionary sends: its SHA-256, as a
    structured-field byte sequence."""
    return ":" + base64.b64encode(hashlib.sha256(dictionary()).digest()).decode() + ":"


def undcz():
    """A decoder of a dcz body's frame, against the dictionary."""
    return zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(dictionary())).decompressobj()


def decode_prefix(coding, body):
    """What a client can decode of a body that may not have ended yet."""
    if coding in ("gzip", "deflate"):
        return zlib.decompressobj(wbits=31 if coding == "gzip" else 15).decompress(body)
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(body) if body else b""
    if coding == "br":
        return brotli.Decompressor().process(body)
    if coding == "dcz":
        return undcz().decompress(body[40:]) if len(body) > 40 else b""
    assert coding is None, f"unexpected Content-Encoding {coding}"
    return body


def head(port, path, method="GET", headers=None, body=b"", accept_encoding="gzip", host=LOOPBACK,
         keep_alive=False, host_header=None):
    """A request's bytes; `headers` is a dict whose values may be lists (repeated headers);
    `host_header` is the Host header's value (default: `host`:`port`)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_header or f'{host}:{port}'}"]
    if not keep_alive:
        lines.append("Connection: close")
    if accept_encoding is not None:
        lines.append(f"Accept-Encoding: {accept_encoding}")
    for name, values in (headers or {}).items():
        lines += [f"{name}: {value}" for value in (values if isinstance(values, list) else [values])]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def request(port, path, method="GET", headers=None, body=b"", accept_encoding="gzip", timeout=60,
            host=LOOPBACK, rcvbuf=None, read_after=0, host_header=None):
    """One request on a fresh connection, read until its response is whole as its framing says
    and AFTER_WHOLE_S has passed with nothing more (Envoy holds a connection it closes up to a
    second for the client to close first), or else to the end of the connection. A slow client:
    `rcvbuf` bytes of socket receive buffer, and no reading for `read_after` seconds."""
    arrivals = []
    with socket.socket() as sock:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.connect((host, port))
        sent_at = time.monotonic()
        sock.sendall(head(port, path, method, headers, body, accept_encoding, host, host_header=host_header))
        time.sleep(read_after)
        data, reset = receive(sock, lambda total: arrivals.append((time.monotonic() - sent_at, total)),
                              whole=lambda data: whole_response(data, head_only=method == "HEAD"))
    return parse(data, arrivals, reset, head_only=method == "HEAD")


def receive(sock, arrived=None, whole=None):
    """Everything `sock` brings until it ends, or until AFTER_WHOLE_S passes with nothing more
    once `whole` says so of the bytes so far: (bytes, whether a reset ended it); `arrived` is
    called with the bytes so far after each read."""
    data, reset = bytearray(), False
    while True:
        try:
            piece = sock.recv(1 << 16)
        except ConnectionResetError:
            reset = True
            break
        except TimeoutError:
            if sock.gettimeout() == AFTER_WHOLE_S:
                break
            raise
        if not piece:
            break
        data += piece
        if arrived:
            arrived(len(data))
        if whole and whole(data):
            # bytes past the framed end (a body after a HEAD's head, a reset) still show
            sock.settimeout(AFTER_WHOLE_S)
    return bytes(data), reset


# how long a request waits, once its response is whole, for bytes that should not come
AFTER_WHOLE_S = 0.05


def whole_response(data, head_only=False):
    """Whether `data` holds a response whose framing (a length, or chunks) says it is whole; one
    that ends where the connection does never is."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    response = parse(bytes(data[:end + 4]), head_only=True)
    body = len(data) - end - 4
    if response.status < 200:
        return False  # an interim response (101 switches the connection: read to its end)
    if head_only or response.status in (204, 304):
        return True
    if response.chunked:
        # the last chunk, checked only where the bytes end as it does
        return data.endswith(b"0\r\n\r\n") and parse(bytes(data)).complete
    length = response.header("content-length")
    return length is not None and body >= int(length)


def keep_alive(port, paths, headers=None, accept_encoding="gzip", timeout=60, host=LOOPBACK):
    """GETs `paths` one after another on one keep-alive connection; each response is read as its
    framing says (a response that does not frame itself fails), then the next request goes."""
    responses = []
    with socket.create_connection((host, port), timeout=timeout) as sock:
        data = bytearray()
        for path in paths:
            sock.sendall(head(port, path, headers=headers, accept_encoding=accept_encoding, host=host,
                              keep_alive=True))
            while True:
                response = parse(bytes(data)) if b"\r\n\r\n" in data else None
                if response is not None and response.complete and framed_length(response) is not None:
                    break
                piece = sock.recv(1 << 16)
                assert piece, f"the connection closed before the response to {path} was whole"
                data += piece
            assert response.header("connection") != "close", path
            responses.append(response)
            data = data[response.head_length + framed_length(response):]
            assert not data, "bytes after a whole response"
    return responses


def framed_length(response):
    """How many bytes after the head the whole response took on the wire; None while its end has
    not all arrived."""
    if not response.chunked:
        return len(response.body)
    raw, at = response.raw, 0
    for size in response.chunk_sizes:
        at += len(f"{size:x}\r\n") + size + 2
    line_end = raw.find(b"\r\n", at)
    if line_end < 0:
        return None
    trailers = line_end + 2
    if raw[trailers:trailers + 2] == b"\r\n":
        return trailers + 2
    end = raw.find(b"\r\n\r\n", trailers)
    return None if end < 0 else end + 4


# an HTTP/1 status line (RFC 9112 §4), without its CRLF
STATUS_LINE = re.compile(rb"HTTP/1\.[01] [1-5][0-9]{2}( [\t\x20-\x7e\x80-\xff]*)?\Z")
# what each byte of one may be, up to its reason phrase
STATUS_LINE_SHAPE = (b"H", b"T", b"T", b"P", b"/", b"1", b".", b"01", b" ", b"12345", b"0123456789", b"0123456789", b" ")


def begins_a_status_line(line):
    """Whether `line`, cut short before its CRLF, may begin a status line."""
    if len(line) > len(STATUS_LINE_SHAPE):
        return STATUS_LINE.match(line) is not None
    return all(byte in allowed for byte, allowed in zip(line, STATUS_LINE_SHAPE))


def parse(data, arrivals=(), reset=False, head_only=False):
    """The response in `data`; status 0 when the connection closed before any response. A head
    cut short fails an assertion (the connection was cut); bytes that are no HTTP response, a
    ValueError (they are garbled)."""
    if not data:
        return Response(0, [], 0, b"", list(arrivals), reset)
    head, separator, rest = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    whole_line = b"\r\n" in head or bool(separator)
    if not (STATUS_LINE.match(status_line) if whole_line else begins_a_status_line(status_line)):
        raise ValueError(f"no HTTP response: {data[:200]!r}")
    assert separator, f"no response head, got {data[:200]!r}"
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = [(name.strip().lower(), value.strip())
               for name, _, value in (line.partition(":") for line in header_lines)]
    response = Response(int(status_line.split()[1]), headers, len(head) + len(separator), rest,
                        list(arrivals), reset)
    if head_only or response.status in (204, 304):
        response.complete = not rest
    elif response.chunked:
        response.body, response.chunk_sizes, response.complete = dechunk(rest)
    elif response.header("content-length") is not None:
        length = int(response.header("content-length"))
        response.body, response.complete = rest[:length], len(rest) == length
    else:
        response.body, response.complete = rest, not reset
    return response


def dechunk(data):
    """(body, chunk sizes, whether the last chunk arrived) of a chunked body."""
    body, sizes, at = bytearray(), [], 0
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return bytes(body), sizes, False
        size = int(data[at:line_end].split(b";")[0], 16)
        if size == 0:
            return bytes(body), sizes, True
        start = line_end + 2
        body += data[start:start + size]
        if len(data) < start + size + 2:
            return bytes(body), sizes, False
        sizes.append(size)
        at = start + size + 2
