"""Fakes (test doubles) for tests of services that talk to inference.

**Everything here is a fake: it serves scripted answers, not a model.**

* :func:`build_fake_model_dir` writes a model directory with a real
  byte-level BPE ``tokenizer.json`` trained locally with ``tokenizers`` (no
  hub, no torch), a ``tokenizer_config.json``, a ``config.json`` and a
  Qwen/Hermes-style ``chat_template.jinja`` (tools, ``<tool_call>{...}</tool_call>``,
  ``<think>...</think>``). Two template variants: ``hermes`` keeps reasoning in
  every assistant turn (rendering a conversation always extends the previous
  rendering); ``qwen3`` drops the reasoning of assistant turns before the last
  user message, as Qwen3's template does, so re-rendering history from text
  does *not* reproduce what the model saw (what token splicing is for). A
  third, ``llama3``, is a Llama 3.1-style template (header-framed messages,
  ``<|eot_id|>``/``<|eom_id|>``, JSON tool calls with ``parameters``, tool
  results as ``ipython``) over a tokenizer carrying Llama 3's special tokens; a fourth,
  ``glm45``, a GLM-4.5-style one (``<|user|>``/``<|assistant|>``/``<|observation|>``
  framing, ``<tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value></tool_call>``)
  over a tokenizer carrying GLM-4.5's special tokens; a fifth, ``mistral``, a Mistral
  v11-style one (``[INST]...[/INST]``, ``</s>``, ``[TOOL_CALLS]NAME[ARGS]{...}``,
  ``[TOOL_RESULTS]...[/TOOL_RESULTS]``) over a tokenizer carrying Mistral's control tokens; a
  sixth, ``deepseek_v31``, a DeepSeek-V3.1-style one (``<｜User｜>``, ``<｜Assistant｜></think>``,
  ``<｜tool▁calls▁begin｜>`` blocks of ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``,
  ``<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>``) over a tokenizer carrying DeepSeek-V3.1's
  special tokens.
  There are no weights: nothing can load it as a model.
* :data:`FAMILY_FORMATS` says, per family, how its model writes a turn of text and one call,
  and how it ends each (token ids of that family's fake tokenizer), and how many tool results
  a prompt holds: what a scripted engine samples for a harness run against that family.
* :class:`ScriptedInferenceServer` is a fake ``openforge.inference.v1.InferenceService``
  on a real ``grpc.aio`` server: ``Generate`` tokenizes the next scripted
  completion text with the same tokenizer and streams its ids token by token
  with deterministic logprobs and the configured policy version;
  ``GetModelInfo`` describes the fake model directory. A completion may also be
  scripted as token ids, streamed as they are (spellings a tokenizer would not
  produce, another end token). It records every request so tests can check what
  the engine saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core import chat_formats
from openforge_core.rpc.server import GrpcServer
from openforge_core.settings import GrpcServerSettings

#: Special tokens of the fake tokenizer, ids 0..8.
FAKE_SPECIAL_TOKENS: tuple[str, ...] = (
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

_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: The Hermes-style and Qwen3-style templates, from :mod:`openforge_core.chat_formats` (the
#: tiny model builder's own is the Hermes one).
HERMES_TEMPLATE = chat_formats.HERMES_TEMPLATE
QWEN3_TEMPLATE = chat_formats.QWEN3_TEMPLATE

#: Llama 3's special tokens (ids 0..7) and the Llama 3.1-style template: the tiny model builder's
#: own (``openforge model init-tiny --family llama3``), from :mod:`openforge_core.chat_formats`.
LLAMA3_SPECIAL_TOKENS = chat_formats.LLAMA3_SPECIAL_TOKENS
LLAMA3_TEMPLATE = chat_formats.LLAMA3_TEMPLATE

#: GLM-4.5's special tokens and the GLM-4.5-style template, from :mod:`openforge_core.chat_formats`.
GLM45_SPECIAL_TOKENS = chat_formats.GLM45_SPECIAL_TOKENS
GLM45_TEMPLATE = chat_formats.GLM45_TEMPLATE

#: Mistral's control tokens and the Mistral v11-style template, from :mod:`openforge_core.chat_formats`.
MISTRAL_SPECIAL_TOKENS = chat_formats.MISTRAL_SPECIAL_TOKENS
MISTRAL_TEMPLATE = chat_formats.MISTRAL_TEMPLATE

#: DeepSeek-V3.1's special tokens and the DeepSeek-V3.1-style template, from :mod:`openforge_core.chat_formats`.
DEEPSEEK_V31_SPECIAL_TOKENS = chat_formats.DEEPSEEK_V31_SPECIAL_TOKENS
DEEPSEEK_V31_TEMPLATE = chat_formats.DEEPSEEK_V31_TEMPLATE

TEMPLATES = {
    "hermes": HERMES_TEMPLATE,
    "qwen3": QWEN3_TEMPLATE,
    "llama3": LLAMA3_TEMPLATE,
    "glm45": GLM45_TEMPLATE,
    "mistral": MISTRAL_TEMPLATE,
    "deepseek_v31": DEEPSEEK_V31_TEMPLATE,
}


@dataclass(frozen=True)
class FakeTokenizerSpec:
    """What a template family's fake tokenizer carries.

    Attributes:
        special_tokens: Its special tokens, ids 0.. in order.
        bos_token: ``tokenizer_config.json``'s ``bos_token`` (None: none).
        eos_token: ``tokenizer_config.json``'s ``eos_token`` (``config.json``'s ``eos_token_id``).
        pad_token: ``tokenizer_config.json``'s ``pad_token``.
        model_type: ``config.json``'s ``model_type``.
        corpus: Training texts added to the synthetic corpus (the family's tool-call format).
    """

    special_tokens: tuple[str, ...]
    bos_token: str | None
    eos_token: str
    pad_token: str
    model_type: str
    corpus: tuple[str, ...] = ()


_HERMES_SPEC = FakeTokenizerSpec(FAKE_SPECIAL_TOKENS, None, "<|im_end|>", "<|endoftext|>", "qwen2")
_LLAMA3_CORPUS = (
    '{"name": "exec", "parameters": {"command": "echo hello-from-harness > hello.txt && cat hello.txt"}}',
    '{"name": "read_file", "parameters": {"path": "hello.txt"}}; {"name": "exec", "parameters": {"command": "ls"}}',
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    "You have access to the following functions. To call a function, respond with JSON in the format",
) * 30

_GLM45_CORPUS = (
    "<tool_call>exec\n<arg_key>command</arg_key>\n<arg_value>echo hello-from-harness > hello.txt</arg_value>\n"
    "</tool_call>",
    "<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>hello.txt</arg_value>\n</tool_call>",
    "\n<tool_response>\nhello-from-harness\n</tool_response>",
    "For each function call, output the function name and arguments within the following XML format:",
) * 30

_MISTRAL_CORPUS = (
    '[TOOL_CALLS]exec[ARGS]{"command": "echo hello-from-harness > hello.txt && cat hello.txt"}',
    '[TOOL_CALLS]read_file[ARGS]{"path": "hello.txt"}[TOOL_CALLS]exec[ARGS]{"command": "ls"}',
    "[TOOL_RESULTS]hello-from-harness[/TOOL_RESULTS]",
) * 30

_DEEPSEEK_V31_CORPUS = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>exec<｜tool▁sep｜>{"command": "echo hello-from-harness > hello.txt"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    '<｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "hello.txt"}<｜tool▁call▁end｜>',
    "<｜tool▁output▁begin｜>hello-from-harness<｜tool▁output▁end｜>",
    "## Tools\nYou have access to the following tools:\n",
) * 30

#: Template name → what its fake tokenizer carries.
TOKENIZER_SPECS: dict[str, FakeTokenizerSpec] = {
    "hermes": _HERMES_SPEC,
    "qwen3": _HERMES_SPEC,
    "llama3": FakeTokenizerSpec(
        LLAMA3_SPECIAL_TOKENS,
        chat_formats.LLAMA3_BOS_TOKEN,
        chat_formats.LLAMA3_EOS_TOKEN,
        chat_formats.LLAMA3_PAD_TOKEN,
        "llama",
        _LLAMA3_CORPUS,
    ),
    "glm45": FakeTokenizerSpec(
        GLM45_SPECIAL_TOKENS,
        None,
        chat_formats.GLM45_EOS_TOKEN,
        chat_formats.GLM45_PAD_TOKEN,
        "glm4_moe",
        _GLM45_CORPUS,
    ),
    "mistral": FakeTokenizerSpec(
        MISTRAL_SPECIAL_TOKENS,
        chat_formats.MISTRAL_BOS_TOKEN,
        chat_formats.MISTRAL_EOS_TOKEN,
        chat_formats.MISTRAL_PAD_TOKEN,
        "mistral",
        _MISTRAL_CORPUS,
    ),
    "deepseek_v31": FakeTokenizerSpec(
        DEEPSEEK_V31_SPECIAL_TOKENS,
        chat_formats.DEEPSEEK_V31_BOS_TOKEN,
        chat_formats.DEEPSEEK_V31_EOS_TOKEN,
        chat_formats.DEEPSEEK_V31_PAD_TOKEN,
        "deepseek_v3",
        _DEEPSEEK_V31_CORPUS,
    ),
}

_WORDS = (
    "the a of to in and is it file files test code function error result output input user assistant "
    "tool call response request model token server client data read write run check fix update create "
    "delete search open return import print command shell python config hello world done echo cat txt "
    "contains create using name arguments description type string object properties required"
).split()


def _corpus(seed: int, extra: Sequence[str] = ()) -> list[str]:
    rng = random.Random(seed)
    docs = [
        '{"name": "Bash", "arguments": {"command": "echo hello-from-harness > hello.txt && cat hello.txt"}}',
        "I'll create the file.\n<tool_call>\n",
        "Done: hello.txt now contains hello-from-harness.",
        '{"type": "function", "function": {"name": "exec", "description": "Run a shell command", '
        '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}',
        "<think>\nThe user wants a file. I will run a shell command.\n</think>\n\n",
    ] * 30
    for _ in range(1500):
        docs.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20))) + rng.choice(".?!:\n"))
    docs.extend(extra)
    return docs


def build_fake_tokenizer(
    vocab_size: int = 1024,
    seed: int = 0,
    corpus: Sequence[str] = (),
    special_tokens: Sequence[str] = FAKE_SPECIAL_TOKENS,
) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained locally (Qwen2-style pre-tokenization).

    Args:
        vocab_size: Target vocabulary size (special tokens included); reached
            only if the corpus has that many merges (pass ``corpus`` for a
            large one).
        seed: Seed of the synthetic corpus.
        corpus: Extra training texts (e.g. real request bodies, for a tokenizer
            that splits them about as a production one does).
        special_tokens: Its special tokens, ids 0.. in order (another family's markers,
            e.g. Llama 3's ``<|start_header_id|>``...).

    Returns:
        The ``tokenizers.Tokenizer``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, corpus), trainer=trainer)
    return tok


def build_fake_model_dir(
    out_dir: Path,
    *,
    template: str = "hermes",
    context_length: int = 131072,
    vocab_size: int = 1024,
    corpus: Sequence[str] = (),
) -> Path:
    """Writes a fake model directory (tokenizer and chat template, no weights).

    Args:
        out_dir: Directory to write (created).
        template: ``hermes``, ``qwen3``, ``llama3``, ``glm45``, ``mistral`` or ``deepseek_v31`` (see the
            module docstring); the tokenizer carries that family's special tokens (:data:`TOKENIZER_SPECS`).
        context_length: ``max_position_embeddings`` written to ``config.json``.
        vocab_size: Target vocabulary size of the fake tokenizer.
        corpus: Extra tokenizer training texts (see :func:`build_fake_tokenizer`).

    Returns:
        ``out_dir``.
    """
    spec = TOKENIZER_SPECS[template]
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_fake_tokenizer(vocab_size, corpus=(*spec.corpus, *corpus), special_tokens=spec.special_tokens)
    tok.save(str(out_dir / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    (out_dir / "config.json").write_text(
        json.dumps(
            {
                "model_type": spec.model_type,
                "vocab_size": vocab,
                "max_position_embeddings": context_length,
                "eos_token_id": spec.special_tokens.index(spec.eos_token),
            }
        )
    )
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": spec.eos_token, "pad_token": spec.pad_token, "bos_token": spec.bos_token})
    )
    (out_dir / "chat_template.jinja").write_text(TEMPLATES[template])
    return out_dir


def tool_call_text(name: str, arguments: dict[str, Any], *, text: str = "", reasoning: str | None = None) -> str:
    """A Hermes completion: optional ``<think>`` block, text, then one tool call."""
    head = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    call = json.dumps({"name": name, "arguments": arguments})
    sep = "\n" if text else ""
    return f"{head}{text}{sep}<tool_call>\n{call}\n</tool_call>"


def final_text(text: str, *, reasoning: str | None = None) -> str:
    """A Hermes completion of plain text (optionally after a ``<think>`` block)."""
    head = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    return head + text


Call = tuple[str, dict[str, Any]]  # a tool call: name, arguments


def _hermes_calls(text: str, calls: Sequence[Call]) -> str:
    blocks = "".join(f"\n<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)
    return text + blocks if text else blocks.lstrip("\n")


def _llama3_calls(text: str, calls: Sequence[Call]) -> str:
    return f"{text}\n<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def _glm45_calls(text: str, calls: Sequence[Call]) -> str:
    out = text
    for name, arguments in calls:
        args = "".join(f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>" for k, v in arguments.items())
        out += f"\n<tool_call>{name}{args}\n</tool_call>"
    return out


def _mistral_calls(text: str, calls: Sequence[Call]) -> str:
    return text + "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}" for n, a in calls)


def _deepseek_v31_calls(text: str, calls: Sequence[Call]) -> str:
    block = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a)}<｜tool▁call▁end｜>" for n, a in calls)
    return f"{text}<｜tool▁calls▁begin｜>{block}<｜tool▁calls▁end｜>"


@dataclass(frozen=True)
class FamilyFormat:
    """How a model of one family writes a scripted turn, as token ids of a fake model directory
    of that family (:func:`build_fake_model_dir`), the end token included.

    Attributes:
        template: The fake model directory's template.
        tool_result: What the template writes once per tool result (counted in a prompt).
        calls: The text of a turn that says ``text``, then makes the calls (name, arguments).
        call_end: The token the model ends a turn of calls with.
        text_end: The token it ends an answer with.
        think: How it writes reasoning before its text (None: the family has no reasoning
            after its default generation prompt).
    """

    template: str
    tool_result: str
    calls: Callable[[str, Sequence[Call]], str]
    call_end: str
    text_end: str
    think: Callable[[str], str] | None = None

    def results(self, prompt_text: str) -> int:
        """How many tool results a prompt (decoded with special tokens) holds."""
        return prompt_text.count(self.tool_result)

    def call_ids(
        self, tok: Any, text: str, calls: Sequence[Call], reasoning: str = "", *, odd: bool = False
    ) -> list[int]:
        """A turn of (reasoning, where the family has it,) text and calls, in ``tok``'s ids (a
        ``tokenizers.Tokenizer``); with ``odd``, ``text`` spelled one token per character (ids
        the tokenizer would not produce: re-tokenising the turn would show)."""
        if not odd or not text:
            return self._ids(tok, self._head(reasoning) + self.calls(text, calls), self.call_end)
        head = tok.encode(self._head(reasoning), add_special_tokens=False).ids
        spelled = [t for ch in text for t in tok.encode(ch, add_special_tokens=False).ids]
        rest = self.calls(text, calls)[len(text) :]
        return [*head, *spelled, *self._ids(tok, rest, self.call_end)]

    def answer_ids(self, tok: Any, text: str, reasoning: str = "") -> list[int]:
        """An answer, in ``tok``'s ids."""
        return self._ids(tok, self._head(reasoning) + text, self.text_end)

    def _head(self, reasoning: str) -> str:
        return self.think(reasoning) if reasoning and self.think is not None else ""

    @staticmethod
    def _ids(tok: Any, text: str, end: str) -> list[int]:
        end_id = tok.token_to_id(end)
        assert end_id is not None, f"the tokenizer has no {end}"
        return [*tok.encode(text, add_special_tokens=False).ids, end_id]


