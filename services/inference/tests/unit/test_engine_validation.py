"""Request validation and shared engine bookkeeping (no model, no heavy dependencies)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from openforge_core.engine_names import ENGINE_NAMES
from openforge_core.errors import ErrorCode
from openforge_inference.engines import _REGISTRY, check_registry, create_engine
from openforge_inference.engines._common import WeightState
from openforge_inference.engines.base import (
    CheckpointError,
    ChecksumMismatch,
    DuplicateRequest,
    EngineConfig,
    EngineUnavailable,
    GenerateRequest,
    InvalidRequest,
    PolicyVersionTooOld,
    SamplingOptions,
    effective_temperature,
    validate_request,
)

VOCAB = 100
CONTEXT = 16


def _request(**sampling: object) -> GenerateRequest:
    return GenerateRequest("r", [1, 2, 3], SamplingOptions(**{"max_tokens": 4, **sampling}))  # type: ignore[arg-type]


def test_valid_request_passes() -> None:
    validate_request(_request(temperature=0.7, top_p=0.9, top_k=5, seed=1, top_logprobs=20), VOCAB, CONTEXT)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (GenerateRequest("", [1], SamplingOptions(max_tokens=1)), "request_id"),
        (GenerateRequest("r", [], SamplingOptions(max_tokens=1)), "prompt_token_ids"),
        (GenerateRequest("r", [1, VOCAB], SamplingOptions(max_tokens=1)), "prompt_token_ids"),
        (GenerateRequest("r", [-1], SamplingOptions(max_tokens=1)), "prompt_token_ids"),
        (GenerateRequest("r", [1] * CONTEXT, SamplingOptions(max_tokens=1)), "prompt_token_ids"),
        (GenerateRequest("r", [1], SamplingOptions(max_tokens=0)), "sampling.max_tokens"),
        (GenerateRequest("r", [1], SamplingOptions(max_tokens=1), -1), "min_policy_version"),
        (_request(temperature=-0.1), "sampling.temperature"),
        (_request(temperature=2.5), "sampling.temperature"),
        (_request(temperature=math.nan), "sampling.temperature"),
        (_request(top_p=0.0), "sampling.top_p"),
        (_request(top_p=1.5), "sampling.top_p"),
        (_request(top_k=-1), "sampling.top_k"),
        (_request(top_logprobs=21), "sampling.top_logprobs"),
        (_request(top_logprobs=-1), "sampling.top_logprobs"),
        (_request(seed=2**63), "sampling.seed"),
        (_request(stop_token_ids=(VOCAB,)), "sampling.stop_token_ids"),
    ],
)
def test_invalid_requests_name_the_field(request_: GenerateRequest, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_request(request_, VOCAB, CONTEXT)
    assert info.value.field_name == field
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    assert info.value.violations[0].field == field


def test_prompt_one_short_of_context_is_valid() -> None:
    validate_request(GenerateRequest("r", [1] * (CONTEXT - 1), SamplingOptions(max_tokens=9)), VOCAB, CONTEXT)


def test_effective_temperature_follows_vllm() -> None:
    assert effective_temperature(None) == 1.0
    assert effective_temperature(0.0) == 0.0
    assert effective_temperature(1e-6) == 0.0
    assert effective_temperature(0.001) == 0.01
    assert effective_temperature(0.7) == 0.7


def test_errors_map_to_grpc_codes() -> None:
    assert DuplicateRequest("x").code is ErrorCode.ALREADY_EXISTS
    assert EngineUnavailable("x").code is ErrorCode.UNAVAILABLE
    assert PolicyVersionTooOld("x").code is ErrorCode.FAILED_PRECONDITION
    assert CheckpointError("uri", "x").code is ErrorCode.INVALID_ARGUMENT
    assert ChecksumMismatch("x").code is ErrorCode.DATA_LOSS


def test_weight_state_idempotency() -> None:
    state = WeightState(version=3, uri="/ckpt/3", checksum="sha256:" + "a" * 64)
    assert state.is_noop("/elsewhere", 3, "sha256:" + "A" * 64)
    assert not state.is_noop("/ckpt/4", 4, "")
    with pytest.raises(CheckpointError) as info:
        state.is_noop("/ckpt/3", 3, "sha256:" + "b" * 64)
    assert info.value.field_name == "version"
    with pytest.raises(CheckpointError):
        state.is_noop("/ckpt/2", 2, "")
    no_checksum = dataclasses.replace(state, checksum="")
    assert no_checksum.is_noop("/ckpt/3", 3, "")


def test_registry_lists_engines_and_rejects_unknown(tmp_path: object) -> None:
    assert ENGINE_NAMES == ("scripted-oracle", "transformers", "vllm")
    with pytest.raises(ValueError, match="unknown engine"):
        create_engine("tgi", EngineConfig(model_path=tmp_path))  # type: ignore[arg-type]


def test_registry_registers_exactly_the_contracts_engine_names() -> None:
    check_registry(_REGISTRY)  # what the package checks at import
    with pytest.raises(RuntimeError, match=r"engine registry \['transformers', 'vllm'\] differs"):
        check_registry([k for k in _REGISTRY if k != "scripted-oracle"])
    with pytest.raises(RuntimeError, match="differs"):
        check_registry([*_REGISTRY, "tgi"])
