"""Publishes distinct blobs to a ztserve artifact store from several connections at once, until
a stop file appears or each has published its share; prints one line:
    PUBLISHED blobs=N bytes=N seconds=F
Each blob is one random body shared by all, then a 64-byte tail naming the connection and the
blob, so every digest is new and costs the publisher only the tail's hashing.
Usage: publish_load.py URL TOKEN CONNECTIONS BLOB_BYTES MAX_EACH STOP_FILE
"""

import hashlib
import http.client
import os
import sys
import threading
import time
import urllib.parse


def main():
    url, token, connections, size, max_each, stop = sys.argv[1:7]
    connections, size, max_each = int(connections), int(size), int(max_each)
    target = urllib.parse.urlsplit(url)
    body = os.urandom(size - 64)
    prefix = hashlib.sha256(body)
    published, failures = [0], []
    lock = threading.Lock()

    def publisher(index):
        try:
            publish(index)
        except Exception as e:  # noqa: BLE001 - a publisher that fails is a failed run
            with lock:
                failures.append(repr(e))

    def publish(index):
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
        for blob in range(max_each):
            if os.path.exists(stop):
                return
            tail = f"{index}:{blob}:{time.time_ns()}".encode().ljust(64, b"\0")
            digest = prefix.copy()
            digest.update(tail)
            connection.putrequest("PUT", f"/artifacts/blobs/sha256:{digest.hexdigest()}")
            connection.putheader("Authorization", f"Bearer {token}")
            connection.putheader("Content-Type", "application/octet-stream")
            connection.putheader("Content-Length", str(size))
            connection.endheaders()
            connection.send(memoryview(body))
            connection.send(tail)
            reply = connection.getresponse()
            answer = reply.read()
            if reply.status != 201:
                with lock:
                    failures.append(f"{reply.status} {answer[:200]!r}")
                return
            with lock:
                published[0] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=publisher, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - start
    if failures:
        sys.exit(f"publish_load: {len(failures)} publishes failed, first: {failures[0]}")
    print(f"PUBLISHED blobs={published[0]} bytes={published[0] * size} seconds={took:.3f}")


if __name__ == "__main__":
    main()