#: Family name (the proxy's) → how its model writes reasoning, a call and an answer.
FAMILY_FORMATS: dict[str, FamilyFormat] = {
    "hermes": FamilyFormat(
        "hermes", "<tool_response>", _hermes_calls, "<|im_end|>", "<|im_end|>", lambda r: f"<think>\n{r}\n</think>\n\n"
    ),
    "llama3": FamilyFormat("llama3", "<|start_header_id|>ipython", _llama3_calls, "<|eom_id|>", "<|eot_id|>"),
    # a GLM-4.5 turn ends with the token that opens the next message: the tool results' after calls
    "glm45": FamilyFormat(
        "glm45", "<tool_response>", _glm45_calls, "<|observation|>", "<|user|>", lambda r: f"\n<think>{r}</think>\n"
    ),
    "mistral": FamilyFormat("mistral", "[TOOL_RESULTS]", _mistral_calls, "</s>", "</s>"),
    # reasoning only in thinking mode (the generation prompt opens it): not scripted here
    "deepseek_v31": FamilyFormat(
        "deepseek_v31", "<｜tool▁output▁begin｜>", _deepseek_v31_calls, "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    ),
}


@dataclass
class SeenRequest:
    """A ``Generate`` request the fake received.

    Attributes:
        request_id: Its request id.
        prompt_ids: The prompt ids.
        sampling: Its sampling parameters.
        sampled_ids: What the fake streamed back.
        logprobs: The logprobs it streamed back.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: common_pb2.SamplingParams
    sampled_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


Script = Callable[[list[int]], "Completion"]
#: A scripted completion: text (tokenized, then the model's EOS), or the exact ids to stream.
Completion = str | Sequence[int]


class ScriptedInferenceServer(inference_pb2_grpc.InferenceServiceServicer):
    """A **fake** inference service that streams the tokens of scripted completion texts.

    Args:
        model_dir: A directory from :func:`build_fake_model_dir`.
        completions: Completions answered in order: a text is tokenized and followed by
            the model's EOS (``tokenizer_config.json``'s ``eos_token``: ``<|im_end|>``,
            ``<|eot_id|>``); token ids are streamed as they are (end token included);
            ``default``, a callable ``(prompt_ids) -> text``, answers every call once the
            list is used up.
        policy_version: Reported on every token.
        tokens_per_message: Token ids per streamed message.
        token_delay_s: Sleep between streamed messages, seconds.
        model_name: Reported model name.
        keep_requests: Record each request in :attr:`seen` (off in benchmarks,
            where it would hold every prompt).
    """

    def __init__(
        self,
        model_dir: Path,
        completions: Sequence[Completion] = (),
        *,
        default: Script | None = None,
        policy_version: int = 3,
        tokens_per_message: int = 1,
        token_delay_s: float = 0.0,
        model_name: str = "fake-model",
        keep_requests: bool = True,
    ) -> None:
        from tokenizers import Tokenizer

        self.model_dir = model_dir
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._queue: deque[Completion] = deque(completions)
        self._default = default
        self.policy_version = policy_version
        self.tokens_per_message = tokens_per_message
        self.token_delay_s = token_delay_s
        self.model_name = model_name
        self.keep_requests = keep_requests
        self.seen: list[SeenRequest] = []
        self.fail_next: list[grpc.StatusCode] = []
        self.fail_after_tokens: int | None = None
        #: When false, ``PushWeights`` answers UNIMPLEMENTED (a server older than the RPC).
        self.serves_push_weights = True
        #: Bytes received by each ``PushWeights`` call.
        self.pushed_bytes: list[int] = []
        #: When set, the next generation streams one logprob fewer than token ids (a broken engine).
        self.short_logprobs = False
        #: When set, the next generation streams every logprob with its last message, none with
        #: the others (the totals match, the positions do not: a broken engine).
        self.misplaced_logprobs = False
        config = model_dir / "tokenizer_config.json"
        eos_token = json.loads(config.read_text()).get("eos_token") if config.is_file() else None
        eos_token = eos_token if isinstance(eos_token, str) else "<|im_end|>"
        eos = self._tok.token_to_id(eos_token)
        assert eos is not None, f"the fake tokenizer has no {eos_token}"
        self.eos_id = int(eos)
        self._server: GrpcServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    # --- scripting -------------------------------------------------------------

    def script(self, *completions: Completion) -> None:
        """Appends completions (texts or token ids) to answer."""
        self._queue.extend(completions)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with the fake tokenizer."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    @staticmethod
    def logprob(index: int) -> float:
        """The deterministic logprob reported for the token at ``index`` of a completion."""
        return -0.125 * (1 + index % 7)

    # --- InferenceService ------------------------------------------------------

    async def GetModelInfo(
        self, request: inference_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.GetModelInfoResponse:
        """Describes the fake model directory."""
        template = (self.model_dir / "chat_template.jinja").read_text()
        config = json.loads((self.model_dir / "config.json").read_text())
        tok_bytes = (self.model_dir / "tokenizer.json").read_bytes()
        return inference_pb2.GetModelInfoResponse(
            model_path=str(self.model_dir),
            model_name=self.model_name,
            vocab_size=int(config["vocab_size"]),
            context_length=int(config["max_position_embeddings"]),
            tokenizer_hash="sha256:" + hashlib.sha256(tok_bytes).hexdigest(),
            chat_template_hash="sha256:" + hashlib.sha256(template.encode()).hexdigest(),
            chat_template=template,
            policy_version=self.policy_version,
            engine="fake",
            eos_token_ids=[self.eos_id],
        )

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Streams the next scripted completion's token ids (a text's then the EOS)."""
        if self.fail_next:
            code = self.fail_next.pop(0)
            await context.abort(code, "fake inference failure")
        # Without keep_requests and a script (benchmarks) the prompt is never copied into a list:
        # for a 100k-token prompt that would cost the fake more than the caller being measured.
        prompt: Sequence[int] = request.prompt_token_ids
        if self.keep_requests:
            kept = list(prompt)
            prompt = kept
            seen = SeenRequest(request.request_id, kept, request.sampling)
            self.seen.append(seen)
        else:
            seen = SeenRequest(request.request_id, [], request.sampling)
        scripted: Completion
        if self._queue:
            scripted = self._queue.popleft()
        elif self._default is not None:
            scripted = self._default(prompt if isinstance(prompt, list) else list(prompt))
        else:
            scripted = "OK."
        ids = [*self.encode(scripted), self.eos_id] if isinstance(scripted, str) else list(scripted)
        max_tokens = request.sampling.max_tokens or len(ids)
        finish = common_pb2.FINISH_REASON_STOP
        if len(ids) > max_tokens:
            ids = ids[:max_tokens]
            finish = common_pb2.FINISH_REASON_LENGTH
        step = max(1, self.tokens_per_message)
        held: list[float] = []
        # taken by this generation when it starts (a generation the caller has dropped, still
        # streaming its rest, must not take the next one's)
        short, self.short_logprobs = self.short_logprobs, False
        misplaced, self.misplaced_logprobs = self.misplaced_logprobs, False
        for start in range(0, len(ids), step):
            if self.fail_after_tokens is not None and start >= self.fail_after_tokens:
                self.fail_after_tokens = None
                await context.abort(grpc.StatusCode.UNAVAILABLE, "fake inference died mid-stream")
            chunk = ids[start : start + step]
            lps = [self.logprob(start + i) for i in range(len(chunk))]
            if short and lps:
                short = False
                lps.pop()
            if misplaced:
                held = [*held, *lps] if start else lps
                lps = held if start + step >= len(ids) else []
            seen.sampled_ids.extend(chunk)
            seen.logprobs.extend(lps)
            msg = inference_pb2.GenerateResponse(
                token_ids=chunk, logprobs=lps, policy_versions=[self.policy_version] * len(chunk)
            )
            if start + step >= len(ids):
                msg.finish_reason = finish
                msg.usage.prompt_tokens = len(prompt)
                msg.usage.completion_tokens = len(ids)
            yield msg
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)

    async def Abort(
        self, request: inference_pb2.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.AbortResponse:
        """Nothing to abort in a fake; answers found = false."""
        return inference_pb2.AbortResponse(found=False)

    async def Pause(
        self, request: inference_pb2.PauseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.PauseResponse:
        """A fake pauses nothing."""
        return inference_pb2.PauseResponse(in_flight=0)

    async def Resume(
        self, request: inference_pb2.ResumeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.ResumeResponse:
        """A fake resumes nothing."""
        return inference_pb2.ResumeResponse()

    async def UpdateWeights(
        self, request: inference_pb2.UpdateWeightsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.UpdateWeightsResponse:
        """Only the reported policy version changes (there are no weights)."""
        self.policy_version = request.version
        return inference_pb2.UpdateWeightsResponse(version=request.version)

    async def PushWeights(
        self,
        request_iterator: AsyncIterator[inference_pb2.PushWeightsRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> inference_pb2.PushWeightsResponse:
        """Reads the stream to its end and counts its bytes; the reported policy version becomes
        the header's (there are no weights). UNIMPLEMENTED unless :attr:`serves_push_weights`."""
        version, received = 0, 0
        async for message in request_iterator:
            if message.WhichOneof("part") == "header":
                version = message.header.version
            else:
                received += len(message.chunk)
        if not self.serves_push_weights:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "PushWeights is not implemented by this server")
        self.pushed_bytes.append(received)
        self.policy_version = version
        return inference_pb2.PushWeightsResponse(version=version, bytes=received)

    # --- serving ---------------------------------------------------------------

    async def start(self, port: int = 0) -> int:
        """Serves on 127.0.0.1 in the running event loop; returns the port."""
        name = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
        self._server = GrpcServer(
            GrpcServerSettings(host="127.0.0.1", port=port, graceful_shutdown_s=0.5),
            [name],
            [lambda s: inference_pb2_grpc.add_InferenceServiceServicer_to_server(self, s)],
        )
        self.port = await self._server.start()
        await self._server.set_serving(True)
        return self.port

    async def stop(self) -> None:
        """Stops serving."""
        if self._server is not None:
            await self._server.stop()
            self._server = None

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def start_in_thread(self, port: int = 0) -> int:
        """Serves from a background thread with its own event loop (for synchronous tests)."""
        started: Future[int] = Future()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                started.set_result(self._loop.run_until_complete(self.start(port)))
            except BaseException as exc:  # report start failures to the caller
                started.set_exception(exc)
                return
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fake-inference", daemon=True)
        self._thread.start()
        return started.result(timeout=30)

    def stop_thread(self) -> None:
        """Stops a server started with :meth:`start_in_thread`."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None
        self._thread = None
