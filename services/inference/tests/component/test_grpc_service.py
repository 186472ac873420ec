"""The inference service as a process, through gRPC, on both engines.

* Parity: for a prompt and the tokens the service sampled, the logprobs it reports equal a
  teacher-forced recompute with plain transformers (fp32 on CPU) within ``TOLERANCE`` — the
  property that makes importance ratios in training meaningful. The tolerance and why it holds
  are in ``test_engines.py``.
* Weight updates while 8 streams are in flight: none is dropped, versions on tokens never go
  back, and after the update the logprobs match a recompute on the new checkpoint.
* Bad input and bad checkpoints answer with the documented status codes and details; the old
  weights keep serving.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer

TOLERANCE = 1e-4  # nats; fp32 CPU, see test_engines.py


def _recompute(model_dir: Path, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    from openforge_inference.engines.transformers_engine import teacher_forced_logprobs

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    return teacher_forced_logprobs(model, prompt, completion, temperature=temperature)


async def _generate(stub: Any, prompt: list[int], max_tokens: int, seed: int, rid: str) -> dict[str, Any]:
    ids: list[int] = []
    lps: list[float] = []
    versions: list[int] = []
    finish = 0
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)
    async for r in stub.Generate(
        inference_pb2.GenerateRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling)
    ):
        ids += r.token_ids
        lps += r.logprobs
        versions += r.policy_versions
        finish = r.finish_reason or finish
    return {"ids": ids, "logprobs": lps, "versions": versions, "finish": finish}


@pytest.fixture(params=["transformers", "vllm"])
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (requirements/inference-cpu.txt)")
    return str(request.param)


def test_generate_parity_update_and_errors_through_grpc(
    engine: str,
    tiny_model_dir: Path,
    checkpoint_factory: Any,
    nats_server: NatsServer,
    service_process: ServiceFactory,
) -> None:
    from openforge_inference.model_files import checkpoint_checksum

    svc = service_process(
        "openforge_inference",
        {
            "OPENFORGE_NATS__URL": nats_server.url,
            "OPENFORGE_MODEL_PATH": str(tiny_model_dir),
            "OPENFORGE_ENGINE": engine,
            "OPENFORGE_MAX_MODEL_LEN": "512",
            "OPENFORGE_KV_CACHE_GIB": "1",
        },
        timeout_s=300,  # vLLM's engine start takes 30-90 s on two busy cores
    )
    new_ckpt = checkpoint_factory(7)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]

    async def run() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        async with open_channel(svc.address, default_timeout_s=120) as ch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
            assert (info.engine, info.policy_version, info.context_length) == (engine, 0, 512)
            before = await _generate(stub, prompt, 24, seed=1, rid="before")

            # Bad input: a token outside the vocabulary names the field.
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await _generate(stub, [info.vocab_size + 5], 4, seed=1, rid="bad")
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            status = rpc_status.from_call(bad.value)  # type: ignore[arg-type]
            assert status is not None
            fields = []
            for d in status.details:
                if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                    br = error_details_pb2.BadRequest()
                    d.Unpack(br)
                    fields += [v.field for v in br.field_violations]
            assert fields == ["prompt_token_ids"]

            # A bad checksum is refused and version 0 keeps serving.
            with pytest.raises(grpc.aio.AioRpcError) as loss:
                await stub.UpdateWeights(
                    inference_pb2.UpdateWeightsRequest(uri=str(new_ckpt), version=1, checksum="sha256:" + "0" * 64)
                )
            assert loss.value.code() == grpc.StatusCode.DATA_LOSS
            assert (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest())).policy_version == 0

            # 8 streams in flight while the weights change.
            streams = [asyncio.create_task(_generate(stub, prompt, 48, seed=10 + i, rid=f"s{i}")) for i in range(8)]
            await asyncio.sleep(0.3)
            update = inference_pb2.UpdateWeightsRequest(
                request_id="u1", uri=new_ckpt.as_uri(), version=1, checksum=checkpoint_checksum(new_ckpt)
            )
            resp = await stub.UpdateWeights(update)
            assert resp.version == 1
            again = await stub.UpdateWeights(update)  # an idempotent retry
            assert again.version == 1
            in_flight = await asyncio.gather(*streams)
            after = await _generate(stub, prompt, 24, seed=2, rid="after")
            return before, in_flight, after

    before, in_flight, after = asyncio.run(run())
    assert len(before["ids"]) == 24 and before["versions"] == [0] * 24
    assert before["logprobs"] == pytest.approx(_recompute(tiny_model_dir, prompt, before["ids"], 1.0), abs=TOLERANCE)
    for s in in_flight:
        assert s["finish"] in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
        assert s["ids"] and len(s["ids"]) == len(s["logprobs"]) == len(s["versions"])
        assert s["versions"] == sorted(s["versions"]) and set(s["versions"]) <= {0, 1}
    assert after["versions"] == [1] * len(after["ids"])
    assert after["logprobs"] == pytest.approx(_recompute(new_ckpt, prompt, after["ids"], 1.0), abs=TOLERANCE)
