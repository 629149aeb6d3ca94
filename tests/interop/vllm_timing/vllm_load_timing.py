"""Prints, to stderr, when VLLM_LOAD_TIMING=1, after every model load in every process vLLM
starts: `LOAD_SECONDS <s> <load format>` (the whole model load: building the model, its
weights, their processing) and `WEIGHTS_SECONDS <s> <load format>` (the load format's
`load_weights` alone: every load format loads through BaseModelLoader.load_model, which calls it)."""

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
        load_weights = self.load_weights

        def timed_weights(*a, **k):
            started = time.perf_counter()
            loaded = load_weights(*a, **k)
            print(f"WEIGHTS_SECONDS {time.perf_counter() - started:.3f} {self.load_config.load_format}", file=sys.stderr,
                  flush=True)
            return loaded

        self.load_weights = timed_weights
        started = time.perf_counter()
        model = load_model(self, *args, **kwargs)
        print(f"LOAD_SECONDS {time.perf_counter() - started:.3f} {self.load_config.load_format}", file=sys.stderr, flush=True)
        return model

    timed.timed = True
    BaseModelLoader.load_model = timed
