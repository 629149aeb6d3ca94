"""A ranged GET on a plain socket, read straight into place: what any Python client could reach,
with no HTTP parsing past the head and no check (the ceiling benchmarks compare against)."""


def get_range_into(sock, netloc, path, start, view):
    """GETs bytes `start` to `start + len(view)` of `path` on the open `sock` (keep-alive), into `view`."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nRange: bytes={start}-{start + len(view) - 1}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 206"), head
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        assert n, "connection closed early"
        got += n
