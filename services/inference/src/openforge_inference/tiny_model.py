"""Build a tiny random-init model with a locally trained tokenizer, in one of five families.

* ``qwen`` (the default): Qwen2 architecture, a Qwen/Hermes chat template (``<|im_start|>``,
  ``<tool_call>``, ``<think>``).
* ``llama3``: Llama architecture (``LlamaForCausalLM``, Llama 3.1 RoPE scaling), a tokenizer
  carrying Llama 3's special tokens and the Llama 3.1-style template of
  :mod:`openforge_core.chat_formats` (the one the test fakes use too).
* ``glm45``: GLM-4.5's architecture (``Glm4MoeForCausalLM``: a dense first layer, then
  mixture-of-experts layers with a shared expert; partial RoPE), a tokenizer carrying GLM-4.5's
  special tokens and the GLM-4.5-style template of :mod:`openforge_core.chat_formats`.
* ``mistral``: Mistral's architecture (``MistralForCausalLM``), a tokenizer carrying Mistral's
  control tokens (``[INST]``, ``[TOOL_CALLS]``, ``[ARGS]``...) and the Mistral v11-style
  template of :mod:`openforge_core.chat_formats`.
* ``deepseek_v31``: DeepSeek-V3's architecture (``DeepseekV3ForCausalLM``: multi-head latent
  attention with low-rank query and key-value projections, a dense first layer, then
  mixture-of-experts layers with grouped routing and a shared expert), a tokenizer carrying
  DeepSeek-V3.1's special tokens and the DeepSeek-V3.1-style template of
  :mod:`openforge_core.chat_formats`.

No model hub is ever contacted: the tokenizer is a byte-level BPE trained with ``tokenizers`` on a
small corpus built into this module (chat, tool-use and code text, expanded deterministically
from a seed; the llama3, glm45, mistral and deepseek_v31 families add their call formats), the weights are
random, and everything is
written with ``save_pretrained`` in HF safetensors format so that ``AutoModelForCausalLM.from_pretrained``,
``AutoTokenizer.from_pretrained`` (including ``apply_chat_template`` with tools) and vLLM all
load the directory like any real checkpoint.

The tokenizer's length equals ``config.vocab_size`` exactly: whatever the BPE trainer does not
fill is padded with ``<|reserved_N|>`` special tokens, so that every id a random model samples
decodes (real Qwen checkpoints pad the embedding instead, which a trained model never samples
from; a random one does). The llama3 family's padding tokens are ``<|reserved_special_token_N|>``.

Run as ``python -m openforge_inference.tiny_model --size 10m [--family llama3|glm45|mistral|deepseek_v31] --out DIR``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any, Final, Literal

import structlog

from openforge_core.chat_formats import (
    DEEPSEEK_V31_BOS_TOKEN,
    DEEPSEEK_V31_END_TOKENS,
    DEEPSEEK_V31_EOS_TOKEN,
    DEEPSEEK_V31_PAD_TOKEN,
    DEEPSEEK_V31_SPECIAL_TOKENS,
    DEEPSEEK_V31_TEMPLATE,
    GLM45_END_TOKENS,
    GLM45_EOS_TOKEN,
    GLM45_PAD_TOKEN,
    GLM45_SPECIAL_TOKENS,
    GLM45_TEMPLATE,
    HERMES_TEMPLATE,
    LLAMA3_BOS_TOKEN,
    LLAMA3_END_TOKENS,
    LLAMA3_EOS_TOKEN,
    LLAMA3_PAD_TOKEN,
    LLAMA3_SPECIAL_TOKENS,
    LLAMA3_TEMPLATE,
    MISTRAL_BOS_TOKEN,
    MISTRAL_END_TOKENS,
    MISTRAL_EOS_TOKEN,
    MISTRAL_PAD_TOKEN,
    MISTRAL_SPECIAL_TOKENS,
    MISTRAL_TEMPLATE,
)

__all__ = [
    "CHAT_TEMPLATE",
    "FAMILIES",
    "SIZES",
    "SPECIAL_TOKENS",
    "TinyFamily",
    "TinyModelSpec",
    "build_tiny_model",
    "main",
    "perturb_checkpoint",
]

_log = structlog.get_logger()

_EVENT_BUILT: Final = "tiny_model.built"

TinySize = Literal["1m", "10m", "50m", "300m"]

#: Special tokens, in id order (ids 0..8 of the vocabulary).
SPECIAL_TOKENS: Final[tuple[str, ...]] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)


@dataclasses.dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Shape of one tiny model size (Qwen2 architecture, GQA, tied embeddings).

    Attributes:
        vocab_size: Embedding rows; the tokenizer is padded to exactly this length.
        hidden_size: Model width.
        intermediate_size: SwiGLU MLP width.
        num_hidden_layers: Decoder layers.
        num_attention_heads: Query heads (head_dim = hidden_size / heads = 64, a size the vLLM
            CPU attention backend supports).
        num_key_value_heads: Key/value heads (GQA).
        max_position_embeddings: Context length in tokens (prompt + completion).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 32768


#: The sizes ``build_tiny_model`` knows; the name is the approximate parameter count.
SIZES: Final[dict[str, TinyModelSpec]] = {
    # ~1.0M parameters: 2048*128 embedding + 4 layers of ~184k.
    "1m": TinyModelSpec(2048, 128, 352, 4, 2, 1),
    # ~9.5M parameters: 4096*384 embedding + 5 layers of ~1.6M.
    "10m": TinyModelSpec(4096, 384, 1024, 5, 6, 2),
    # ~48M parameters: 8192*640 embedding + 10 layers of ~4.3M.
    "50m": TinyModelSpec(8192, 640, 1728, 10, 10, 2),
    # ~290M parameters: 16384*1024 embedding + 24 layers of ~11.3M (the GPU check's size).
    "300m": TinyModelSpec(16384, 1024, 2816, 24, 16, 4),
}

# Qwen2 pre-tokenization regex (digits split one by one, contractions, words, punctuation runs,
# newlines, other whitespace).
_SPLIT_PATTERN: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3's pre-tokenization regex: Qwen2's, except that digits go in runs of up to three.
_LLAMA3_SPLIT_PATTERN: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Qwen/Hermes-style chat template: system/user/assistant/tool roles, tool definitions, tool calls
#: as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, and reasoning as
#: ``<think>...</think>`` (from an assistant message's ``reasoning_content``). Reasoning is kept
#: in every assistant turn, so a conversation's rendering always extends the previous one
#: (token-exact splicing relies on that). ``enable_thinking=false`` pre-fills an empty think block
#: in the generation prompt, as Qwen3 does.
CHAT_TEMPLATE: Final = HERMES_TEMPLATE

# A small built-in corpus: chat turns, tool calls and results, reasoning, shell and code. It is
# expanded deterministically (see _corpus) so the BPE trainer sees enough pair statistics.
_SEED_TEXTS: Final[tuple[str, ...]] = (
    "You are a helpful assistant. Answer the user's question accurately and concisely.",
    "You are a coding agent working in a repository. Use the tools to read files, run tests "
    "and edit code until the task is done.",
    "Hello! How can I help you today?",
    "Can you list the files in the current directory and tell me which one is the entry point?",
    "I'll look at the directory first.",
    '{"name": "bash", "arguments": {"command": "ls -la"}}',
    '{"name": "read_file", "arguments": {"path": "src/main.py"}}',
    '{"name": "write_file", "arguments": {"path": "README.md", "content": "# Project\\n"}}',
    '{"name": "search", "arguments": {"query": "weather in Paris", "max_results": 5}}',
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the current '
    'weather for a city.", "parameters": {"type": "object", "properties": {"city": {"type": '
    '"string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", '
    '"fahrenheit"]}}, "required": ["city"]}}}',
    "total 24\ndrwxr-xr-x 4 user user 4096 Jan 1 12:00 .\n-rw-r--r-- 1 user user 120 README.md\n"
    "-rw-r--r-- 1 user user 2048 main.py\ndrwxr-xr-x 2 user user 4096 tests",
    "The user wants the entry point. main.py defines a main function and is called from "
    "__main__, so that is the entry point. Let me check the tests too.",
    "All 12 tests passed in 0.41s.",
    "FAILED tests/test_parser.py::test_empty_input - AssertionError: expected [] but got None",
    "The failure comes from parse() returning None for an empty string; it should return an "
    "empty list. I will fix the early return.",
    "def parse(text: str) -> list[str]:\n    if not text:\n        return []\n"
    "    return [line.strip() for line in text.splitlines() if line.strip()]\n",
    "import json\nimport sys\n\n\ndef main() -> int:\n    data = json.load(sys.stdin)\n"
    "    print(json.dumps(data, indent=2, sort_keys=True))\n    return 0\n\n\n"
    'if __name__ == "__main__":\n    raise SystemExit(main())\n',
    "class Counter:\n    def __init__(self) -> None:\n        self.value = 0\n\n"
    "    def increment(self, step: int = 1) -> int:\n        self.value += step\n"
    "        return self.value\n",
    "function add(a, b) {\n  return a + b;\n}\nconsole.log(add(2, 3));\n",
    "SELECT id, name, created_at FROM users WHERE active = 1 ORDER BY created_at DESC LIMIT 10;",
    'git status\ngit diff --stat\ngit commit -m "Fix empty input handling in parser"',
    "pip install -r requirements.txt && python -m pytest -q tests/",
    "The weather in Paris is 18 degrees Celsius with light rain.",
    "Sure. First, open the settings page. Then click on the account tab and choose a new "
    "password. Finally, save your changes.",
    "Here is a summary of the changes: the parser now returns an empty list for empty input, "
    "and a regression test covers it.",
    "Thinking about the problem step by step: the list is sorted, so binary search finds the "
    "index in logarithmic time.",
    "1 + 1 = 2. 12 * 12 = 144. The square root of 81 is 9. 2024-01-15T10:30:00Z",
    "Error: file not found: config.yaml. Create it with default values and retry.",
    "The function returns a dictionary mapping each word to the number of times it appears.",
    "Please write a unit test for the tokenizer and run it.",
)

_WORDS: Final[tuple[str, ...]] = (
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "or",
    "is",
    "are",
    "was",
    "be",
    "it",
    "this",
    "that",
    "with",
    "for",
    "on",
    "as",
    "at",
    "by",
    "from",
    "not",
    "can",
    "will",
    "should",
    "file",
    "files",
    "test",
    "tests",
    "code",
    "function",
    "class",
    "method",
    "value",
    "list",
    "string",
    "number",
    "error",
    "result",
    "output",
    "input",
    "user",
    "assistant",
    "tool",
    "call",
    "response",
    "request",
    "model",
    "token",
    "tokens",
    "server",
    "client",
    "data",
    "read",
    "write",
    "run",
    "check",
    "fix",
    "update",
    "create",
    "delete",
    "search",
    "open",
    "return",
    "import",
    "print",
    "parse",
    "build",
    "install",
    "commit",
    "branch",
    "merge",
    "directory",
    "path",
    "command",
    "shell",
    "python",
    "config",
    "settings",
    "version",
    "weather",
    "city",
    "temperature",
    "answer",
    "question",
    "task",
    "step",
    "plan",
    "first",
    "then",
    "next",
    "finally",
    "because",
    "so",
    "if",
    "else",
    "when",
    "while",
    "after",
    "before",
    "new",
    "old",
    "empty",
    "missing",
    "found",
    "passed",
    "failed",
    "done",
    "ready",
)

_NAMES: Final[tuple[str, ...]] = (
    "bash",
    "read_file",
    "write_file",
    "search",
    "get_weather",
    "list_dir",
    "run_tests",
    "edit",
    "grep",
    "browser_open",
    "click",
    "type_text",
)


@dataclasses.dataclass(frozen=True, slots=True)
class TinyFamily:
    """What one model family's tiny model is made of (architecture, tokenizer, template).

    Attributes:
        architecture: transformers' architecture: ``qwen2`` (``Qwen2ForCausalLM``), ``llama``
            (``LlamaForCausalLM``), ``glm4_moe`` (``Glm4MoeForCausalLM``), ``mistral``
            (``MistralForCausalLM``) or ``deepseek_v3`` (``DeepseekV3ForCausalLM``).
        special_tokens: Special tokens, ids 0.. in this order.
        chat_template: The Jinja chat template written next to the tokenizer.
        split_pattern: Pre-tokenization regex of the byte-level BPE.
        reserved_token: Spelling of the padding special tokens (``{}`` is their index).
        bos_token: The tokenizer's ``bos_token`` (None: none; the config's ``bos_token_id``
            is then null too).
        eos_token: The tokenizer's ``eos_token``.
        pad_token: The tokenizer's ``pad_token`` (the configs' ``pad_token_id``).
        extra_special_tokens: The tokenizer's ``additional_special_tokens``.
        end_tokens: Tokens that end a turn: ``generation_config.json``'s ``eos_token_id``.
        config_eos_all: ``config.json``'s ``eos_token_id`` is every one of ``end_tokens`` (as
            Llama 3.1's is) rather than the first (as Qwen2's is).
        rope_parameters: ``rope_parameters`` of the config.
        corpus: Texts added to the tokenizer's training corpus (the family's own formats).
        tie_word_embeddings: The output layer is the embedding (Qwen2's and Llama 3.2's small
            models), or a matrix of its own (GLM-4.5's).
    """

    architecture: Literal["qwen2", "llama", "glm4_moe", "mistral", "deepseek_v3"]
    special_tokens: tuple[str, ...]
    chat_template: str
    split_pattern: str
    reserved_token: str
    bos_token: str | None
    eos_token: str
    pad_token: str
    extra_special_tokens: tuple[str, ...]
    end_tokens: tuple[str, ...]
    config_eos_all: bool
    rope_parameters: dict[str, str | float | int]
    corpus: tuple[str, ...] = ()
    tie_word_embeddings: bool = True


def _llama3_corpus() -> tuple[str, ...]:
    """Llama 3.1 framing and calls (``{"name": ..., "parameters": ...}``, several joined by
    ``; ``), built deterministically from the tool names and words of the base corpus."""
    rng = random.Random(3)
    docs = [
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
        "You have access to the following functions. To call a function, respond with JSON in the "
        'format {"name": function name, "parameters": dictionary of argument name and its value}. '
        "Do not use variables.\n\n",
        *(f"{role}\n\n" for role in ("system", "user", "assistant", "ipython")),
    ] * 20
    for _ in range(1000):
        calls = [
            json.dumps({"name": rng.choice(_NAMES), "parameters": {rng.choice(_WORDS): rng.choice(_WORDS)}})
            for _ in range(rng.randint(1, 2))
        ]
        docs.append("; ".join(calls))
    return tuple(docs)


def _glm45_corpus() -> tuple[str, ...]:
    """GLM-4.5 framing and calls (``<tool_call>NAME`` then ``<arg_key>``/``<arg_value>`` pairs),
    built deterministically from the tool names and words of the base corpus."""
    rng = random.Random(45)
    docs = [
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "For each function call, output the function name and arguments within the following XML format:",
        "\n<tool_response>\n",
        "\n</tool_response>",
    ] * 20
    for _ in range(1000):
        args = "".join(
            f"\n<arg_key>{rng.choice(_WORDS)}</arg_key>\n<arg_value>{rng.choice(_WORDS)}</arg_value>"
            for _ in range(rng.randint(1, 2))
        )
        docs.append(f"\n<tool_call>{rng.choice(_NAMES)}{args}\n</tool_call>")
    return tuple(docs)


def _mistral_corpus() -> tuple[str, ...]:
    """Mistral v11 framing and calls (``[TOOL_CALLS]NAME[ARGS]{...}``), built deterministically
    from the tool names and words of the base corpus."""
    rng = random.Random(11)
    docs = ['[{"type": "function", "function": {"name": "', '"}}]'] * 20
    for _ in range(1000):
        calls = "".join(
            f"[TOOL_CALLS]{rng.choice(_NAMES)}[ARGS]" + json.dumps({rng.choice(_WORDS): rng.choice(_WORDS)})
            for _ in range(rng.randint(1, 2))
        )
        docs.append(calls)
    return tuple(docs)


def _deepseek_v31_corpus() -> tuple[str, ...]:
    """DeepSeek-V3.1 framing and call blocks (``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}``),
    built deterministically from the tool names and words of the base corpus."""
    rng = random.Random(31)
    docs = ["## Tools\nYou have access to the following tools:\n", '{"type": "function", "function": {"name": "'] * 20
    for _ in range(1000):
        calls = "".join(
            f"<｜tool▁call▁begin｜>{rng.choice(_NAMES)}<｜tool▁sep｜>"
            + json.dumps({rng.choice(_WORDS): rng.choice(_WORDS)})
            + "<｜tool▁call▁end｜>"
            for _ in range(rng.randint(1, 2))
        )
        docs.append(f"<｜tool▁calls▁begin｜>{calls}<｜tool▁calls▁end｜>")
    return tuple(docs)


#: The families ``build_tiny_model`` knows; ``qwen`` is the default.
FAMILIES: Final[dict[str, TinyFamily]] = {
    "qwen": TinyFamily(
        architecture="qwen2",
        special_tokens=SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
        split_pattern=_SPLIT_PATTERN,
        reserved_token="<|reserved_{}|>",
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=SPECIAL_TOKENS[1:],
        end_tokens=("<|im_end|>", "<|endoftext|>"),
        config_eos_all=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    "llama3": TinyFamily(
        architecture="llama",
        special_tokens=LLAMA3_SPECIAL_TOKENS,
        chat_template=LLAMA3_TEMPLATE,
        split_pattern=_LLAMA3_SPLIT_PATTERN,
        reserved_token="<|reserved_special_token_{}|>",
        bos_token=LLAMA3_BOS_TOKEN,
        eos_token=LLAMA3_EOS_TOKEN,
        pad_token=LLAMA3_PAD_TOKEN,
        extra_special_tokens=tuple(t for t in LLAMA3_SPECIAL_TOKENS if t not in (LLAMA3_BOS_TOKEN, LLAMA3_PAD_TOKEN)),
        end_tokens=LLAMA3_END_TOKENS,
        config_eos_all=True,
        # Llama 3.1's RoPE (theta 500k, "llama3" frequency scaling from an 8k original context),
        # its factor scaled to the tiny context.
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        corpus=_llama3_corpus(),
    ),
    "glm45": TinyFamily(
        architecture="glm4_moe",
        special_tokens=GLM45_SPECIAL_TOKENS,
        chat_template=GLM45_TEMPLATE,
        split_pattern=_SPLIT_PATTERN,
        reserved_token="<|reserved_{}|>",
        bos_token=None,
        eos_token=GLM45_EOS_TOKEN,
        pad_token=GLM45_PAD_TOKEN,
        extra_special_tokens=tuple(t for t in GLM45_SPECIAL_TOKENS if t != GLM45_EOS_TOKEN),
        end_tokens=GLM45_END_TOKENS,
        config_eos_all=True,
        # GLM-4.5's RoPE: theta 1M over half of each head (partial rotary factor 0.5)
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
        corpus=_glm45_corpus(),
        tie_word_embeddings=False,
    ),
    "mistral": TinyFamily(
        architecture="mistral",
        special_tokens=MISTRAL_SPECIAL_TOKENS,
        chat_template=MISTRAL_TEMPLATE,
        split_pattern=_SPLIT_PATTERN,
        reserved_token="<SPECIAL_{}>",
        bos_token=MISTRAL_BOS_TOKEN,
        eos_token=MISTRAL_EOS_TOKEN,
        pad_token=MISTRAL_PAD_TOKEN,
        extra_special_tokens=tuple(
            t for t in MISTRAL_SPECIAL_TOKENS if t not in (MISTRAL_BOS_TOKEN, MISTRAL_EOS_TOKEN, MISTRAL_PAD_TOKEN)
        ),
        end_tokens=MISTRAL_END_TOKENS,
        config_eos_all=False,
        # Mistral Small 3.x's RoPE: theta 1e9, no scaling; an output layer of its own
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000_000.0},
        corpus=_mistral_corpus(),
        tie_word_embeddings=False,
    ),
    "deepseek_v31": TinyFamily(
        architecture="deepseek_v3",
        special_tokens=DEEPSEEK_V31_SPECIAL_TOKENS,
        chat_template=DEEPSEEK_V31_TEMPLATE,
        split_pattern=_SPLIT_PATTERN,
        reserved_token="<｜place▁holder▁no▁{}｜>",
        bos_token=DEEPSEEK_V31_BOS_TOKEN,
        eos_token=DEEPSEEK_V31_EOS_TOKEN,
        pad_token=DEEPSEEK_V31_PAD_TOKEN,
        extra_special_tokens=tuple(
            t
            for t in DEEPSEEK_V31_SPECIAL_TOKENS
            if t not in (DEEPSEEK_V31_BOS_TOKEN, DEEPSEEK_V31_EOS_TOKEN, DEEPSEEK_V31_PAD_TOKEN)
        ),
        end_tokens=DEEPSEEK_V31_END_TOKENS,
        config_eos_all=False,
        # DeepSeek-V3's RoPE on the rotary part of each head (theta 10k; its YaRN extension to
        # 128k is left out at this size); an output layer of its own
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        corpus=_deepseek_v31_corpus(),
        tie_word_embeddings=False,
    ),
}


def _corpus(seed: int) -> list[str]:
    """Return the training corpus: the seed texts plus deterministic synthetic variations.

    Args:
        seed: Seed of the synthetic expansion.

    Returns:
        About 6,000 short documents (roughly 600 kB of text).
    """
    rng = random.Random(seed)
    docs: list[str] = []
    for _ in range(20):
        docs.extend(_SEED_TEXTS)
    for _ in range(3000):
        n = rng.randint(6, 24)
        words = [rng.choice(_WORDS) for _ in range(n)]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ":"])
        docs.append(sentence)
    for i in range(1500):
        name = rng.choice(_NAMES)
        args = {rng.choice(_WORDS): rng.choice([rng.choice(_WORDS), rng.randint(0, 999)])}
        call = json.dumps({"name": name, "arguments": args})
        docs.append(f"<tool_call>\n{call}\n</tool_call>")
        ident = "_".join(rng.choice(_WORDS) for _ in range(2))
        docs.append(
            f"def {ident}_{i % 97}(x: int, y: int) -> int:\n"
            f"    # {rng.choice(_WORDS)} {rng.choice(_WORDS)}\n"
            f"    return x {rng.choice('+-*')} y * {rng.randint(1, 9)}\n"
        )
    return docs


def _train_tokenizer(vocab_size: int, seed: int, family: TinyFamily) -> object:
    """Train the byte-level BPE tokenizer, padded to exactly ``vocab_size`` tokens.

    Args:
        vocab_size: Final vocabulary size (special + learned + reserved padding tokens).
        seed: Seed of the corpus expansion.
        family: Its special tokens, pre-tokenization, padding tokens and extra corpus.

    Returns:
        A ``tokenizers.Tokenizer``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(family.split_pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(family.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*_corpus(seed), *family.corpus], trainer=trainer)
    learned = tokenizer.get_vocab_size(with_added_tokens=True)
    if learned < vocab_size:
        tokenizer.add_special_tokens([family.reserved_token.format(i) for i in range(vocab_size - learned)])
    return tokenizer


