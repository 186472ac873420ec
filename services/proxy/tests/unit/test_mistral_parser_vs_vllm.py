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
import string
from dataclasses import dataclass, field
from typing import Any

import pytest

from openforge_core.chat_formats import MISTRAL_SPECIAL_TOKENS
from openforge_proxy.domain.families import MistralFamily
from openforge_testing.fakes import build_fake_tokenizer

pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")

COMPLETIONS = 1200

_UNICODE = "héllo wörld ñandú 日本語 テスト 中文 Ωμέγα ✓ 🚀 😀 ü ß"
_KEY_CHARS = string.ascii_letters + "_"
_STR_CHARS = string.ascii_letters + string.digits + " .,:;!?-_/'\"\\\n\t{}[]<>" + _UNICODE
_WORDS = "the file is read and then we run tests in the repo; check output: ok, done".split() + _UNICODE.split()
_TOOLS = ("Bash", "read_file", "write", "search.web", "exec", "get_weather", "ツール", "edit-file")


@dataclass
class Parsed:
    """What one parse found: text and calls as (name, arguments)."""

    text: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    """A generated completion and what it holds."""

    completion: str
    calls: list[tuple[str, dict[str, Any]]]
    before: str  # text before the first call
    after: str  # text after the last call
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
        words.insert(rng.randrange(len(words) + 1), rng.choice(("{x}", "[b]", "a < b", "[/", "[TOOL", '{"k": 1}')))
    text = ""
    for w in words:
        text += w + rng.choice((" ", " ", " ", "\n", ", ", ". "))
    return text.strip()


def _call_text(rng: random.Random, name: str, args: dict[str, Any]) -> str:
    compact = rng.random() < 0.3
    body = json.dumps(args, ensure_ascii=rng.random() < 0.2, separators=(",", ":") if compact else None)
    return f"[TOOL_CALLS]{name}[ARGS]{body}"


def _case(rng: random.Random) -> Case:
    n_calls = rng.choice((0, 1, 1, 2, 3))
    before = _prose(rng) if n_calls == 0 or rng.random() < 0.5 else ""
    names = rng.sample(_TOOLS, n_calls)
    calls = [(name, _arguments(rng)) for name in names]
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
        after = _prose(rng)
        body += rng.choice(("", "\n", " ")) + after
    elif difference == "unclosed":
        body += _call_text(rng, rng.choice(_TOOLS), {"path": "a.txt", "n": [1, 2]})[:-1]
    return Case(body, calls, before, after, difference)


def _ours(case: Case, rng: random.Random | None) -> Parsed:
    parser = MistralFamily().parser("")
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
        assert ev.kind != "reasoning"
        if ev.kind == "text":
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


def _vllm(tok: Any, case: Case) -> tuple[list[tuple[str, Any]], list[str], str | None]:
    """vLLM's calls (parsed arguments), their raw arguments, and its content."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.mistral_tool_parser import MistralToolParser

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in _TOOLS]
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
