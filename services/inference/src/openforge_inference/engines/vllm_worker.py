"""Worker-side methods for the vLLM engine, mixed into vLLM's worker class through the
``worker_extension_cls`` engine argument and called with ``collective_rpc``.

This module runs inside vLLM's worker processes: keep it free of imports from the rest of the
service.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OpenForgeWorkerExtension"]

#: ``worker_extension_cls`` value that installs :class:`OpenForgeWorkerExtension`.
QUALNAME = "openforge_inference.engines.vllm_worker.OpenForgeWorkerExtension"


class OpenForgeWorkerExtension:
    """Methods added to every vLLM worker (``self`` is the worker)."""

    def openforge_reload_weights(self, weights_path: str) -> None:
        """Reloads the model's weights in place from a safetensors checkpoint directory.

        Runs vLLM's in-place reload (``Worker.reload_weights``,
        vllm/model_executor/model_loader/reload/inplace.py), then re-ties a tied LM head:
        the reload skips ``lm_head.weight`` when the embedding is tied (the checkpoint does not
        store it) and so never re-runs the LM head's post-load processing, which on CPU keeps a
        packed copy of the *old* embedding for the logits GEMM
        (``dispatch_cpu_unquantized_gemm``); logits would then come from the old weights.

        Args:
            weights_path: Checkpoint directory.
        """
        worker: Any = self
        worker.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        _retie_lm_head(worker.model_runner.get_model())


def _retie_lm_head(model: Any) -> None:
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return
    lm_head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if lm_head is None or embed is None or not hasattr(lm_head, "weight"):
        return
    lm_head.weight = embed.weight
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is not None:
        quant_method.process_weights_after_loading(lm_head)
