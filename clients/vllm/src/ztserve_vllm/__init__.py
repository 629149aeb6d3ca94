"""ztserve_vllm: the `ztserve` load format for vLLM. Each tensor-parallel rank streams only its
share of every weight from a ztserve server, cut by the server, straight into memory.

    ZTSERVE_URL=http://ztserve:8080 HF_ENDPOINT=http://ztserve:8080/hf \\
        vllm serve org/llama --load-format ztserve --tensor-parallel-size 8

vLLM finds it through the `vllm.general_plugins` entry point, which calls `register`. With
`ZTSERVE_COMPILE_CACHE=read` or `read-write` it also restores (and publishes) vLLM's compile
cache through the server's artifact store (`compile_cache`), whatever the load format.
"""


def register():
    """Registers the `ztserve` load format with vLLM's model-loader registry and the `ztserve`
    weight-transfer backend (refits, `refit`) with its factory (called by vLLM in every process
    it starts), and the compile cache the environment asks for."""
    from vllm.model_executor.model_loader import register_model_loader

    from .loader import ZtserveModelLoader

    register_model_loader("ztserve")(ZtserveModelLoader)
    _register_weight_transfer()

    from . import compile_cache

    compile_cache.install_from_environment()


def _register_weight_transfer():
    """The `ztserve` weight-transfer backend (`refit`), once per process (vLLM's factory
    refuses a name registered twice); nothing on a vLLM without the framework."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    if "ztserve" not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine("ztserve", "ztserve_vllm.refit", "ZtserveWeightTransferEngine")
