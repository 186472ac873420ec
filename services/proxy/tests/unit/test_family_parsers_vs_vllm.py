"""The proxy's family parsers against vLLM's, on the same generated completions.

For each family, a seeded generator writes completions of the family's format (tool calls
with nested JSON, unicode and escapes, several calls per turn, empty arguments, text before
and after, reasoning present or absent), and each is parsed by the proxy's streaming parser
(fed once whole and once in random chunks: the results must be the same) and by vLLM's
parsers as a vLLM server runs them on a finished completion (the reasoning parser, then the
tool parser on the content it leaves). They must agree on the tool calls (names and parsed
arguments), on the reasoning and, where both define it, on the text.

``hermes``: vLLM's ``qwen3`` reasoning parser (``enable_thinking`` on when the completion
or its generation prompt opens ``<think>``) and ``hermes`` tool parser. Deliberate
differences, each asserted as such:

* Text after a call: vLLM's content is only the text before the first ``<tool_call>``; the
  proxy keeps what follows a call as text too, so a harness loses nothing the model said.
* Whitespace: vLLM keeps the newlines the template writes around ``<think>`` blocks and before
  ``<tool_call>``; the proxy drops them. Reasoning is compared without its edge newlines and
  text without its edge whitespace.
* A malformed call among valid ones: vLLM then returns no call at all (all the content as
  text); the proxy returns the valid calls and the malformed block as text.
* ``"parameters"`` instead of ``"arguments"``: vLLM fails on the missing key (no call); the
  proxy reads the call, as its ``llama3`` family and vLLM's ``llama3_json`` do.
* A call whose ``</tool_call>`` never came (generation cut): vLLM reads it when its JSON is
  complete; the proxy passes it on as text, as a call the model did not finish.

``llama3``: vLLM's ``llama3_json`` tool parser's non-streaming rules (its streaming variant
only looks for calls at the very start and assumes ``"; "`` separators; the proxy follows the
non-streaming rules, the ones documented for the format). Deliberate difference: with calls,
vLLM returns no content; the proxy keeps the text around the calls (less ``<|python_tag|>``
and the ``;`` separators). Without calls both return the whole completion as text.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any

import pytest
from parser_cases import Parsed, parse_twice

from openforge_core.chat_formats import LLAMA3_SPECIAL_TOKENS
from openforge_proxy.domain.families import Family, HermesFamily, Llama3Family
from openforge_testing.fakes import build_fake_tokenizer

pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")

COMPLETIONS = 1200

LLAMA_SPECIAL_TOKENS = LLAMA3_SPECIAL_TOKENS

_UNICODE = "héllo wörld ñandú 日本語 テスト 中文 Ωμέγα ✓ 🚀 😀 ü ß"
_KEY_CHARS = string.ascii_letters + "_"
_STR_CHARS = string.ascii_letters + string.digits + " .,:;!?-_/'\"\\\n\t{}[]<>" + _UNICODE
_WORDS = "the file is read and then we run tests in the repo; check output: ok, done".split() + _UNICODE.split()


@dataclass(frozen=True)
class Case:
    """A generated completion and what it holds."""

    completion: str
    generation_prompt: str
    calls: list[tuple[str, Any]]
    reasoning: str | None  # None: no reasoning block
    before: str  # text before the first call
    after: str  # text after the last call
    difference: str = ""  # the deliberate difference it shows ("" for none)


def _string(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(_STR_CHARS) for _ in range(rng.randint(0, n)))


def _value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(("str", "str", "int", "float", "bool", "null", "list", "dict") if depth < 3 else ("str", "int"))
    if kind == "str":
        return _string(rng)
    if kind == "int":
        return rng.randint(-(10**12), 10**12)
    if kind == "float":
        return round(rng.uniform(-1e6, 1e6), rng.randint(0, 6))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return _arguments(rng, depth + 1)


def _arguments(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    n = 0 if rng.random() < 0.15 else rng.randint(1, 5)
    return {"".join(rng.choice(_KEY_CHARS) for _ in range(rng.randint(1, 10))): _value(rng, depth) for _ in range(n)}


def _dumps(rng: random.Random, obj: Any) -> str:
    return json.dumps(
        obj,
        ensure_ascii=rng.random() < 0.3,
        indent=2 if rng.random() < 0.2 else None,
        separators=(",", ":") if rng.random() < 0.2 else None,
    )


def _call_json(rng: random.Random, name: str, args: dict[str, Any], key: str) -> str:
    items = [("name", name), (key, args)]
    if rng.random() < 0.2:
        items.reverse()
    return _dumps(rng, dict(items))


def _name(rng: random.Random) -> str:
    return rng.choice(("Bash", "read_file", "write", "search.web", "exec", "get_weather", "ツール", "edit-file"))


def _prose(rng: random.Random, *, braces: bool = True, n: int = 12) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(1, n))]
    if braces and rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(("{x}", "<b>", "a < b", "</", "<tool", '{"k": 1}')))
    text = ""
    for w in words:
        text += w + rng.choice((" ", " ", " ", "\n", ", ", ". "))
    return text.strip()


# --- hermes -----------------------------------------------------------------


def _hermes_case(rng: random.Random) -> Case:
    mode = rng.choice(("open", "inline", "none"))
    reasoning = None if mode == "none" else ("" if rng.random() < 0.1 else _prose(rng, n=30))
    head = ""
    prompt = "<|im_start|>assistant\n"
    if mode == "open":
        prompt += "<think>\n"
        head = f"{reasoning}\n</think>\n\n"
    elif mode == "inline":
        head = f"<think>\n{reasoning}\n</think>\n\n"
    n_calls = rng.choice((0, 1, 1, 2, 3))
    before = _prose(rng) if n_calls == 0 or rng.random() < 0.5 else ""
    after = _prose(rng) if n_calls and rng.random() < 0.3 else ""
    calls = [(_name(rng), _arguments(rng)) for _ in range(n_calls)]
    difference = ""
    r = rng.random()
    if n_calls and r < 0.05:
        difference = "parameters"
    elif n_calls and r < 0.10:
        difference = "malformed"
    elif n_calls and r < 0.13:
        difference = "unclosed"
    body = before
    for i, (name, args) in enumerate(calls):
        if i or before:
            body += "\n"
        key = "parameters" if difference == "parameters" and i == 0 else "arguments"
        body += f"<tool_call>\n{_call_json(rng, name, args, key)}\n</tool_call>"
    if difference == "malformed":
        body += '\n<tool_call>\n{"name": "broken", "arguments": {"x": 1}\n</tool_call>'
    if after:
        body += "\n\n" + after
    if difference == "unclosed":
        name, args = _name(rng), _arguments(rng)
        body += f"\n<tool_call>\n{_call_json(rng, name, args, 'arguments')}\n"
    return Case(head + body, prompt, calls, reasoning, before, after, difference)


@pytest.fixture(scope="module")
def request_() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])


def _hf(special_tokens: tuple[str, ...] | None = None) -> Any:
    import transformers

    tok = build_fake_tokenizer() if special_tokens is None else build_fake_tokenizer(special_tokens=special_tokens)
    fast: Any = transformers.PreTrainedTokenizerFast  # untyped
    return fast(tokenizer_object=tok)


def _vllm_hermes(tok: Any, request: Any, case: Case) -> tuple[Parsed, str | None]:
    """vLLM's parse, and its content where it defines one."""
    from vllm.reasoning.qwen3_engine_reasoning_parser import Qwen3ParserReasoningAdapter
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    thinking = case.reasoning is not None
    reasoner = Qwen3ParserReasoningAdapter(tok, chat_template_kwargs={"enable_thinking": thinking})
    reasoning, content = reasoner.extract_reasoning(case.completion, request)
    info = Hermes2ProToolParser(tok).extract_tool_calls(content or "", request)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
    return Parsed((reasoning or "").strip("\n"), "", calls), info.content


