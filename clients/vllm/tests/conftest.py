"""The load format's tests run without vLLM: `shares` alone, `RemoteTensor` on torch, and the
plan and stream against stand-ins of vLLM's layers (named and cut as vLLM's are) loading from a
live ztserve server (the Python client tests' `Server`, ZTSERVE_BIN)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "clients" / "vllm" / "src"))

_spec = importlib.util.spec_from_file_location("ztserve_client_live", REPO / "clients" / "python" / "tests" / "conftest.py")
live = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(live)
