"""ztserve_vllm: the `ztserve` load format for vLLM. Each tensor-parallel rank streams only its
share of every weight from a ztserve server, cut by the server, straight into memory.

    ZTSERVE_URL=http://ztserve:8080 HF_ENDPOINT=http://ztserve:8080/hf \\
        vllm serve org/llama --load-format ztserve --tensor-parallel-size 8

vLLM finds it through the `vllm.general_plugins` entry point, which calls `register`.
"""


def register():
    """Registers the `ztserve` load format with vLLM's model-loader registry (called by vLLM
    in every process it starts)."""
    from vllm.model_executor.model_loader import register_model_loader

    from .loader import ZtserveModelLoader

    register_model_loader("ztserve")(ZtserveModelLoader)