def _parse_ours(family: Family, case: Case, seed: int) -> Parsed:
    return parse_twice(lambda: family.parser(case.generation_prompt), case.completion, seed)


def test_hermes_parser_agrees_with_vllms_hermes_and_qwen3_parsers(request_: Any) -> None:
    tok = _hf()
    family = HermesFamily()
    rng = random.Random(22)
    seen: dict[str, int] = {}
    for n in range(COMPLETIONS):
        case = _hermes_case(rng)
        seen[case.difference] = seen.get(case.difference, 0) + 1
        ours = _parse_ours(family, case, n)
        theirs, content = _vllm_hermes(tok, request_, case)
        where = f"completion {n}: {case.completion!r}"
        assert ours.reasoning == theirs.reasoning == (case.reasoning or "").strip("\n"), where
        if case.difference == "":
            assert ours.calls == theirs.calls == case.calls, where
            if ours.calls:
                # vLLM: the text before the first call; the proxy: that, then what follows
                before = (content or "").strip()
                assert before == case.before.strip(), where
                assert ours.text.startswith(before), where
                assert ours.text[len(before) :].strip() == case.after.strip(), where
            else:
                assert ours.text == (content or "").strip() == case.before.strip(), where
        elif case.difference == "parameters":
            assert ours.calls == case.calls and theirs.calls == [], where
        elif case.difference == "malformed":
            assert ours.calls == case.calls and theirs.calls == [], where
            assert '{"name": "broken"' in ours.text, where
        else:  # unclosed
            assert ours.calls == case.calls and len(theirs.calls) == len(case.calls) + 1, where
            assert ours.text.rstrip().endswith("}"), where
    assert seen[""] >= 1000 and all(seen.get(d, 0) > 10 for d in ("parameters", "malformed", "unclosed"))


