"""The mistral tiny model: a random-init ``MistralForCausalLM`` whose tokenizer carries Mistral's
control tokens as single ids and whose template the proxy detects as the mistral family (the
one template the test fakes use too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openforge_core.chat_formats import MISTRAL_END_TOKENS, MISTRAL_SPECIAL_TOKENS, MISTRAL_TEMPLATE
from openforge_inference.tiny_model import SIZES, build_tiny_model

pytest.importorskip("torch", reason="needs torch (requirements/inference-cpu.txt)")
pytest.importorskip("transformers", reason="needs transformers (requirements/inference-cpu.txt)")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
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
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "18C rain"},
    {"role": "assistant", "content": "Paris: 18C."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-mistral"), size="1m", seed=0, family="mistral")


@pytest.fixture(scope="module")
def tokenizer(mistral_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(mistral_dir))


def test_mistral_architecture_and_end_id(mistral_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, MistralForCausalLM

    config = json.loads((mistral_dir / "config.json").read_text())
    generation = json.loads((mistral_dir / "generation_config.json").read_text())
    eos = tokenizer.convert_tokens_to_ids("</s>")
    assert config["architectures"] == ["MistralForCausalLM"]
    assert config["vocab_size"] == SIZES["1m"].vocab_size
    assert config["tie_word_embeddings"] is False
    assert config["eos_token_id"] == eos and generation["eos_token_id"] == [eos]
    assert config["bos_token_id"] == tokenizer.convert_tokens_to_ids("<s>")
    model = AutoModelForCausalLM.from_pretrained(str(mistral_dir), dtype=torch.float32)
    assert isinstance(model, MistralForCausalLM)


def test_control_tokens_are_single_ids_and_the_proxy_detects_the_template(mistral_dir: Path, tokenizer: Any) -> None:
    from openforge_proxy.domain.families import family_for
    from openforge_testing.fakes import TEMPLATES

    assert len(tokenizer) == SIZES["1m"].vocab_size
    for i, token in enumerate(MISTRAL_SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == i
        assert tokenizer.encode(token, add_special_tokens=False) == [i]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1).startswith("<SPECIAL_")
    template = (mistral_dir / "chat_template.jinja").read_text()
    assert template == MISTRAL_TEMPLATE == TEMPLATES["mistral"]
    family = family_for("auto", template)
    assert family.name == "mistral" and family.end_tokens == MISTRAL_END_TOKENS
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<s>[SYSTEM_PROMPT]You are helpful.[/SYSTEM_PROMPT][AVAILABLE_TOOLS][{")
    assert text.endswith(
        '[INST]Weather in Paris?[/INST][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'
        "[TOOL_RESULTS]18C rain[/TOOL_RESULTS]Paris: 18C.</s>[INST]Thanks![/INST]"
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
