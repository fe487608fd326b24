"""A minimal FastCGI responder (the protocol's record layer, one request per connection) for the
tests of rpcedge behind nginx's fastcgi_pass: it answers every request with one fixed body."""

import socketserver
import struct

from testbed.harness import StandIn

BEGIN_REQUEST, END_REQUEST, PARAMS, STDIN, STDOUT = 1, 3, 4, 5, 6
MAX_CONTENT = 65535


def record(kind, request_id, content=b""):
    return struct.pack(">BBHHBB", 1, kind, request_id, len(content), 0, 0) + content


def read_record(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    _, kind, request_id, length, padding, _ = struct.unpack(">BBHHBB", header)
    content = stream.read(length)
    stream.read(padding)
    return kind, request_id, content


class FastCgi(StandIn):
    """Serves `body` as `content_type` on a free loopback port until stop()."""

    def __init__(self, body, content_type="application/json"):
        head = f"Status: 200 OK\r\nContent-Type: {content_type}\r\n\r\n".encode()
        response = head + body

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                request_id = None
                while (rec := read_record(self.rfile)) is not None:
                    kind, request_id, content = rec
                    if kind == STDIN and not content:
                        break
                if request_id is None:
                    return
                for at in range(0, len(response), MAX_CONTENT):
                    self.wfile.write(record(STDOUT, request_id, response[at:at + MAX_CONTENT]))
                self.wfile.write(record(STDOUT, request_id))
                self.wfile.write(record(END_REQUEST, request_id, struct.pack(">IB3x", 0, 0)))

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        super().__init__(Handler, server=socketserver.ThreadingTCPServer)
