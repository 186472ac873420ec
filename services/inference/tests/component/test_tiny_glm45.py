"""The glm45 tiny model: a random-init ``Glm4MoeForCausalLM`` (a dense first layer, then
mixture-of-experts layers) whose tokenizer carries GLM-4.5's special tokens as single ids, whose
template the proxy detects as the glm45 family (the one template the test fakes use too), and
which the transformers reference engine serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_serving import CONVERSATION, TOOLS, serve_and_recompute

from openforge_core.chat_formats import GLM45_END_TOKENS, GLM45_SPECIAL_TOKENS, GLM45_TEMPLATE
from openforge_inference.tiny_model import SIZES, build_tiny_model

pytest.importorskip("torch", reason="needs torch (requirements/inference-cpu.txt)")
pytest.importorskip("transformers", reason="needs transformers (requirements/inference-cpu.txt)")


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-glm45"), size="1m", seed=0, family="glm45")


@pytest.fixture(scope="module")
def tokenizer(glm_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(glm_dir))


def test_glm4_moe_architecture_and_end_ids(glm_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Glm4MoeForCausalLM

    config = json.loads((glm_dir / "config.json").read_text())
    generation = json.loads((glm_dir / "generation_config.json").read_text())
    end_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|user|>", "<|observation|>", "<|endoftext|>")]
    assert config["architectures"] == ["Glm4MoeForCausalLM"]
    assert config["vocab_size"] == SIZES["1m"].vocab_size
    assert (config["first_k_dense_replace"], config["n_routed_experts"], config["num_experts_per_tok"]) == (1, 4, 2)
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.5
    # as GLM-4.5's config: an output layer of its own and head_dim written out (vLLM reads both)
    assert config["tie_word_embeddings"] is False
    assert config["head_dim"] == 64
    assert config["eos_token_id"] == generation["eos_token_id"] == end_ids
    model = AutoModelForCausalLM.from_pretrained(str(glm_dir), dtype=torch.float32)
    assert isinstance(model, Glm4MoeForCausalLM)
    assert 1.2e6 < sum(p.numel() for p in model.parameters()) < 1.5e6


def test_special_tokens_are_single_ids(tokenizer: Any) -> None:
    assert len(tokenizer) == SIZES["1m"].vocab_size
    for i, token in enumerate(GLM45_SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == i
        assert tokenizer.encode(token, add_special_tokens=False) == [i]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (None, "<|endoftext|>", "<|endoftext|>")
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1).startswith("<|reserved_")
    text = "<tool_call>exec\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call><|observation|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == GLM45_SPECIAL_TOKENS.index("<tool_call>")
    assert ids[-1] == GLM45_SPECIAL_TOKENS.index("<|observation|>")
    assert tokenizer.decode(ids) == text


def test_template_is_the_shared_glm45_one_and_the_proxy_detects_it(glm_dir: Path, tokenizer: Any) -> None:
    from openforge_proxy.domain.families import family_for
    from openforge_testing.fakes import TEMPLATES

    template = (glm_dir / "chat_template.jinja").read_text()
    assert template == GLM45_TEMPLATE == TEMPLATES["glm45"]
    family = family_for("auto", template)
    assert family.name == "glm45"
    assert family.end_tokens == GLM45_END_TOKENS
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools")
    call = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"
    assert call + "\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>" in text
    assert "<|observation|>\n<tool_response>\n18C rain\n</tool_response><|assistant|>" in text
    assert text.endswith("<|user|>\nThanks!")


def test_the_reference_engine_serves_it(glm_dir: Path, tokenizer: Any, loop_thread: Any) -> None:
    """The transformers reference engine (vLLM's CPU build, about a minute to start, is not
    started here)."""
    prompt = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|assistant|>")
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    info, tokens, logprobs, expected = serve_and_recompute("transformers", glm_dir, prompt_ids, loop_thread)
    assert set(info.eos_token_ids) == {tokenizer.convert_tokens_to_ids(t) for t in GLM45_END_TOKENS}
    assert 1 <= len(tokens) <= 12
    assert all(0 <= t < len(tokenizer) for t in tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) <= 1e-4
