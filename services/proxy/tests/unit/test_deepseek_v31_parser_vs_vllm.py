"""The proxy's ``deepseek_v31`` parser against vLLM's DeepSeek parsers, on the same generated completions.

A seeded generator writes DeepSeek-V3.1 completions: with ``thinking`` (the generation prompt
``<｜Assistant｜><think>``) reasoning up to ``</think>``, then text, then a block
``<｜tool▁calls▁begin｜>`` of calls ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``
(string, number, boolean, null and nested JSON arguments, unicode, braces and markers' look-alikes
inside strings, one to three calls) closed by ``<｜tool▁calls▁end｜>``. Each is parsed by the
proxy's streaming parser (fed once whole and once in random chunks: the results must be the same)
and by vLLM as its server does: the ``deepseek_v3`` reasoning parser (with the same ``thinking``)
and then the ``deepseek_v31`` tool parser on the content it leaves. They must agree on the
reasoning, the tool calls (names and parsed arguments) and the text before the block.

Deliberate differences, each asserted as such:

* Text after the block: vLLM drops it; the proxy keeps it, so a harness loses nothing the model said.
* Arguments that are not a JSON object: vLLM passes them on as the call's arguments; the proxy
  passes the call on as text (a harness never gets a call it cannot run).
* A call cut before ``<｜tool▁call▁end｜>`` (generation stopped): vLLM drops it; the proxy passes
  it on as text.
* Whitespace: the proxy strips the text at its edges; text is compared stripped.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field
from typing import Any

import pytest

from openforge_core.chat_formats import DEEPSEEK_V31_SPECIAL_TOKENS
from openforge_proxy.domain.families import DeepSeekV31Family
from openforge_testing.fakes import build_fake_tokenizer

pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")

COMPLETIONS = 1200
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
THINKING, PLAIN = "<｜Assistant｜><think>", "<｜Assistant｜></think>"

_UNICODE = "héllo wörld ñandú 日本語 テスト 中文 Ωμέγα ✓ 🚀 😀 ü ß"
_KEY_CHARS = string.ascii_letters + "_"
_STR_CHARS = string.ascii_letters + string.digits + " .,:;!?-_/'\"\\\n\t{}[]<>｜▁" + _UNICODE
_WORDS = "the file is read and then we run tests in the repo; check output: ok, done".split() + _UNICODE.split()
_TOOLS = ("Bash", "read_file", "write", "search.web", "exec", "get_weather", "ツール", "edit-file")


@dataclass
class Parsed:
    """What one parse found: reasoning, text and calls as (name, arguments)."""

    reasoning: str = ""
    text: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    """A generated completion and what it holds."""

    completion: str
    thinking: bool
    reasoning: str
    calls: list[tuple[str, dict[str, Any]]]
    before: str  # text before the block
    after: str  # text after the block
    difference: str = ""  # the deliberate difference it shows ("" for none)


def _string(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(_STR_CHARS) for _ in range(rng.randint(0, n)))


def _json_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(("str", "int", "float", "bool", "null", "list", "dict") if depth < 3 else ("str", "int"))
    if kind == "str":
        return _string(rng)
    if kind == "int":
        return rng.randint(-(10**12), 10**12)
    if kind == "float":
        return round(rng.uniform(-1e6, 1e6), rng.randint(1, 6)) + 0.5
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_key(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _key(rng: random.Random) -> str:
    return "".join(rng.choice(_KEY_CHARS) for _ in range(rng.randint(1, 10)))


def _arguments(rng: random.Random) -> dict[str, Any]:
    return {_key(rng): _json_value(rng, 0) for _ in range(0 if rng.random() < 0.15 else rng.randint(1, 4))}


def _prose(rng: random.Random, n: int = 12) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(1, n))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(("{x}", "<b>", "a < b", "<｜", "<think", '{"k": 1}')))
    text = ""
    for w in words:
        text += w + rng.choice((" ", " ", " ", "\n", ", ", ". "))
    return text.strip()


def _call_text(rng: random.Random, name: str, body: str) -> str:
    return f"{CALL_BEGIN}{name}{SEP}{body}{CALL_END}"


def _body(rng: random.Random, args: dict[str, Any]) -> str:
    compact = rng.random() < 0.3
    return json.dumps(args, ensure_ascii=rng.random() < 0.2, separators=(",", ":") if compact else None)


def _case(rng: random.Random) -> Case:
    thinking = rng.random() < 0.4
    reasoning = ("" if rng.random() < 0.1 else _prose(rng, n=30)) if thinking else ""
    n_calls = rng.choice((0, 1, 1, 2, 3))
    before = _prose(rng) if n_calls == 0 or rng.random() < 0.5 else ""
    calls = [(name, _arguments(rng)) for name in rng.sample(_TOOLS, n_calls)]
    difference = ""
    r = rng.random()
    if n_calls and r < 0.06:
        difference = "after"
    elif n_calls and r < 0.12:
        difference = "not_object"
    elif n_calls and r < 0.18:
        difference = "unclosed"
    body = (reasoning + "</think>") if thinking else ""
    body += before
    after = ""
    if n_calls:
        body += rng.choice(("", "\n", " ")) if before else ""
        body += CALLS_BEGIN + "".join(_call_text(rng, name, _body(rng, args)) for name, args in calls)
        if difference == "not_object":
            body += _call_text(rng, rng.choice(_TOOLS), rng.choice(('["x"]', "1", '"s"', "{oops}")))
        if difference == "unclosed":
            body += _call_text(rng, rng.choice(_TOOLS), '{"path": "a.txt"}')[: -len(CALL_END)]
        else:
            body += CALLS_END
        if difference == "after":
            after = _prose(rng)
            body += rng.choice(("", "\n", " ")) + after
    return Case(body, thinking, reasoning, calls, before, after, difference)


def _ours(case: Case, rng: random.Random | None) -> Parsed:
    parser = DeepSeekV31Family().parser(THINKING if case.thinking else PLAIN)
    events = []
    text = case.completion
    if rng is None:
        events.extend(parser.feed(text))
    else:
        i = 0
        while i < len(text):
            k = rng.choice((1, 1, 2, 3, 5, 8, 13, 40))
            events.extend(parser.feed(text[i : i + k]))
            i += k
    events.extend(parser.finish())
    out = Parsed()
    for ev in events:
        if ev.kind == "reasoning":
            out.reasoning += ev.text
        elif ev.kind == "text":
            out.text += ev.text
        else:
            assert ev.call is not None
            assert json.loads(ev.call.arguments_json) == ev.call.arguments
            out.calls.append((ev.call.name, ev.call.arguments))
    return out


def _parse_ours(case: Case, seed: int) -> Parsed:
    whole = _ours(case, None)
    chunked = _ours(case, random.Random(seed))
    assert chunked == whole, "the result depends on how the completion is cut"
    return whole


def _vllm(tok: Any, case: Case) -> tuple[Parsed, list[str], str | None]:
    """vLLM's parse (reasoning parser, then tool parser on its content), the calls' raw
    arguments, and its content."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning.deepseek_v3_reasoning_parser import DeepSeekV3ReasoningParser
    from vllm.tool_parsers.deepseekv31_tool_parser import DeepSeekV31ToolParser

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in _TOOLS]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
    reasoner = DeepSeekV3ReasoningParser(tok, chat_template_kwargs={"thinking": case.thinking})
    reasoning, content = reasoner.extract_reasoning(case.completion, request)
    info = DeepSeekV31ToolParser(tok).extract_tool_calls(content or "", request)
    raw = [c.function.arguments for c in info.tool_calls]
    calls = []
    for c in info.tool_calls:
        try:
            calls.append((c.function.name, json.loads(c.function.arguments)))
        except json.JSONDecodeError:
            calls.append((c.function.name, c.function.arguments))
    return Parsed(reasoning or "", "", calls), raw, info.content


