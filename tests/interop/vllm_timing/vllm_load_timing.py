"""Prints `LOAD_SECONDS <s> <load format>` to stderr after every model load, when
VLLM_LOAD_TIMING=1: every load format loads through BaseModelLoader.load_model."""

import os
import sys
import time


def register():
    if os.environ.get("VLLM_LOAD_TIMING") != "1":
        return
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if getattr(BaseModelLoader.load_model, "timed", False):
        return
    load_model = BaseModelLoader.load_model

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        model = load_model(self, *args, **kwargs)
        print(f"LOAD_SECONDS {time.perf_counter() - started:.3f} {self.load_config.load_format}", file=sys.stderr, flush=True)
        return model

    timed.timed = True
    BaseModelLoader.load_model = timed
