"""The tiny model builder: loadable with the real HF paths, a chat template that renders tools,
tool calls, tool results and reasoning, and deterministic output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openforge_inference.tiny_model import SIZES, SPECIAL_TOKENS, main

pytest.importorskip("transformers", reason="needs transformers (requirements/inference-cpu.txt)")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "reasoning_content": "I need the tool twice.",
        "content": "",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "18C rain"},
    {"role": "tool", "tool_call_id": "b", "content": "25C sun"},
    {"role": "assistant", "content": "Paris: 18C, Rome: 25C."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_config_and_weights_load(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((tiny_model_dir / "config.json").read_text())
    spec = SIZES["1m"]
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["vocab_size"] == spec.vocab_size
    assert config["tie_word_embeddings"] is True
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]


def test_tokenizer_vocab_and_special_tokens(tokenizer: Any) -> None:
    assert len(tokenizer) == SIZES["1m"].vocab_size
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == i
        assert tokenizer.encode(token, add_special_tokens=False) == [i]
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    text = 'def f(x):\n    return {"a": x}  # héllo ✓'
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # every id decodes (reserved padding tokens included)
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1).startswith("<|reserved_")


def test_chat_template_renders_tools_calls_results_and_reasoning(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        "<|im_start|>assistant\n<think>\nI need the tool twice.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\n18C rain\n</tool_response>\n"
        "<tool_response>\n25C sun\n</tool_response><|im_end|>\n"
    ) in text
    assert "<|im_start|>user\nThanks!<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    no_think = tokenizer.apply_chat_template(
        CONVERSATION[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert no_think.startswith("<|im_start|>system\nYou are helpful.<|im_end|>\n")


def test_rendering_extends_the_previous_turns(tokenizer: Any) -> None:
    """Prompt of turn k + the assistant reply == prefix of the prompt of turn k+1 (what token-exact
    splicing relies on), in token ids."""
    for k in (2, 5):
        prompt = tokenizer.apply_chat_template(
            CONVERSATION[:k], tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        longer = tokenizer.apply_chat_template(CONVERSATION[: k + 2], tools=TOOLS, tokenize=False)
        assert longer.startswith(prompt)


def test_cli_build_is_deterministic(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert main(["--size", "1m", "--out", str(tmp_path), "--seed", "0"]) == 0
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja", "config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_the_cli_and_the_train_config_name_the_builders_sizes() -> None:
    from typing import get_args

    from openforge_cli.model import TINY_SIZES
    from openforge_cli.train_config import ModelSpec

    assert list(TINY_SIZES) == list(SIZES)
    literal, none = get_args(ModelSpec.model_fields["init_tiny"].annotation)
    assert (get_args(literal), none) == (TINY_SIZES, type(None))


@pytest.mark.parametrize(("size", "low", "high"), [("1m", 0.9e6, 1.1e6), ("300m", 250e6, 330e6)])
def test_a_size_is_named_for_its_parameter_count(size: str, low: float, high: float) -> None:
    s = SIZES[size]
    head_dim = s.hidden_size // s.num_attention_heads
    attention = 2 * s.hidden_size * s.hidden_size + 2 * s.hidden_size * s.num_key_value_heads * head_dim
    layer = attention + 3 * s.hidden_size * s.intermediate_size
    assert low < s.vocab_size * s.hidden_size + s.num_hidden_layers * layer < high
