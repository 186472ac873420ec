"""The proxy's ``mistral`` parser against vLLM's ``mistral`` tool parser, on the same generated completions.

A seeded generator writes Mistral v11 completions (text, then calls
``[TOOL_CALLS]NAME[ARGS]{...}`` with string, number, boolean, null and nested JSON arguments,
unicode, brackets and braces inside strings, several calls per turn, calls with no arguments),
each parsed by the proxy's streaming parser (fed once whole and once in random chunks: the
results must be the same) and by vLLM's ``mistral`` tool parser over a tokenizer that carries
``[ARGS]`` (so vLLM reads the v11 syntax, as with Mistral Small 3.2 or Devstral). They must
agree on the tool calls (names and parsed arguments) and on the text before the first call.

Deliberate differences, each asserted as such:

* Text after a call: vLLM drops what follows a call's JSON; the proxy keeps it as text, so a
  harness loses nothing the model said.
* Whitespace: the proxy strips the text at its edges; text is compared stripped.
* A call whose object never closed (generation cut): vLLM passes the cut arguments on as the
  call's arguments; the proxy passes what the model wrote on as text, as a call it did not
  finish.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import pytest
from parser_cases import TOOLS, Parsed, arguments, parse_twice, prose

from openforge_core.chat_formats import MISTRAL_SPECIAL_TOKENS
from openforge_proxy.domain.families import MistralFamily
from openforge_testing.fakes import build_fake_tokenizer

pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")

COMPLETIONS = 1200
LOOKALIKES = ("{x}", "[b]", "a < b", "[/", "[TOOL", '{"k": 1}')


@dataclass(frozen=True)
class Case:
    """A generated completion and what it holds."""

    completion: str
    calls: list[tuple[str, dict[str, Any]]]
    before: str  # text before the first call
    after: str  # text after the last call
    difference: str = ""  # the deliberate difference it shows ("" for none)


def _call_text(rng: random.Random, name: str, args: dict[str, Any]) -> str:
    compact = rng.random() < 0.3
    body = json.dumps(args, ensure_ascii=rng.random() < 0.2, separators=(",", ":") if compact else None)
    return f"[TOOL_CALLS]{name}[ARGS]{body}"


def _case(rng: random.Random) -> Case:
    n_calls = rng.choice((0, 1, 1, 2, 3))
    before = prose(rng, LOOKALIKES) if n_calls == 0 or rng.random() < 0.5 else ""
    names = rng.sample(TOOLS, n_calls)
    calls = [(name, arguments(rng)) for name in names]
    difference = ""
    r = rng.random()
    if n_calls and r < 0.08:
        difference = "after"
    elif n_calls and r < 0.14:
        difference = "unclosed"
    body = before + rng.choice(("", "\n", " ")) if before else ""
    body += "".join(_call_text(rng, name, args) for name, args in calls)
    after = ""
    if difference == "after":
        after = prose(rng, LOOKALIKES)
        body += rng.choice(("", "\n", " ")) + after
    elif difference == "unclosed":
        body += _call_text(rng, rng.choice(TOOLS), {"path": "a.txt", "n": [1, 2]})[:-1]
    return Case(body, calls, before, after, difference)


def _parse_ours(case: Case, seed: int) -> Parsed:
    ours = parse_twice(lambda: MistralFamily().parser(""), case.completion, seed)
    assert not ours.reasoning
    return ours


def _vllm(tok: Any, case: Case) -> tuple[list[tuple[str, Any]], list[str], str | None]:
    """vLLM's calls (parsed arguments), their raw arguments, and its content."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.mistral_tool_parser import MistralToolParser

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in TOOLS]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
    info = MistralToolParser(tok).extract_tool_calls(case.completion, request)
    raw = [c.function.arguments for c in info.tool_calls]
    calls = []
    for c in info.tool_calls:
        try:
            calls.append((c.function.name, json.loads(c.function.arguments)))
        except json.JSONDecodeError:
            calls.append((c.function.name, c.function.arguments))
    return calls, raw, info.content


def test_mistral_parser_agrees_with_vllms_mistral_parser() -> None:
    import transformers

    fast: Any = transformers.PreTrainedTokenizerFast  # untyped
    tok = fast(tokenizer_object=build_fake_tokenizer(special_tokens=MISTRAL_SPECIAL_TOKENS))
    rng = random.Random(11)
    seen: dict[str, int] = {}
    for n in range(COMPLETIONS):
        case = _case(rng)
        seen[case.difference] = seen.get(case.difference, 0) + 1
        ours = _parse_ours(case, n)
        theirs, raw, content = _vllm(tok, case)
        where = f"completion {n}: {case.completion!r}"
        before = (content or "").strip()
        assert before == case.before.strip(), where
        if case.difference == "unclosed":
            # vLLM: the cut object as the last call's arguments; the proxy: text
            assert ours.calls == theirs[:-1] == case.calls and len(theirs) == len(case.calls) + 1, where
            assert not raw[-1].endswith("}"), where
            cut = case.completion[case.completion.rindex("[TOOL_CALLS]") :]
            assert ours.text.startswith(before) and ours.text.endswith(cut), where
            continue
        assert ours.calls == theirs == case.calls, where
        if case.difference == "after":
            # vLLM drops the text after the calls; the proxy keeps it
            assert ours.text[len(before) :].strip() == case.after.strip(), where
        else:
            assert ours.text == before, where
    assert seen[""] >= 1000 and all(seen.get(d, 0) > 10 for d in ("after", "unclosed"))
