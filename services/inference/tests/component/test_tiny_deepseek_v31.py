"""The deepseek_v31 tiny model: a random-init ``DeepseekV3ForCausalLM`` (multi-head latent
attention, a dense first layer, then mixture-of-experts layers with grouped routing) whose
tokenizer carries DeepSeek-V3.1's special tokens as single ids, whose template the proxy detects
as the deepseek_v31 family (the one template the test fakes use too), and which the transformers
reference engine serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_serving import CONVERSATION, TOOLS, serve_and_recompute

from openforge_core.chat_formats import DEEPSEEK_V31_END_TOKENS, DEEPSEEK_V31_SPECIAL_TOKENS, DEEPSEEK_V31_TEMPLATE
from openforge_inference.tiny_model import SIZES, build_tiny_model

pytest.importorskip("torch", reason="needs torch (requirements/inference-cpu.txt)")
pytest.importorskip("transformers", reason="needs transformers (requirements/inference-cpu.txt)")


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-deepseek"), size="1m", seed=0, family="deepseek_v31")


@pytest.fixture(scope="module")
def tokenizer(ds_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ds_dir))


def test_deepseek_v3_architecture_and_end_id(ds_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM

    config = json.loads((ds_dir / "config.json").read_text())
    generation = json.loads((ds_dir / "generation_config.json").read_text())
    eos = tokenizer.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["vocab_size"] == SIZES["1m"].vocab_size
    # latent attention, its cache entry (kv_lora_rank + qk_rope_head_dim) DeepSeek-V3's 512 + 64
    assert (config["q_lora_rank"], config["kv_lora_rank"], config["qk_rope_head_dim"]) == (64, 512, 64)
    assert (config["qk_nope_head_dim"], config["v_head_dim"]) == (32, 32)
    assert (config["topk_method"], config["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert (config["first_k_dense_replace"], config["n_routed_experts"], config["num_experts_per_tok"]) == (1, 4, 2)
    assert (config["n_group"], config["topk_group"]) == (2, 1)
    assert config["tie_word_embeddings"] is False
    assert config["num_key_value_heads"] == config["num_attention_heads"]
    assert config["eos_token_id"] == eos and generation["eos_token_id"] == [eos]
    assert config["bos_token_id"] == tokenizer.convert_tokens_to_ids("<｜begin▁of▁sentence｜>")
    model = AutoModelForCausalLM.from_pretrained(str(ds_dir), dtype=torch.float32)
    assert isinstance(model, DeepseekV3ForCausalLM)
    assert 1.7e6 < sum(p.numel() for p in model.parameters()) < 2.0e6


def test_special_tokens_are_single_ids(tokenizer: Any) -> None:
    assert len(tokenizer) == SIZES["1m"].vocab_size
    for i, token in enumerate(DEEPSEEK_V31_SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == i
        assert tokenizer.encode(token, add_special_tokens=False) == [i]
    names = (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token)
    assert names == ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>")
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1).startswith("<｜place▁holder▁no▁")
    call = '<｜tool▁call▁begin｜>exec<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜>'
    text = f"<｜tool▁calls▁begin｜>{call}<｜tool▁calls▁end｜>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[:2] == [
        DEEPSEEK_V31_SPECIAL_TOKENS.index(t) for t in ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
    ]
    assert tokenizer.decode(ids) == text


def test_template_is_the_shared_deepseek_v31_one_and_the_proxy_detects_it(ds_dir: Path, tokenizer: Any) -> None:
    from openforge_proxy.domain.families import family_for
    from openforge_testing.fakes import TEMPLATES

    template = (ds_dir / "chat_template.jinja").read_text()
    assert template == DEEPSEEK_V31_TEMPLATE == TEMPLATES["deepseek_v31"]
    family = family_for("auto", template)
    assert family.name == "deepseek_v31" and family.end_tokens == DEEPSEEK_V31_END_TOKENS
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<｜begin▁of▁sentence｜>You are helpful.\n\n## Tools\n")
    call = '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 2}<｜tool▁call▁end｜>'
    assert text.endswith(
        f"<｜User｜>Weather in Paris?<｜Assistant｜></think><｜tool▁calls▁begin｜>{call}<｜tool▁calls▁end｜>"
        "<｜end▁of▁sentence｜><｜tool▁output▁begin｜>18C rain<｜tool▁output▁end｜>Paris: 18C.<｜end▁of▁sentence｜>"
        "<｜User｜>Thanks!<｜Assistant｜></think>"
    )
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


#: How far the engine's logprobs may be from a transformers forward of the same weights. vLLM's
#: CPU build serves this architecture through its latent-attention (MLA) path, whose logprobs
#: were measured up to 0.006 nats from transformers' (0.002 with every layer dense: the gap is in
#: attention; its cause is not found); the other families' match to 1e-4.
TOLERANCE = {"transformers": 1e-4, "vllm": 1e-2}


@pytest.mark.parametrize("engine_name", ["transformers", pytest.param("vllm", marks=pytest.mark.slow)])
def test_engine_serves_it(engine_name: str, ds_dir: Path, tokenizer: Any, loop_thread: Any) -> None:
    """The reference engine, and vLLM's CPU build (about a minute to start on two cores)."""
    if engine_name == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (requirements/inference-cpu.txt)")
    prompt = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<｜Assistant｜></think>")
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    # a latent-attention cache entry is 576 wide: the whole context takes 0.28 GiB
    info, tokens, logprobs, expected = serve_and_recompute(
        engine_name, ds_dir, prompt_ids, loop_thread, kv_cache_gib=0.5
    )
    assert set(info.eos_token_ids) == {tokenizer.convert_tokens_to_ids(t) for t in DEEPSEEK_V31_END_TOKENS}
    assert 1 <= len(tokens) <= 12
    assert all(0 <= t < len(tokenizer) for t in tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) <= TOLERANCE[engine_name]
