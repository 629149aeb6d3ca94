"""One keep-alive HTTP/1.1 connection that reads a response body straight into place.

`http.client` reads a body through a buffered reader, one `recv` at a time, each taking the
GIL back; a thread receiving a 32 MiB body then queues for the GIL hundreds of times behind
the thread that loads what it received. Here a body's bytes land in the caller's buffer with
one `recv(MSG_WAITALL)` per region over plain TCP (the GIL released for the whole region),
the socket blocking with kernel timeouts (`SO_RCVTIMEO`, `SO_SNDTIMEO`); over TLS, where
flags cannot be passed, `recv_into` loops. Only what the regions route needs: a request
written whole, a head with `Content-Length`, a body read exactly."""

import http.client
import io
import socket
import struct


class Response:
    """A response's status and head; `read` and `readinto` take its body from the connection."""

    def __init__(self, wire, status, reason, headers):
        self.wire = wire
        self.status = status
        self.reason = reason
        self.headers = headers

    def getheader(self, name, default=None):
        return self.headers.get(name, default)

    @property
    def length(self):
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def read(self, limit):
        """Up to `limit` bytes of the body (the rest of it when it has no length)."""
        length = self.length
        want = limit if length is None else min(limit, length)
        out = bytearray(want)
        got = self.wire.fill(memoryview(out), allow_short=length is None)
        return bytes(out[:got])

    def readinto(self, view):
        """Fills `view` exactly from the body, or raises `http.client.IncompleteRead`."""
        self.wire.fill(view)


class Wire:
    """A connection to a replica's `host:port` (TLS with `context`), opened on first use and
    again when a request goes to another replica."""

    def __init__(self, timeout, context=None):
        self.timeout, self.context = timeout, context
        self.host = self.port = None
        self.sock = None
        self.pending = b""  # body bytes received with the head

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
                self.pending = b""

    def connected_to(self, replica):
        """Whether a connection to `replica` is open (kept alive from an earlier request)."""
        port = replica.port or (443 if self.context is not None else 80)
        return self.sock is not None and (replica.host, port) == (self.host, self.port)

    def interrupt(self):
        """Ends a request in progress from another thread: its send or receive fails at once."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _connect(self):
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_hostname=self.host)
        else:
            # Blocking, so MSG_WAITALL waits for the whole region; the kernel keeps the timeout.
            seconds = int(self.timeout)
            timeval = struct.pack("ll", seconds, int((self.timeout - seconds) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            sock.settimeout(None)
        self.sock = sock

    def post(self, replica, path, headers, body):
        """Sends `POST path` with `body` to `replica` and returns the response's head."""
        port = replica.port or (443 if self.context is not None else 80)
        if (replica.host, port) != (self.host, self.port):
            self.close()
            self.host, self.port = replica.host, port
        if self.sock is None:
            self._connect()
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return self._head()

    def _head(self):
        received = bytearray()
        while True:
            end = received.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(received) > 64 << 10:
                raise http.client.LineTooLong("response head")
            chunk = self.sock.recv(64 << 10)
            if not chunk:
                raise http.client.RemoteDisconnected("the server closed the connection before answering")
            received += chunk
        status_line, _, header_block = bytes(received[:end]).partition(b"\r\n")
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise http.client.BadStatusLine(status_line.decode("latin-1"))
        headers = http.client.parse_headers(io.BytesIO(header_block + b"\r\n\r\n"))
        self.pending = bytes(received[end + 4:])
        return Response(self, int(parts[1]), parts[2] if len(parts) > 2 else "", headers)

    def fill(self, view, allow_short=False):
        """Fills `view` from the body: first what came with the head, then the socket."""
        got = min(len(self.pending), len(view))
        view[:got] = self.pending[:got]
        self.pending = self.pending[got:]
        while got < len(view):
            if self.context is None:
                n = self.sock.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
            else:
                n = self.sock.recv_into(view[got:])
            if not n:
                if allow_short:
                    break
                raise http.client.IncompleteRead(b"", len(view) - got)
            got += n
        return got