# --- llama3 -----------------------------------------------------------------


def _llama_case(rng: random.Random) -> Case:
    tag = "<|python_tag|>"
    kind = rng.choices(("calls", "text", "no-call"), weights=(6, 2, 2))[0]
    if kind == "text":
        text = _prose(rng, braces=False, n=30)
        if rng.random() < 0.2:
            text = tag + text  # a built-in tool's call (``brave_search.call(...)``) is no JSON call
        return Case(text, "", [], None, text, "")
    if kind == "no-call":
        # braces that are no call: not JSON, JSON that is no call, or a call that is cut or
        # followed by one of those: then nothing is a call
        bad = rng.choice(("{x}", "{ 1 }", "{{", '{"k": 1}', '{"name": "f"}', "{}", '{"name": 3, "parameters": {}}'))
        name, args = _name(rng), _arguments(rng)
        call = _call_json(rng, name, args, "parameters")
        text = rng.choice(
            (
                f"{_prose(rng, braces=False)} {bad} {_prose(rng, braces=False)}",
                f"{call}; {bad}",
                f"{call[:-1]}",
                f"{tag}{call}; {call[: rng.randint(1, len(call) - 1)]}",
                f"{_prose(rng, braces=False)} {bad} {call}",
            )
        )
        return Case(text, "", [], None, text, "")
    calls = [(_name(rng), _arguments(rng)) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
    before = _prose(rng, braces=False) + rng.choice((" ", "\n", "\n\n")) if rng.random() < 0.25 else ""
    after = rng.choice((" ", "\n", "\n\n")) + _prose(rng, braces=False) if rng.random() < 0.2 else ""
    text = before + (tag if rng.random() < 0.5 else "")
    for i, (name, args) in enumerate(calls):
        if i:
            text += rng.choice(("; ", "; ", ";", ";\n", "\n; ", "\n"))
        text += _call_json(rng, name, args, rng.choice(("parameters", "parameters", "arguments")))
    text += after + rng.choice(("", "", "\n", " "))
    return Case(text, "", calls, None, before, after)


def test_llama3_parser_agrees_with_vllms_llama3_json_parser(request_: Any) -> None:
    from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser

    tok = _hf(LLAMA_SPECIAL_TOKENS)
    family = Llama3Family()
    rng = random.Random(3)
    with_calls = 0
    for n in range(COMPLETIONS):
        case = _llama_case(rng)
        ours = _parse_ours(family, case, n)
        info = Llama3JsonToolParser(tok).extract_tool_calls(case.completion, request_)
        theirs = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
        where = f"completion {n}: {case.completion!r}"
        assert ours.reasoning == "", where
        assert ours.calls == theirs == case.calls, where
        if ours.calls:
            with_calls += 1
            assert info.content is None, where  # vLLM drops the text; the proxy keeps it
            before, after = case.before.strip(), case.after.strip()
            assert ours.text.startswith(before), where
            assert ours.text[len(before) :].strip() == after, where
        else:
            assert info.content is not None, where
            assert ours.text == info.content.strip() == case.completion.strip(), where
    assert with_calls >= 600 and COMPLETIONS - with_calls >= 300
