"""`Client.deltas` against a stand-in for the deltas route (the golden vectors of
`format/tests/data/delta/` as its deltas, sent chunked with no length, as the server does): the
deltas come in order and apply; a body cut short is asked for again from the first delta not yet
handed out; a CRC that does not match, every time, is a TransferError; 410 is VersionGone (a
ModelChanged). The route against the real server is in test_deltas.py."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import crc32c
import numpy as np
import pytest

import ztserve_client
from ztserve_client import Client, apply_delta

GOLDEN = Path(__file__).resolve().parents[3] / "format" / "tests" / "data" / "delta"
CASES = ["bf16_patch", "f32_patch", "u8_whole", "f64_patch_edges"]


class _Stub:
    def __init__(self):
        self.deltas = {case: (GOLDEN / f"{case}.delta").read_bytes() for case in CASES}
        self.mode = "ok"
        self.asked = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.asked.append((self.path, request["from"], [r["object"] for r in request["regions"]]))
                if stub.mode == "gone":
                    body = json.dumps({"error": {"code": "version_gone", "message": "policy/step-1 is no longer kept"}}).encode()
                    self.send_response(410)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                body = bytearray()
                for region in request["regions"]:
                    delta = stub.deltas[region["object"]]
                    body += delta + crc32c.crc32c(delta).to_bytes(4, "big")
                if stub.mode == "corrupt":
                    body[60] ^= 0xFF
                cut = stub.mode == "cut once"
                if cut:
                    stub.mode = "ok"
                    body = body[: len(stub.deltas[request["regions"][0]["object"]]) + 4 + 20]
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.ztserve.deltas")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("X-Zt-Model-Version", '"v2"')
                self.send_header("x-zt-from-version", '"v1"')
                self.send_header("x-zt-regions", str(len(request["regions"])))
                self.end_headers()
                for start in range(0, len(body), 100):
                    chunk = bytes(body[start:start + 100])
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                if cut:
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client dropping a connection it will not read on

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def stub():
    s = _Stub()
    yield s
    s.close()


def test_deltas_come_in_order_checked_and_apply(stub):
    stream = Client(stub.url).deltas("policy/step-2", "policy/step-1", [{"object": c} for c in CASES])
    got = list(stream)
    for case, delta in zip(CASES, got):
        target = np.frombuffer(bytearray((GOLDEN / f"{case}.old").read_bytes()), dtype=np.uint8)
        apply_delta(delta, target)
        assert target.tobytes() == (GOLDEN / f"{case}.new").read_bytes()
    assert stream.version == '"v2"' and stream.from_version == '"v1"'
    assert stream.received == sum(len(stub.deltas[c]) + 4 for c in CASES)
    assert stub.asked == [("/models/policy%2Fstep-2/deltas", "policy/step-1", CASES)]


def test_a_body_cut_short_is_asked_again_from_the_first_delta_not_handed_out(stub):
    stub.mode = "cut once"
    got = list(Client(stub.url, retries=2).deltas("m", "a", [(c, None) for c in CASES]))
    assert [bytes(g) for g in got] == [stub.deltas[c] for c in CASES]
    assert [asked for _, _, asked in stub.asked] == [CASES, CASES[1:]]


def test_a_crc_that_never_matches_is_a_transfer_error(stub):
    stub.mode = "corrupt"
    with pytest.raises(ztserve_client.TransferError, match="crc32c"):
        list(Client(stub.url, retries=1).deltas("m", "a", [(c, None) for c in CASES]))
    assert len(stub.asked) == 2, "asked once more before giving up"


def test_a_base_no_longer_kept_is_version_gone(stub):
    stub.mode = "gone"
    with pytest.raises(ztserve_client.VersionGone) as raised:
        list(Client(stub.url).deltas("m", "a", [("bf16_patch", None)]))
    assert isinstance(raised.value, ztserve_client.ModelChanged) and raised.value.status == 410
    assert raised.value.code == "version_gone"
