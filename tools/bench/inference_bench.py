"""Inference engine benchmark: time to first token, decode speed and weight-update latency.

Builds the 10m tiny model (or uses ``--model``), starts an engine in process (vLLM by default)
and, for 1, 8 and 32 concurrent streams, measures:

- TTFT: seconds from calling ``generate`` to the first delta carrying a token (p50, p95);
- decode tok/s per stream: ``(n - 1) / (t_last - t_first)`` for a stream of n tokens (mean);
- aggregate tok/s: all completion tokens / wall time of the whole batch;

then the latency of ``update_weights`` (validation with checksum + in-place reload + resume),
idle and with 8 streams in flight.

Usage (after installing requirements/inference-cpu.txt)::

    python tools/bench/inference_bench.py                    # vLLM, 10m model
    python tools/bench/inference_bench.py --engine transformers --concurrency 1 8

A random-init model samples EOS now and then, so a stream may end before ``--max-tokens``;
the table reports the tokens actually decoded.

Every measurement is made twice in the same run: calling the engine directly, and through our
gRPC service wrapping the same engine (:func:`grpc_generate`); the ratio is the overhead of our
layer (target: at most 10% on decode time at 8 streams).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_core.rpc.server import GrpcServer
from openforge_core.settings import GrpcServerSettings
from openforge_inference.engines import create_engine
from openforge_inference.engines.base import (
    Engine,
    EngineConfig,
    GenerateDelta,
    GenerateRequest,
    SamplingOptions,
)
from openforge_inference.model_files import checkpoint_checksum
from openforge_inference.servicer import InferenceServicer
from openforge_inference.tiny_model import SPECIAL_TOKENS, build_tiny_model, perturb_checkpoint

#: A ``generate`` callable: the engine's own, or a client's with the same contract.
GenerateFn = Callable[[GenerateRequest], AsyncIterator[GenerateDelta]]


@dataclasses.dataclass(frozen=True)
class StreamStats:
    """Results of one batch of concurrent streams.

    Attributes:
        concurrency: Streams started together.
        ttft_p50_s: Median time to first token, seconds.
        ttft_p95_s: 95th percentile time to first token, seconds.
        decode_tok_s: Mean per-stream decode speed, tokens/s (after the first token).
        aggregate_tok_s: All completion tokens / batch wall time, tokens/s.
        tokens: Completion tokens decoded in total.
        wall_s: Batch wall time, seconds.
    """

    concurrency: int
    ttft_p50_s: float
    ttft_p95_s: float
    decode_tok_s: float
    aggregate_tok_s: float
    tokens: int
    wall_s: float


async def _one_stream(generate: GenerateFn, request: GenerateRequest) -> tuple[float, float, float, int]:
    """Returns (call time, first-token time, last-token time, tokens) for one stream."""
    start = time.perf_counter()
    first = last = start
    n = 0
    async for delta in generate(request):
        if delta.token_ids:
            now = time.perf_counter()
            if n == 0:
                first = now
            last = now
            n += len(delta.token_ids)
    return start, first, last, n


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure_streams(
    generate: GenerateFn,
    *,
    concurrency: int,
    prompt_len: int,
    max_tokens: int,
    vocab: int,
    tag: str,
) -> StreamStats:
    """Runs ``concurrency`` streams at once through ``generate`` and summarises them.

    Args:
        generate: The engine's ``generate`` or any callable with its contract.
        concurrency: Streams started together.
        prompt_len: Prompt tokens per stream (random ids, distinct per stream so no prefix
            cache hits).
        max_tokens: Tokens to sample per stream (fewer if EOS is sampled).
        vocab: Vocabulary size (prompt ids are drawn from the non-special ones).
        tag: Prefix of the request ids.

    Returns:
        The batch's statistics.
    """
    rng = random.Random(concurrency)
    low = len(SPECIAL_TOKENS)
    requests = [
        GenerateRequest(
            f"{tag}-{concurrency}-{i}",
            [rng.randrange(low, vocab) for _ in range(prompt_len)],
            SamplingOptions(max_tokens=max_tokens, temperature=1.0, seed=i),
        )
        for i in range(concurrency)
    ]
    began = time.perf_counter()
    results = await asyncio.gather(*(_one_stream(generate, r) for r in requests))
    wall = time.perf_counter() - began
    ttfts = [first - start for start, first, _, n in results if n]
    rates = [(n - 1) / (last - first) for _, first, last, n in results if n > 1 and last > first]
    tokens = sum(n for *_, n in results)
    return StreamStats(
        concurrency=concurrency,
        ttft_p50_s=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p95_s=_percentile(ttfts, 0.95) if ttfts else float("nan"),
        decode_tok_s=statistics.fmean(rates) if rates else float("nan"),
        aggregate_tok_s=tokens / wall if wall > 0 else float("nan"),
        tokens=tokens,
        wall_s=wall,
    )


def grpc_generate(stub: Any) -> GenerateFn:
    """A ``generate`` callable going through ``InferenceService.Generate`` (the service's own
    servicer and interceptors, over a real gRPC channel)."""

    async def generate(request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        s = request.sampling
        sampling = common_pb2.SamplingParams(max_tokens=s.max_tokens, top_logprobs=s.top_logprobs)
        if s.temperature is not None:
            sampling.temperature = s.temperature
        if s.seed is not None:
            sampling.seed = s.seed
        call = stub.Generate(
            inference_pb2.GenerateRequest(
                request_id=request.request_id, prompt_token_ids=request.prompt_token_ids, sampling=sampling
            )
        )
        async for r in call:
            yield GenerateDelta(tuple(r.token_ids), tuple(r.logprobs), tuple(r.policy_versions))

    return generate


async def measure_updates(
    engine: Engine, checkpoints: list[Path], *, repeats: int, vocab: int, in_flight: int
) -> list[float]:
    """Times ``update_weights`` (checksum checked) ``repeats`` times, alternating checkpoints.

    Args:
        engine: A started engine.
        checkpoints: Checkpoint directories to alternate between.
        repeats: Updates to time.
        vocab: Vocabulary size, for the background streams.
        in_flight: Streams kept decoding during each update (0 = idle engine).

    Returns:
        Seconds per update, as the engine reported them.
    """
    durations: list[float] = []
    version = (await engine.model_info()).policy_version
    sums = {c: checkpoint_checksum(c) for c in checkpoints}
    for i in range(repeats):
        background: asyncio.Task[StreamStats] | None = None
        if in_flight:
            background = asyncio.create_task(
                measure_streams(
                    engine.generate,
                    concurrency=in_flight,
                    prompt_len=32,
                    max_tokens=64,
                    vocab=vocab,
                    tag=f"bg{i}",
                )
            )
            await asyncio.sleep(0.2)
        target = checkpoints[i % len(checkpoints)]
        version += 1
        took = await engine.update_weights(str(target), version, sums[target])
        durations.append(took.total_seconds())
        if background is not None:
            await background
    return durations


def _median(stats: list[StreamStats]) -> StreamStats:
    """Field-wise median of repeated measurements of one cell."""
    return StreamStats(
        concurrency=stats[0].concurrency,
        ttft_p50_s=statistics.median(s.ttft_p50_s for s in stats),
        ttft_p95_s=statistics.median(s.ttft_p95_s for s in stats),
        decode_tok_s=statistics.median(s.decode_tok_s for s in stats),
        aggregate_tok_s=statistics.median(s.aggregate_tok_s for s in stats),
        tokens=round(statistics.median(s.tokens for s in stats)),
        wall_s=statistics.median(s.wall_s for s in stats),
    )


def _table(title: str, stats: list[StreamStats]) -> str:
    head = (
        f"{'streams':>7} | {'TTFT p50 s':>10} | {'TTFT p95 s':>10} | "
        f"{'decode tok/s/stream':>19} | {'aggregate tok/s':>15} | {'tokens':>6} | {'wall s':>7}"
    )
    lines = [title, head, "-" * len(head)]
    for s in stats:
        lines.append(
            f"{s.concurrency:>7} | {s.ttft_p50_s:>10.4f} | {s.ttft_p95_s:>10.4f} | "
            f"{s.decode_tok_s:>19.1f} | {s.aggregate_tok_s:>15.1f} | {s.tokens:>6} | {s.wall_s:>7.2f}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    """Builds the model if needed, starts the engine, runs every measurement, prints tables."""
    work = Path(tempfile.mkdtemp(prefix="openforge-bench-"))
    model = Path(args.model) if args.model else build_tiny_model(work / "model", size=args.size)
    checkpoints = [perturb_checkpoint(model, work / f"ckpt{i}", seed=i) for i in (1, 2)]
    engine = create_engine(
        args.engine,
        EngineConfig(model_path=model, max_num_seqs=max(args.concurrency), kv_cache_gib=args.kv_gib),
    )
    started = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - started
    info = await engine.model_info()
    try:
        # Warm-up (first-call allocations), not reported.
        await measure_streams(
            engine.generate, concurrency=1, prompt_len=8, max_tokens=4, vocab=info.vocab_size, tag="w"
        )
        # The same engine served by our gRPC service (servicer, interceptors, health) on a free port.
        servicer = InferenceServicer(engine)
        server = GrpcServer(
            GrpcServerSettings(port=0),
            [inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name],
            [lambda srv: inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, srv)],
        )
        port = await server.start()
        channel = open_channel(f"127.0.0.1:{port}", stream_timeout_s=600)
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        columns: list[tuple[str, GenerateFn]] = [
            (f"{args.engine} direct", engine.generate),
            (f"{args.engine} through our gRPC service", grpc_generate(stub)),
        ]
        # Interleaved rounds (direct, gRPC, direct, gRPC, ...) so drift in machine load hits both
        # columns alike; each cell is the median over the rounds.
        runs: dict[tuple[str, int], list[StreamStats]] = {}
        for r in range(args.rounds):
            for c in args.concurrency:
                for name, generate in columns:
                    runs.setdefault((name, c), []).append(
                        await measure_streams(
                            generate,
                            concurrency=c,
                            prompt_len=args.prompt_len,
                            max_tokens=args.max_tokens,
                            vocab=info.vocab_size,
                            tag=f"{name.split()[-1]}{r}",
                        )
                    )
        results = {name: [_median(runs[(name, c)]) for c in args.concurrency] for name, _ in columns}
        for name, _ in columns:
            title = (
                f"\n[{name}] model {args.model or 'tiny ' + args.size}, prompt {args.prompt_len} tokens, "
                f"max_tokens {args.max_tokens}, median of {args.rounds} rounds, engine start {startup:.1f} s"
            )
            print(_table(title, results[name]))
        direct, through = (results[name] for name, _ in columns)
        print("\ngRPC overhead (through / direct): decode time per token, and TTFT p50")
        for d, g in zip(direct, through, strict=True):
            print(
                f"  {d.concurrency:>3} streams: decode x{d.decode_tok_s / g.decode_tok_s:.3f}  "
                f"TTFT x{g.ttft_p50_s / d.ttft_p50_s:.3f}"
            )
        await channel.close()
        await server.stop()
        idle = await measure_updates(
            engine, checkpoints, repeats=args.update_repeats, vocab=info.vocab_size, in_flight=0
        )
        busy = await measure_updates(
            engine, checkpoints, repeats=args.update_repeats, vocab=info.vocab_size, in_flight=8
        )
        print("\nupdate_weights latency (validation incl. sha256 + in-place load + resume), seconds")
        for label, values in (("idle", idle), ("8 streams in flight", busy)):
            print(
                f"  {label:<20} mean {statistics.fmean(values):.3f}  min {min(values):.3f}"
                f"  max {max(values):.3f}  (n={len(values)})"
            )
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--size", default="10m", choices=["1m", "10m", "50m"])
    parser.add_argument("--model", default="", help="use this model directory instead")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--update-repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell (median)")
    parser.add_argument("--kv-gib", type=float, default=1.0, help="vLLM CPU KV cache, GiB")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":  # vLLM on CPU spawns its engine core: keep this guard
    sys.exit(main())
