"""scripts/gpu-check's steps where there is no GPU: it writes the model, serves it with
ZTSERVE_BIN, loads it through the client into CPU memory (`load`, `Snapshot.stream` whole, and
two ranks' shares at once), checks every tensor against safetensors' own load and writes its
table; on a GPU machine the same steps run to CUDA."""

import os
import subprocess
import sys

from conftest import REPO, binary


def test_gpu_check_runs_its_steps_into_cpu_memory(tmp_path):
    out = tmp_path / "gpu.md"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--size-mib", "48",
                          "--bin", str(binary()), "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    table = out.read_text()
    assert "every tensor identical to safetensors' own load" in table
    assert "| safetensors `load_file(device=\"cpu\")` from local disk |" in table
    assert "| ztserve, Python client `load(framework=\"torch\", device=\"cpu\")` over loopback |" in table
    assert "| ztserve, Python client `Snapshot.stream(framework=\"torch\", device=\"cpu\")` over loopback (the vLLM load format's path) |" in table
    assert "| 0 of 2 |" in table and "| 1 of 2 |" in table


def test_gpu_check_refuses_a_cuda_run_without_a_gpu_rather_than_measuring_the_cpu(tmp_path):
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine that has one
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check"), "--bin", str(binary()), "--out",
                          str(tmp_path / "gpu.md")], capture_output=True, text=True, timeout=120, env=hidden)
    assert run.returncode != 0 and "torch sees no CUDA device" in run.stderr
    assert not (tmp_path / "gpu.md").exists()