def test_deepseek_v31_parser_agrees_with_vllms_deepseek_parsers() -> None:
    import transformers

    fast: Any = transformers.PreTrainedTokenizerFast  # untyped
    tok = fast(tokenizer_object=build_fake_tokenizer(special_tokens=DEEPSEEK_V31_SPECIAL_TOKENS))
    rng = random.Random(13)
    seen: dict[str, int] = {}
    for n in range(COMPLETIONS):
        case = _case(rng)
        seen[case.difference] = seen.get(case.difference, 0) + 1
        ours = _parse_ours(case, n)
        theirs, raw, content = _vllm(tok, case)
        where = f"completion {n}: {case.completion!r}"
        assert ours.reasoning == theirs.reasoning == case.reasoning, where
        before = (content or "").strip()
        if not case.calls:
            assert ours.text == before == case.before.strip(), where
            assert ours.calls == theirs.calls == [], where
            continue
        assert before == case.before.strip(), where
        if case.difference == "not_object":
            # vLLM: the arguments as written; the proxy: the call as text, after the others
            assert theirs.calls[:-1] == ours.calls == case.calls and len(theirs.calls) == len(case.calls) + 1, where
            last = case.completion[case.completion.rindex(CALL_BEGIN) : case.completion.rindex(CALLS_END)]
            assert raw[-1] == last[last.index(SEP) + len(SEP) : -len(CALL_END)], where
            assert ours.text == before + last, where
            continue
        assert ours.calls == theirs.calls == case.calls, where
        if case.difference == "unclosed":
            # vLLM drops the cut call; the proxy passes it on as text
            cut = case.completion[case.completion.rindex(CALL_BEGIN) :]
            assert ours.text == before + cut, where
        elif case.difference == "after":
            # vLLM drops the text after the block; the proxy keeps it
            assert ours.text[len(before) :].strip() == case.after.strip(), where
        else:
            assert ours.text == before, where
    assert seen[""] >= 1000 and all(seen.get(d, 0) > 10 for d in ("after", "not_object", "unclosed"))
