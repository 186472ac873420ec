"""The llama3 tiny model: a random-init ``LlamaForCausalLM`` whose tokenizer carries Llama 3's
special tokens as single ids, whose template the proxy detects as the llama3 family (the one
template the test fakes use too), and which the transformers reference engine serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_serving import serve_and_recompute

from openforge_core.chat_formats import LLAMA3_END_TOKENS, LLAMA3_SPECIAL_TOKENS, LLAMA3_TEMPLATE
from openforge_inference.tiny_model import FAMILIES, SIZES, build_tiny_model, main

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
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama3"), size="1m", seed=0, family="llama3")


@pytest.fixture(scope="module")
def tokenizer(llama_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llama_dir))


def test_llama_architecture_and_end_ids(llama_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    config = json.loads((llama_dir / "config.json").read_text())
    generation = json.loads((llama_dir / "generation_config.json").read_text())
    end_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")]
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == SIZES["1m"].vocab_size
    assert config["rope_parameters"]["rope_type"] == "llama3"
    assert config["eos_token_id"] == end_ids
    assert generation["eos_token_id"] == end_ids
    bos = tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert config["bos_token_id"] == generation["bos_token_id"] == bos
    model = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32)
    assert isinstance(model, LlamaForCausalLM)
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6


def test_special_tokens_are_single_ids(tokenizer: Any) -> None:
    assert len(tokenizer) == SIZES["1m"].vocab_size
    for i, token in enumerate(LLAMA3_SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == i
        assert tokenizer.encode(token, add_special_tokens=False) == [i]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert tokenizer.pad_token == "<|finetune_right_pad_id|>"
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1).startswith("<|reserved_special_token_")
    text = '<|python_tag|>{"name": "exec", "parameters": {"command": "ls"}}<|eom_id|>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 6 and ids[-1] == 5
    assert tokenizer.decode(ids) == text


def test_template_is_the_shared_llama3_one_and_the_proxy_detects_it(llama_dir: Path, tokenizer: Any) -> None:
    from openforge_proxy.domain.families import family_for
    from openforge_testing.fakes import TEMPLATES

    template = (llama_dir / "chat_template.jinja").read_text()
    assert template == LLAMA3_TEMPLATE == TEMPLATES["llama3"]
    family = family_for("auto", template)
    assert family.name == "llama3"
    assert set(family.end_tokens) <= set(LLAMA3_END_TOKENS)
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython")
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n18C rain<|eot_id|>" in text


@pytest.mark.parametrize("engine_name", ["transformers", pytest.param("vllm", marks=pytest.mark.slow)])
def test_engine_serves_it(engine_name: str, llama_dir: Path, tokenizer: Any, loop_thread: Any) -> None:
    """The reference engine, and vLLM's CPU build (about a minute to start on two cores)."""
    if engine_name == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (requirements/inference-cpu.txt)")
    prompt = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    info, tokens, logprobs, expected = serve_and_recompute(engine_name, llama_dir, prompt_ids, loop_thread)
    assert set(info.eos_token_ids) == {tokenizer.convert_tokens_to_ids(t) for t in LLAMA3_END_TOKENS}
    assert 1 <= len(tokens) <= 12
    assert all(0 <= t < len(tokenizer) for t in tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) <= 1e-4


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    known = r"\['deepseek_v31', 'glm45', 'llama3', 'mistral', 'qwen'\]"
    with pytest.raises(ValueError, match=r"unknown tiny model family 'gpt-oss'; expected one of " + known):
        build_tiny_model(tmp_path, family="gpt-oss")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--family", "gpt-oss"])
    assert exc.value.code == 2
    assert not any(tmp_path.iterdir())


def test_cli_names_the_builders_families() -> None:
    from openforge_cli.model import TINY_FAMILIES

    assert set(TINY_FAMILIES) == set(FAMILIES)
    assert TINY_FAMILIES[0] == "qwen"