def build_tiny_model(out_dir: str | Path, size: str = "1m", seed: int = 0, family: str = "qwen") -> Path:
    """Build a random-init model of one family and its tokenizer in ``out_dir``.

    Writes ``config.json``, ``generation_config.json``, ``model.safetensors``,
    ``tokenizer.json``, ``tokenizer_config.json`` and the chat template with
    ``save_pretrained``. Deterministic for a given (size, seed, family) and library versions.

    Args:
        out_dir: Directory to write (created if missing; existing files are overwritten).
        size: One of ``SIZES`` ("1m", "10m", "50m", "300m"): approximate parameter count.
        seed: Seed for the weights (``torch.manual_seed``) and the tokenizer corpus.
        family: One of ``FAMILIES``: ``qwen`` (Qwen2, Hermes/Qwen template), ``llama3``
            (Llama, Llama 3.1-style template and special tokens), ``glm45`` (Glm4Moe,
            GLM-4.5-style template and special tokens), ``mistral`` (Mistral, Mistral
            v11-style template and control tokens) or ``deepseek_v31`` (DeepseekV3,
            DeepSeek-V3.1-style template and special tokens).

    Returns:
        The output directory.

    Raises:
        ValueError: ``size`` is not one of ``SIZES`` or ``family`` not one of ``FAMILIES``.
    """
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; expected one of {sorted(SIZES)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; expected one of {sorted(FAMILIES)}")
    spec, fam = SIZES[size], FAMILIES[family]
    import torch
    from transformers import (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        GenerationConfig,
        Glm4MoeConfig,
        Glm4MoeForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    raw_tokenizer = _train_tokenizer(spec.vocab_size, seed, fam)
    named_tokens = {"eos_token": fam.eos_token, "pad_token": fam.pad_token}
    if fam.bos_token is not None:
        named_tokens["bos_token"] = fam.bos_token
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=raw_tokenizer,
        **named_tokens,
        additional_special_tokens=list(fam.extra_special_tokens),
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = fam.chat_template
    if len(tokenizer) != spec.vocab_size:
        raise AssertionError(f"tokenizer has {len(tokenizer)} tokens, expected {spec.vocab_size}")

    vocab = tokenizer.get_vocab()
    eos_ids = [vocab[token] for token in fam.end_tokens]
    pad_id = vocab[fam.pad_token]
    bos_id = None if fam.bos_token is None else vocab[fam.bos_token]
    classes: dict[str, tuple[Any, Any]] = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
        "glm4_moe": (Glm4MoeConfig, Glm4MoeForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM),
    }
    config_class, model_class = classes[fam.architecture]
    extra: dict[str, Any] = {}
    if fam.architecture == "glm4_moe":
        # a dense first layer, then 4 routed experts (2 per token) and a shared one, each a
        # quarter of the dense MLP; no multi-token-prediction layer; head_dim written out, as
        # GLM-4.5's config does (vLLM reads it)
        extra = {
            "head_dim": spec.hidden_size // spec.num_attention_heads,
            "first_k_dense_replace": 1,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": spec.intermediate_size // 4,
            "num_mtp_layers": 0,
        }
    elif fam.architecture == "deepseek_v3":
        # DeepSeek-V3's shape at this size: latent attention (query rank half the hidden size;
        # DeepSeek-V3's own key-value latent of 512 and 64-wide rotary part: vLLM's CPU MLA
        # kernel takes only that 576-wide cache entry), a dense first
        # layer, then 4 routed experts in 2 groups (2 per token from 1 group) and a shared one,
        # each a quarter of the dense MLP; no multi-token-prediction layer
        head = spec.hidden_size // spec.num_attention_heads
        extra = {
            "q_lora_rank": spec.hidden_size // 2,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": head // 2,
            "v_head_dim": head // 2,
            "first_k_dense_replace": 1,
            "n_routed_experts": 4,
            "n_group": 2,
            "topk_group": 1,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": spec.intermediate_size // 4,
            "num_mtp_layers": 0,
            # written out as DeepSeek-V3's config does: sigmoid routing scores with a learned
            # bias for choosing experts (transformers' rule; vLLM reads both keys)
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            # latent attention has as many key-value heads as query heads (DeepSeek-V3's config
            # says so; transformers' attention repeats keys by the ratio otherwise)
            "num_key_value_heads": spec.num_attention_heads,
        }
    config = config_class(
        **{
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_hidden_layers,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            **extra,
        },
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters=dict(fam.rope_parameters),
        tie_word_embeddings=fam.tie_word_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_ids if fam.config_eos_all else eos_ids[0],
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = model_class(config)
    generation = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos_ids, pad_token_id=pad_id, bos_token_id=bos_id
    )
    model.generation_config = generation
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    _log.info(_EVENT_BUILT, path=str(out), size=size, seed=seed, family=family, parameters=n_params)
    return out


def perturb_checkpoint(src_dir: str | Path, out_dir: str | Path, seed: int = 1, scale: float = 0.05) -> Path:
    """Write a copy of a model directory whose weights are shifted by Gaussian noise.

    Stands in for a trainer's next checkpoint in tests and benchmarks: same tensor names,
    shapes and dtypes, different values; the config and tokenizer files are copied as they are,
    so the result loads with ``from_pretrained`` too.

    Args:
        src_dir: A model directory written by :func:`build_tiny_model` (or any HF safetensors
            checkpoint).
        out_dir: Directory to write (created if missing).
        seed: Seed of the noise.
        scale: Noise standard deviation relative to each tensor's own standard deviation.

    Returns:
        The output directory.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, out = Path(src_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for path in sorted(src.iterdir()):
        if path.suffix == ".safetensors":
            tensors = load_file(str(path))
            noisy = {}
            for name, t in tensors.items():
                std = float(t.float().std()) if t.numel() > 1 else 1.0
                noise = torch.randn(t.shape, generator=generator) * (scale * (std or 1.0))
                noisy[name] = (t.float() + noise).to(t.dtype).contiguous()
            save_file(noisy, str(out / path.name), metadata={"format": "pt"})
        elif path.is_file():
            shutil.copy2(path, out / path.name)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: ``python -m openforge_inference.tiny_model``.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        Process exit code (0 on success).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", choices=sorted(SIZES), default="1m")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen")
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out, size=args.size, seed=args.seed, family=args.family)
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
