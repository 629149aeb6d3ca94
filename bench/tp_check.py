"""Checks every rank's slice of bench/run's matrix against numpy's slicing of the whole matrix.

usage: tp_check.py OBJECT_URL ROWS COLS WORLD
"""
import sys
import urllib.request

import ml_dtypes
import numpy as np

url, rows, cols, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
whole = np.frombuffer(urllib.request.urlopen(url).read(), dtype=ml_dtypes.bfloat16).reshape(rows, cols)
for dim in (0, 1):
    size = whole.shape[dim]
    each = size // world
    for rank in range(world):
        stop = size if rank == world - 1 else (rank + 1) * each
        expected = np.ascontiguousarray(np.take(whole, range(rank * each, stop), axis=dim))
        with urllib.request.urlopen(f"{url}?shard={rank}/{world}&dim={dim}") as response:
            got = response.read()
            assert response.headers["X-Zt-Shape"] == ",".join(map(str, expected.shape)), dict(response.headers)
        assert got == expected.tobytes(), f"rank {rank} of {world}, dimension {dim}: bytes differ"
print(f"tp_check: {2 * world} slices equal numpy's", file=sys.stderr)
