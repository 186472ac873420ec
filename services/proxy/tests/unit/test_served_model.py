"""What the proxy serves with, for the run manifest: the tokenizer.json bytes' and the chat
template's hashes (inference's definitions) and the family's parsers; ``CreateSession`` returns
them once the model is loaded and never waits for it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, cast

import pytest

from openforge.proxy.v1 import proxy_pb2
from openforge_core.errors import FailedPrecondition
from openforge_core.manifest import ServedModel
from openforge_proxy.adapters.inference import GrpcEngine
from openforge_proxy.app import ModelLoader
from openforge_proxy.domain.engine import ModelInfo
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.sessions import SessionRegistry
from openforge_proxy.servicer import ProxyServicer
from openforge_proxy.settings import ProxySettings
from openforge_testing.fakes import build_fake_model_dir

PARSERS = ("family:hermes", "tool_call:hermes", "reasoning:hermes")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def info(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    model = build_fake_model_dir(tmp_path_factory.mktemp("model"))
    template = (model / "chat_template.jinja").read_text()
    return ModelInfo(
        model_path=str(model),
        model_name="m",
        chat_template=template,
        chat_template_hash=_sha256(template.encode()),
        tokenizer_hash=_sha256((model / "tokenizer.json").read_bytes()),
        eos_token_ids=(json.loads((model / "config.json").read_text())["eos_token_id"],),
        context_length=1 << 20,
    )


def test_the_runtime_reports_the_hashes_inference_reports_and_its_parsers(info: ModelInfo) -> None:
    served = ModelRuntime.load(info).served
    assert served == ServedModel(info.tokenizer_hash, info.chat_template_hash, PARSERS)


def test_a_tokenizer_other_than_inferences_is_refused(info: ModelInfo, tmp_path: Path) -> None:
    other = build_fake_model_dir(tmp_path / "other", vocab_size=512)
    with pytest.raises(FailedPrecondition) as err:
        ModelRuntime.load(info, model_dir=other)
    assert err.value.reason == "TOKENIZER_MISMATCH"
    unchecked = ModelRuntime.load(info, model_dir=other, check_hash=False)
    # the manifest gets the tokenizer the proxy really tokenizes with
    assert unchecked.served.tokenizer_hash == _sha256((other / "tokenizer.json").read_bytes())


def test_a_template_of_no_known_family_is_refused_naming_what_it_lacks(info: ModelInfo) -> None:
    harmony = "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    with pytest.raises(FailedPrecondition) as err:
        ModelRuntime.load(dataclasses.replace(info, chat_template=harmony))
    assert err.value.reason == "BAD_FAMILY"
    assert "hermes needs <|im_start|>, <tool_call>" in err.value.message
    assert "llama3 needs <|start_header_id|>, <|end_header_id|>, <|eot_id|>, tool_calls" in err.value.message
    assert "glm45 needs <|user|>, <|assistant|>, <|observation|>, <tool_call>, <arg_key>" in err.value.message
    assert "mistral needs [INST]" in err.value.message
    assert "deepseek_v31 needs <｜User｜>, <｜Assistant｜>, <｜tool▁calls▁begin｜>" in err.value.message
    with pytest.raises(FailedPrecondition, match="unknown model family 'gpt-oss'"):
        ModelRuntime.load(info, family="gpt-oss")


class _Engine:
    def __init__(self, info: ModelInfo) -> None:
        self.info = info

    async def model_info(self) -> ModelInfo:
        return self.info


async def test_create_session_returns_the_served_model_once_loaded(info: ModelInfo) -> None:
    loader = ModelLoader(cast(GrpcEngine, _Engine(info)), ProxySettings())
    servicer = ProxyServicer(SessionRegistry(3600, 10), loader.served)
    context: Any = None

    def create(rollout_id: str) -> proxy_pb2.CreateSessionRequest:
        return proxy_pb2.CreateSessionRequest(request_id=rollout_id, rollout_id=rollout_id, run_id="run")

    before = await servicer.CreateSession(create("r1"), context)
    assert before.api_key and not before.HasField("served_model")  # not loaded: not waited for
    await loader()
    after = await servicer.CreateSession(create("r2"), context)
    assert after.served_model == proxy_pb2.ServedModel(
        tokenizer_hash=info.tokenizer_hash, chat_template_hash=info.chat_template_hash, parsers=list(PARSERS)
    )
