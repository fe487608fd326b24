"""A small HTTP/2 (h2c, prior knowledge) upstream that ends every response with trailers, as gRPC
and some JSON-RPC gateways do; for the Envoy tests. Built on the `h2` state machine."""

import socket
import threading
import time

import h2.config
import h2.connection
import h2.events

from testbed.harness import LOOPBACK, free_port


class TrailersUpstream:
    """Answers any request with `body` as JSON, sent in `chunk`-byte DATA frames `delay` seconds
    apart, then a trailer block (`x-checksum: done`) that ends the stream."""

    def __init__(self, body, chunk=65536, delay=0.0):
        self.body, self.chunk, self.delay = body, chunk, delay
        self.port = free_port()
        self.listener = socket.create_server((LOOPBACK, self.port))
        self.listener.settimeout(0.2)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=5)
        self.listener.close()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        lock = threading.Lock()
        windows = threading.Condition(lock)
        try:
            while not self.stopped.is_set():
                data = sock.recv(65536)
                if not data:
                    return
                with lock:
                    for event in conn.receive_data(data):
                        if isinstance(event, h2.events.RequestReceived):
                            threading.Thread(target=self._respond, args=(sock, conn, windows, event.stream_id),
                                             daemon=True).start()
                    windows.notify_all()
                    sock.sendall(conn.data_to_send())
        except OSError:
            return
        finally:
            with lock:
                windows.notify_all()

    def _respond(self, sock, conn, windows, stream_id):
        with windows:
            conn.send_headers(stream_id, [(":status", "200"), ("content-type", "application/json")])
            sock.sendall(conn.data_to_send())
        at = 0
        while at < len(self.body):
            end = min(at + self.chunk, len(self.body))
            while at < end:
                with windows:
                    room = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size, end - at)
                    if room <= 0:
                        windows.wait(1)
                        continue
                    conn.send_data(stream_id, self.body[at:at + room])
                    sock.sendall(conn.data_to_send())
                at += room
            time.sleep(self.delay)
        with windows:
            conn.send_headers(stream_id, [("x-checksum", "done")], end_stream=True)
            sock.sendall(conn.data_to_send())
