"""The shared part of the tiny-model family tests (``test_tiny_<family>.py``): a tool and a
conversation that calls it (an integer argument included), and an engine serving a tiny model
checked against the model itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "18C rain"},
    {"role": "assistant", "content": "Paris: 18C."},
    {"role": "user", "content": "Thanks!"},
]


def serve_and_recompute(
    engine_name: str, model_dir: Path, prompt_ids: list[int], loop_thread: Any, *, kv_cache_gib: float = 0.25
) -> tuple[Any, list[int], list[float], list[float]]:
    """Starts ``engine_name`` on ``model_dir``, samples up to 12 tokens after ``prompt_ids``
    (temperature 1, seed 3) and recomputes their logprobs with a teacher-forced transformers
    forward of the same weights (``kv_cache_gib``: the engine's cache, enough for the model's
    whole context).

    Returns:
        The engine's model info, the sampled ids, the engine's logprobs and the recomputed ones.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from openforge_inference.engines import create_engine
    from openforge_inference.engines.base import EngineConfig, GenerateRequest, SamplingOptions
    from openforge_inference.engines.transformers_engine import teacher_forced_logprobs

    config = EngineConfig(model_path=model_dir, kv_cache_gib=kv_cache_gib, max_num_seqs=4, threads=1)
    engine = create_engine(engine_name, config)

    async def generate() -> tuple[Any, list[int], list[float]]:
        await engine.start()
        try:
            info = await engine.model_info()
            tokens: list[int] = []
            logprobs: list[float] = []
            sampling = SamplingOptions(max_tokens=12, temperature=1.0, seed=3)
            async for delta in engine.generate(GenerateRequest("tiny", prompt_ids, sampling)):
                tokens += delta.token_ids
                logprobs += delta.logprobs
            return info, tokens, logprobs
        finally:
            await engine.close()

    info, tokens, logprobs = loop_thread.run(generate(), timeout=600)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    expected = teacher_forced_logprobs(model, prompt_ids, tokens, temperature=1.0, top_k=None, top_p=None)
    return info, tokens, logprobs, expected
