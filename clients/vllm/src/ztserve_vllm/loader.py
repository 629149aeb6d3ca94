"""The `ztserve` load format: vLLM's model loader that streams each rank's weights from a
ztserve server into memory, cut by the server to what that rank's layers read.

It plans the load from the model vLLM built (which layers split which weights, `shares`),
fetches the planned regions ahead in bounded batches through the Python client (one model
version for the whole load), and hands vLLM's own `load_weights` a `RemoteTensor` per
checkpoint tensor, so vLLM's weight loaders cut and place every weight as they would from a
local file. Nothing is written to disk."""

import logging
import os
import time

from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from ztserve_client import Client, NotFound, ZtserveError

from . import refit, settings, weights
from .remote import Misses

# A child of vLLM's logger, so its lines go where vLLM's go, formatted alike.
logger = init_logger(f"vllm.{__name__}")


class ZtserveModelLoader(BaseModelLoader):
    """`--load-format ztserve`: weights from `ZTSERVE_URL` (or the extra config's `url`), the
    model named by vLLM's model id (its Hub repository id on that server, or `model`)."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.settings = settings.parse(load_config.model_loader_extra_config, os.environ)

    def _client(self):
        options = {k: self.settings[k] for k in ("concurrency", "chunk_size", "outage_secs") if k in self.settings}
        return Client(self.settings["url"], self.settings.get("token"), **options)

    def model_id(self, model_config, client):
        """The `model` setting, else the model vLLM's model id names as a Hub repository on
        this server: the first of its readings the server has."""
        if "model" in self.settings:
            return self.settings["model"]
        ids = settings.repo_to_model_ids(model_config.model, self.settings["hub_namespace"])
        for model_id in ids[:-1]:
            try:
                client.manifest(model_id)
                return model_id
            except NotFound:
                continue
        return ids[-1]

    def download_model(self, model_config):
        """Nothing is downloaded: the weights stream at load time. Checks the model is there."""
        with self._client() as client:
            client.manifest(self.model_id(model_config, client))

    def load_weights(self, model, model_config):
        started = time.perf_counter()
        with self._client() as client:
            model_id = self.model_id(model_config, client)
            snapshot = client.snapshot(model_id)
            plan = weights.planner(model)
            plans = weights.plan_model(model, snapshot, plan)
            # The ztserve weight-transfer backend refits from the regions this rank holds: keep them.
            kept = {} if refit.wants_keeping() else None
            summary = weights.summary(snapshot, plans)
            logger.info("ztserve: %s", summary["line"])
            for line in weights.warnings(summary["whole"]):
                logger.warning("ztserve: %s", line)
            if logger.isEnabledFor(logging.DEBUG):  # a line per tensor: 92k of them for DeepSeek-V3
                for one in plans:
                    logger.debug("ztserve: plan %s: %s%s", one.name, "whole" if one.regions is None else one.regions,
                                 f" ({one.reason})" if one.reason else "")
            limit = weights.strict_limit(summary, settings.STRICT_RATIO) if self.settings["strict"] else None
            misses = Misses(
                lambda name, region: logger.warning(
                    "ztserve: %s: the weight loader read %s, not the share planned; fetched on demand", name, list(region)),
                limit=None if limit is None else limit - summary["planned"])
            # vLLM's CPU build pins each rank's process to its cores; the threads that receive
            # the weights may run on any core this process is allowed, beside its loaders.
            cpus = range(os.cpu_count() or 1)
            stream = weights.stream(snapshot, plans, misses, self.settings["prefetch_bytes"], self.settings["request_bytes"],
                                    self.settings["concurrency"], cpus, keep=kept)
            try:
                loaded = model.load_weights(stream)
            except ZtserveError as e:
                logger.error("ztserve: loading %s from %s failed, so the model is not loaded: %s", model_id, client.url, e)
                raise
            finally:
                stream.close()
        if kept is not None:
            held = refit.Kept(self.settings["url"], self.settings.get("token"), model_id, snapshot.version, plans,
                              snapshot.objects, kept, plan, self.settings)
            refit.keep(model, held)
            logger.info("ztserve: kept this rank's %d regions (%.1f MB) for refits", sum(len(v) for v in kept.values()),
                        held.nbytes() / 1e6)
        quantized = model_config.quantization is not None
        if loaded is not None and not quantized:
            # vLLM's own check that every parameter was filled from the checkpoint.
            DefaultModelLoader.track_weights_loading(self, model, loaded, quantized=False)
        logger.info(
            "ztserve: loaded %s version %s in %.2f s; %d read(s) off the plan fetched on demand (%.1f MB)",
            model_id, snapshot.version.strip('"'), time.perf_counter() - started, misses.count, misses.bytes / 1e6,
        )
