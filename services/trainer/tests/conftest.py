"""Fixtures of the trainer tests: a micro Qwen2 model built in place (random init, no hub), and
samples shaped like the store's.

Tests that need torch, transformers or verl skip with the reason when they are not installed
(``requirements/trainer-cpu.txt``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

HEAVY = ("torch", "transformers", "verl")


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # e.g. blocked with sys.modules[name] = None
        return True


MISSING = [m for m in HEAVY if _missing(m)]
SKIP_REASON = (
    f"needs {', '.join(MISSING)}: install requirements/trainer-cpu.txt "
    "(.venv/bin/python -m pip install --no-deps -r requirements/trainer-cpu.txt)"
)


@pytest.fixture(scope="session")
def heavy_stack() -> None:
    """Skips the test unless torch, transformers and verl import."""
    if MISSING:
        pytest.skip(SKIP_REASON)


def build_micro_model(out: Path, *, vocab: int = 64, seed: int = 0) -> Path:
    """A ~30k-parameter Qwen2 causal LM (2 layers, width 32) saved with ``save_pretrained``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "tokenizer_config.json").write_text('{"model_max_length": 512}\n')
    return out


@pytest.fixture(scope="session")
def micro_model_dir(heavy_stack: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro model, built once per session."""
    return build_micro_model(tmp_path_factory.mktemp("micro-lm"))


# ---- fakes of the trainer's collaborators (orchestrator, store, inference) ----

GOOD_TOKENS = frozenset(range(20, 28))
TOOL_TOKEN = 9


class FakeWorld:
    """A fake orchestrator + trajectory store + inference engine sharing one state.

    * ``submit`` (orchestrator ``SubmitRollouts``): idempotent per request id; runs every
      rollout of every group right away, in submission order, and completes the groups.
    * ``watch`` (store ``WatchCompletedGroups``): completed groups after a cursor, then new ones.
    * ``update_weights`` (inference ``UpdateWeights``): checks the checksum, serves the new
      version (and, with ``sample=True``, samples with those weights).

    With ``sample=True`` each rollout samples 2 tokens, gets one tool token (mask 0), samples 2
    more from the served model (temperature 1), and earns the fraction of its sampled tokens in
    ``GOOD_TOKENS`` (a task the micro model learns in a few steps). Otherwise responses are fixed
    tokens and every rollout of the n-th group created earns ``n / 100`` (so a step's mean
    reward names the group it trained on).

    Args:
        model_dir: Initial weights (version 0), for ``sample=True``.
        sample: Sample with the served model (needs torch).
        seed: Sampling seed.
    """

    def __init__(self, model_dir: Path | None = None, *, sample: bool = False, seed: int = 0) -> None:
        import asyncio

        self.version = 0
        self.checksum = ""
        self.sample = sample
        self.model_dir = model_dir
        self.requests: dict[str, list[str]] = {}
        self.submissions: list[tuple[str, int]] = []
        self.cancelled: list[tuple[str, str]] = []  # (group id, reason) of CancelGroup calls
        self.weight_updates: list[tuple[str, int]] = []
        self.watch_cursors: list[str] = []
        self.completed: dict[str, list[Any]] = {}
        self.changed = asyncio.Condition()
        self.limit: int | None = None
        self._seq = 0
        self._model: Any = None
        self._seed = seed
        self._gen: Any = None

    # orchestrator
    async def submit(self, request: Any) -> list[str]:
        self.submissions.append((request.request_id, request.min_policy_version))
        if request.request_id in self.requests:
            return self.requests[request.request_id]
        ids = []
        for task in request.task_ids:
            self._seq += 1
            gid = f"g{self._seq:04d}"
            ids.append(gid)
            group = await self._run_group(request.run_id, gid, task, request.group_size, self._seq)
            self.completed.setdefault(request.run_id, []).append(group)
        self.requests[request.request_id] = ids
        async with self.changed:
            self.changed.notify_all()
        return ids

    async def cancel_group(self, group_id: str, reason: str) -> None:
        self.cancelled.append((group_id, reason))

    async def _run_group(self, run_id: str, gid: str, task: str, n: int, seq: int) -> Any:
        import asyncio

        from openforge_trainer.domain.samples import CompletedGroup, TrainSample

        samples, rewards = [], {}
        for i in range(n):
            rid = f"{gid}-r{i}"
            prompt = (3, 4, 5, 10 + sum(map(ord, task)) % 7)
            if self.sample:
                response, mask, logprobs = await asyncio.to_thread(self._sample, prompt)
                sampled = [t for t, m in zip(response, mask, strict=True) if m]
                reward = sum(t in GOOD_TOKENS for t in sampled) / len(sampled)
            else:
                response, mask, logprobs = [11, 12, TOOL_TOKEN, 13], [1, 1, 0, 1], [-1.0, -1.5, 0.0, -2.0]
                reward = seq / 100
            rewards[rid] = reward
            samples.append(
                TrainSample(
                    sample_id=f"{rid}/0",
                    rollout_id=rid,
                    group_id=gid,
                    task_id=task,
                    prompt_ids=prompt,
                    response_ids=tuple(response),
                    loss_mask=tuple(mask),
                    behaviour_logprobs=tuple(logprobs),
                    policy_versions=tuple(self.version if m else 0 for m in mask),
                    reward=reward,
                )
            )
        return CompletedGroup(group_id=gid, task_id=task, rewards=rewards, samples=tuple(samples), cursor=f"c{seq}")

    def _sample(self, prompt: tuple[int, ...]) -> tuple[list[int], list[int], list[float]]:
        import torch
        from transformers import AutoModelForCausalLM

        if self._model is None:
            self._model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
            self._model.eval()
        if self._gen is None:
            self._gen = torch.Generator().manual_seed(self._seed)
        ids = list(prompt)
        response, mask, logprobs = [], [], []
        with torch.no_grad():
            for j in range(5):
                if j == 2:
                    ids.append(TOOL_TOKEN)
                    response.append(TOOL_TOKEN)
                    mask.append(0)
                    logprobs.append(0.0)
                    continue
                logits = self._model(input_ids=torch.tensor([ids])).logits[0, -1]
                logp = torch.log_softmax(logits.float(), -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self._gen))
                ids.append(tok)
                response.append(tok)
                mask.append(1)
                logprobs.append(float(logp[tok]))
        return response, mask, logprobs

    # store
    async def watch(self, run_id: str, cursor: str) -> Any:
        self.watch_cursors.append(cursor)
        after = int(cursor[1:]) if cursor else 0
        while True:
            fresh = [
                g
                for g in self.completed.get(run_id, [])
                if int(g.cursor[1:]) > after and (self.limit is None or int(g.cursor[1:]) <= self.limit)
            ]
            for g in fresh:
                after = int(g.cursor[1:])
                yield g
            if not fresh:
                async with self.changed:
                    await self.changed.wait()

    # inference
    async def update_weights(self, request_id: str, uri: str, version: int, checksum: str) -> int:
        from openforge_trainer.adapters.storage import checkpoint_checksum

        if checkpoint_checksum(Path(uri)) != checksum:
            raise ValueError("checksum mismatch")
        if version == self.version and checksum == self.checksum:
            return self.version
        if version <= self.version:
            raise ValueError(f"version {version} is not newer than {self.version}")
        self.weight_updates.append((uri, version))
        self.version, self.checksum = version, checksum
        if self.sample:
            self.model_dir = Path(uri)
            self._model = None
        return version

    async def serving_version(self) -> int:
        return self.version

    async def release(self) -> None:
        """Lifts ``limit`` (the highest group sequence the store streams)."""
        self.limit = None
        async with self.changed:
            self.changed.notify_all()


@pytest.fixture
def fake_world_factory() -> Any:
    """``make(model_dir=None, sample=False, seed=0) -> FakeWorld``."""
    return FakeWorld
