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
from dataclasses import dataclass
from typing import Any

import pytest
from parser_cases import STR_CHARS, TOOLS, Parsed, arguments, parse_twice, prose

from openforge_core.chat_formats import DEEPSEEK_V31_SPECIAL_TOKENS
from openforge_proxy.domain.families import DeepSeekV31Family
from openforge_testing.fakes import build_fake_tokenizer

pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")

COMPLETIONS = 1200
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
THINKING, PLAIN = "<｜Assistant｜><think>", "<｜Assistant｜></think>"
#: Strings in arguments also hold the halves of DeepSeek's markers.
CHARS = STR_CHARS + "｜▁"
LOOKALIKES = ("{x}", "<b>", "a < b", "<｜", "<think", '{"k": 1}')


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


def _call_text(name: str, body: str) -> str:
    return f"{CALL_BEGIN}{name}{SEP}{body}{CALL_END}"


def _body(rng: random.Random, args: dict[str, Any]) -> str:
    compact = rng.random() < 0.3
    return json.dumps(args, ensure_ascii=rng.random() < 0.2, separators=(",", ":") if compact else None)


def _case(rng: random.Random) -> Case:
    thinking = rng.random() < 0.4
    reasoning = ("" if rng.random() < 0.1 else prose(rng, LOOKALIKES, n=30)) if thinking else ""
    n_calls = rng.choice((0, 1, 1, 2, 3))
    before = prose(rng, LOOKALIKES) if n_calls == 0 or rng.random() < 0.5 else ""
    calls = [(name, arguments(rng, CHARS)) for name in rng.sample(TOOLS, n_calls)]
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
        body += CALLS_BEGIN + "".join(_call_text(name, _body(rng, args)) for name, args in calls)
        if difference == "not_object":
            body += _call_text(rng.choice(TOOLS), rng.choice(('["x"]', "1", '"s"', "{oops}")))
        if difference == "unclosed":
            body += _call_text(rng.choice(TOOLS), '{"path": "a.txt"}')[: -len(CALL_END)]
        else:
            body += CALLS_END
        if difference == "after":
            after = prose(rng, LOOKALIKES)
            body += rng.choice(("", "\n", " ")) + after
    return Case(body, thinking, reasoning, calls, before, after, difference)


def _parse_ours(case: Case, seed: int) -> Parsed:
    return parse_twice(lambda: DeepSeekV31Family().parser(THINKING if case.thinking else PLAIN), case.completion, seed)


def _vllm(tok: Any, case: Case) -> tuple[Parsed, list[str], str | None]:
    """vLLM's parse (reasoning parser, then tool parser on its content), the calls' raw
    arguments, and its content."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning.deepseek_v3_reasoning_parser import DeepSeekV3ReasoningParser
    from vllm.tool_parsers.deepseekv31_tool_parser import DeepSeekV31ToolParser

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in TOOLS]
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
