"""Weights streamed to inference (``PushWeights``) serve exactly as the same checkpoint read from
its path (``UpdateWeights``), through the trainer's client in both modes against the inference
service process (transformers engine); bad streams get the documented status, never INTERNAL,
and the previous weights keep serving; a server without ``PushWeights`` gets the file path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_inference.engines.transformers_engine import teacher_forced_logprobs
from openforge_inference.model_files import checkpoint_checksum
from openforge_inference.tiny_model import build_tiny_model, perturb_checkpoint
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer
from openforge_trainer.adapters.clients import InferenceClient

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


def _recompute(model_dir: Path, completion: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return teacher_forced_logprobs(model, PROMPT, completion, temperature=1.0)


async def _generate(stub: Any, seed: int) -> tuple[list[int], list[float], list[int]]:
    ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    sampling = common_pb2.SamplingParams(max_tokens=12, temperature=1.0, seed=seed)
    async for r in stub.Generate(inference_pb2.GenerateRequest(prompt_token_ids=PROMPT, sampling=sampling)):
        ids += r.token_ids
        logprobs += r.logprobs
        versions += r.policy_versions
    return ids, logprobs, versions


async def _messages(
    parts: Sequence[inference_pb2.PushWeightsRequest],
) -> AsyncIterator[inference_pb2.PushWeightsRequest]:
    for part in parts:
        yield part


def _header(
    version: int, files: list[tuple[str, int]], checksum: str = "", request_id: str = ""
) -> inference_pb2.PushWeightsRequest:
    header = inference_pb2.PushWeightsHeader(
        request_id=request_id or f"bad-{version}-{len(files)}",
        version=version,
        checksum=checksum,
        files=[inference_pb2.PushedFile(name=n, size=s) for n, s in files],
    )
    return inference_pb2.PushWeightsRequest(header=header)


def test_pushed_weights_serve_as_the_checkpoint_read_from_its_path(
    tmp_path: Path, nats_server: NatsServer, service_process: ServiceFactory
) -> None:
    model = build_tiny_model(tmp_path / "model", size="1m", seed=0)
    first = perturb_checkpoint(model, tmp_path / "first", seed=1, scale=0.5)
    second = perturb_checkpoint(model, tmp_path / "second", seed=2, scale=0.5)
    pushed = tmp_path / "pushed"
    svc = service_process(
        "openforge_inference",
        {
            "OPENFORGE_NATS__URL": nats_server.url,
            "OPENFORGE_MODEL_PATH": str(model),
            "OPENFORGE_ENGINE": "transformers",
            "OPENFORGE_MAX_MODEL_LEN": "256",
            "OPENFORGE_PUSH_DIR": str(pushed),
        },
    )
    size = (first / "model.safetensors").stat().st_size
    chunk = inference_pb2.PushWeightsRequest(chunk=b"\0" * (1 << 20))

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        streamed = InferenceClient(svc.address, timeout_s=60, weight_sync="stream", chunk_bytes=64 * 1024)
        by_path = InferenceClient(svc.address, timeout_s=60)
        async with open_channel(svc.address, default_timeout_s=60) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            # v1 streamed in many chunks, then a retry of the same request
            assert await streamed.update_weights("w/1", str(first), 1, checkpoint_checksum(first)) == 1
            assert await streamed.update_weights("w/1", str(first), 1, checkpoint_checksum(first)) == 1
            out["v1"] = await _generate(stub, seed=3)
            out["staged_v1"] = sorted(p.name for base in pushed.iterdir() for d in base.iterdir() for p in d.iterdir())
            # refusals: the documented codes (never INTERNAL, even with 8 MiB still being sent),
            # and v1 keeps serving
            refusals = {
                "no header": [chunk],
                "bad name": [_header(2, [("../m.safetensors", size)]), *[chunk] * 8],
                "bad request id": [_header(2, [("model.safetensors", size)], request_id=" x"), *[chunk] * 8],
                "short": [_header(2, [("model.safetensors", size)]), inference_pb2.PushWeightsRequest(chunk=b"x")],
                "old version": [_header(1, [("model.safetensors", 1)]), inference_pb2.PushWeightsRequest(chunk=b"x")],
            }
            out["codes"] = {}
            for name, parts in refusals.items():
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.PushWeights(_messages(parts))
                out["codes"][name] = refused.value.code()
            with pytest.raises(grpc.aio.AioRpcError) as corrupt:  # refused weights: no fall-back to the path
                await streamed.update_weights("w/2", str(second), 2, "sha256:" + "0" * 64)
            out["codes"]["checksum"] = corrupt.value.code()
            out["still_v1"] = await _generate(stub, seed=3)
            # v2 by path, then v3 streamed: the staged v1 folder is gone, v3's is the only one
            assert await by_path.update_weights("w/2", str(second), 2, checkpoint_checksum(second)) == 2
            assert await streamed.update_weights("w/3", str(first), 3, checkpoint_checksum(first)) == 3
            out["v3"] = await _generate(stub, seed=3)
            out["staged_v3"] = [list(base.iterdir()) for base in pushed.iterdir()]
        await streamed.close()
        await by_path.close()
        return out

    out = asyncio.run(run())
    ids, logprobs, versions = out["v1"]
    assert versions == [1] * len(ids)
    assert logprobs == pytest.approx(_recompute(first, ids), abs=1e-4)
    assert out["still_v1"] == out["v1"]
    assert out["staged_v1"] == ["model.safetensors"]
    assert out["codes"] == {
        "no header": grpc.StatusCode.INVALID_ARGUMENT,
        "bad name": grpc.StatusCode.INVALID_ARGUMENT,
        "bad request id": grpc.StatusCode.INVALID_ARGUMENT,
        "short": grpc.StatusCode.INVALID_ARGUMENT,
        "old version": grpc.StatusCode.INVALID_ARGUMENT,
        "checksum": grpc.StatusCode.DATA_LOSS,
    }
    v3_ids, v3_logprobs, v3_versions = out["v3"]
    assert v3_versions == [3] * len(v3_ids)
    assert (v3_ids, v3_logprobs) == (ids, logprobs)  # the same weights as v1, the same seed
    assert [len(folders) for folders in out["staged_v3"]] == [1]
    svc.stop()
    assert list(pushed.iterdir()) == []  # the service removed its staged checkpoints


@pytest.mark.parametrize("serves_push", [True, False])
def test_a_server_without_push_weights_gets_the_file_path(tmp_path: Path, serves_push: bool) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "a.safetensors").write_bytes(b"x" * 300_000)
    (checkpoint / "b.safetensors").write_bytes(b"y" * 5)
    (checkpoint / "config.json").write_text("{}")

    async def run() -> tuple[int, int, list[int]]:
        fake = ScriptedInferenceServer(build_fake_model_dir(tmp_path / "model"), policy_version=0)
        fake.serves_push_weights = serves_push
        port = await fake.start()
        client = InferenceClient(f"127.0.0.1:{port}", timeout_s=10, weight_sync="stream", chunk_bytes=4096)
        try:
            serving = await client.update_weights("w/4", str(checkpoint), 4, "")
            return serving, fake.policy_version, fake.pushed_bytes
        finally:
            await client.close()
            await fake.stop()

    # pushed: the safetensors files' bytes only; refused as UNIMPLEMENTED: UpdateWeights instead
    assert asyncio.run(run()) == (4, 4, [300_005] if serves_push else [])
