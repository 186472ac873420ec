"""The proxy's ``glm45`` parser against vLLM's ``glm45`` parsers, on the same generated completions.

A seeded generator writes GLM-4.5 completions (``<think>`` reasoning present or absent,
calls ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>``
with string, number, boolean, null and nested JSON values, unicode, several calls per turn,
calls with no arguments, text before and after), each parsed by the proxy's streaming parser
(fed once whole and once in random chunks: the results must be the same) and by vLLM's
``glm45`` reasoning parser then its ``glm45`` tool parser on the content it leaves, as a vLLM
server runs them (``enable_thinking`` on when the completion or its generation prompt opens
``<think>``; the request carries the tools, whose schemas type each parameter). They must
agree on the tool calls (names and parsed arguments), on the reasoning, and on the text
before the first call.

Deliberate differences, each asserted as such:

* Text after a call: vLLM's content is only the text before the first ``<tool_call>``; the
  proxy keeps what follows a call as text too, so a harness loses nothing the model said.
* Whitespace: vLLM keeps the newlines the template writes after ``</think>`` and before
  ``<tool_call>``, and a leading newline of the reasoning; the proxy drops them. Reasoning is
  compared without its edge newlines and text without its edge whitespace.
* A parameter the tool's schema does not type: vLLM keeps its value as a string; the proxy
  reads it as JSON when it parses as JSON (GLM's own rule for a parameter not known to be a
  string), so ``<arg_value>3</arg_value>`` is ``3``.
* A call of a tool the request did not offer: vLLM drops it (and the text after it); the
  proxy passes the call on, and the harness answers that the tool does not exist.
* A call whose ``</tool_call>`` never came (generation cut): vLLM reads what arrived as a
  call; the proxy passes it on as text, as a call the model did not finish.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any

import pytest
from parser_cases import Parsed, parse_twice

from openforge_core.chat_formats import GLM45_SPECIAL_TOKENS
from openforge_proxy.domain.families import Glm45Family
from openforge_testing.fakes import build_fake_tokenizer

pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")

COMPLETIONS = 1200
PROMPT = "<|assistant|>"

_UNICODE = "héllo wörld ñandú 日本語 テスト 中文 Ωμέγα ✓ 🚀 😀 ü ß"
_KEY_CHARS = string.ascii_letters + "_"
_STR_CHARS = string.ascii_letters + string.digits + " .,:;!?-_/'\"\\\n\t{}[]<>" + _UNICODE
_WORDS = "the file is read and then we run tests in the repo; check output: ok, done".split() + _UNICODE.split()
_TOOLS = ("Bash", "read_file", "write", "search.web", "exec", "get_weather", "ツール", "edit-file")


@dataclass(frozen=True)
class Tool:
    """An offered tool as the parser reads it (name and argument schema)."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Case:
    """A generated completion, the tools offered, and what it holds."""

    completion: str
    generation_prompt: str
    tools: list[Tool]
    calls: list[tuple[str, dict[str, Any]]]
    reasoning: str | None  # None: no reasoning block
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


_SCHEMA_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _key(rng: random.Random) -> str:
    return "".join(rng.choice(_KEY_CHARS) for _ in range(rng.randint(1, 10)))


def _arguments(rng: random.Random) -> dict[str, Any]:
    """Top-level arguments: strings (some that look like JSON: a string parameter keeps them
    as written), numbers, booleans, null, arrays and objects."""
    out: dict[str, Any] = {}
    for _ in range(0 if rng.random() < 0.15 else rng.randint(1, 4)):
        r = rng.random()
        if r < 0.35:
            value: Any = _string(rng, 40)
        elif r < 0.45:
            value = rng.choice(("12", "true", "null", '{"k": 1}', "[1, 2]", " spaced ", "a\nb"))
        else:
            value = _json_value(rng, 0)
        out[_key(rng)] = value
    return out


def _schema(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {k: {"type": "null" if v is None else _SCHEMA_TYPE[type(v)]} for k, v in args.items()},
    }


def _written(value: Any) -> str:
    """A value as the GLM template writes it: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _call_text(rng: random.Random, name: str, args: dict[str, Any]) -> str:
    sep = rng.choice(("\n", "\n", "", " "))
    text = f"<tool_call>{name}"
    for k, v in args.items():
        text += f"{sep}<arg_key>{k}</arg_key>{sep}<arg_value>{_written(v)}</arg_value>"
    return text + rng.choice(("\n", "\n", "")) + "</tool_call>"


def _prose(rng: random.Random, n: int = 12) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(1, n))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(("{x}", "<b>", "a < b", "</", "<tool", '{"k": 1}')))
    text = ""
    for w in words:
        text += w + rng.choice((" ", " ", " ", "\n", ", ", ". "))
    return text.strip()


def _case(rng: random.Random) -> Case:
    mode = rng.choice(("open", "inline", "none"))
    reasoning = None if mode == "none" else ("" if rng.random() < 0.1 else _prose(rng, n=30))
    head = ""
    prompt = PROMPT
    if mode == "open":
        prompt += "\n<think>"
        head = f"{reasoning}</think>\n"
    elif mode == "inline":
        head = rng.choice(("", "\n")) + f"<think>{reasoning}</think>\n"
    n_calls = rng.choice((0, 1, 1, 2, 3))
    before = _prose(rng) if n_calls == 0 or rng.random() < 0.5 else ""
    after = _prose(rng) if n_calls and rng.random() < 0.3 else ""
    names = rng.sample(_TOOLS, n_calls)  # one call per tool: each tool has one schema
    calls = [(name, _arguments(rng)) for name in names]
    tools = [Tool(name, _schema(args)) for name, args in calls]
    tools += [Tool(n, {"type": "object"}) for n in _TOOLS if n not in names]
    difference = ""
    r = rng.random()
    if n_calls and r < 0.05:
        difference = "untyped"
        tools[0] = Tool(calls[0][0], {"type": "object"})
    elif n_calls and r < 0.10:
        difference = "unknown"
    elif n_calls and r < 0.13:
        difference = "unclosed"
    body = before
    for i, (name, args) in enumerate(calls):
        if i or before:
            body += "\n"
        body += _call_text(rng, name, args)
    if difference == "unknown":
        body += "\n<tool_call>no_such_tool\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"
    if after:
        body += "\n" + after
    if difference == "unclosed":
        body += "\n" + _call_text(rng, rng.choice(names), {"path": "a.txt"})[: -len("</tool_call>")]
    return Case(head + body, prompt, tools, calls, reasoning, before, after, difference)


def _parse_ours(case: Case, seed: int) -> Parsed:
    return parse_twice(lambda: Glm45Family().parser(case.generation_prompt, case.tools), case.completion, seed)


def _vllm(tok: Any, case: Case) -> tuple[Parsed, str | None]:
    """vLLM's parse (reasoning parser, then tool parser on its content) and its content."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning.glm47_moe_reasoning_parser import Glm47MoeParserReasoningAdapter
    from vllm.tool_parsers.glm47_moe_tool_parser import Glm47MoeModelToolParser

    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}} for t in case.tools]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
    thinking = case.reasoning is not None
    reasoner = Glm47MoeParserReasoningAdapter(tok, chat_template_kwargs={"enable_thinking": thinking})
    reasoning, content = reasoner.extract_reasoning(case.completion, request)
    info = Glm47MoeModelToolParser(tok).extract_tool_calls(content or "", request)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
    return Parsed((reasoning or "").strip("\n"), "", calls), info.content


def _json_or_string(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def test_glm45_parser_agrees_with_vllms_glm45_parsers() -> None:
    import transformers

    fast: Any = transformers.PreTrainedTokenizerFast  # untyped
    tok = fast(tokenizer_object=build_fake_tokenizer(special_tokens=GLM45_SPECIAL_TOKENS))
    rng = random.Random(45)
    seen: dict[str, int] = {}
    for n in range(COMPLETIONS):
        case = _case(rng)
        seen[case.difference] = seen.get(case.difference, 0) + 1
        ours = _parse_ours(case, n)
        theirs, content = _vllm(tok, case)
        where = f"completion {n}: {case.completion!r}"
        assert ours.reasoning == theirs.reasoning == (case.reasoning or "").strip("\n"), where
        before = (content or "").strip()
        if case.difference in ("", "unclosed"):
            assert before == case.before.strip(), where
        assert ours.text.startswith(before), where
        if case.difference == "":
            assert ours.calls == theirs.calls == case.calls, where
            # vLLM: the text before the first call; the proxy: that, then what follows
            assert ours.text[len(before) :].strip() == case.after.strip(), where
        elif case.difference == "untyped":
            name, args = case.calls[0]
            assert theirs.calls[0] == (name, {k: _written(v) for k, v in args.items()}), where
            assert ours.calls[0] == (name, {k: _json_or_string(_written(v)) for k, v in args.items()}), where
            assert ours.calls[1:] == theirs.calls[1:] == case.calls[1:], where
        elif case.difference == "unknown":
            assert theirs.calls == case.calls, where
            assert ours.calls == [*case.calls, ("no_such_tool", {"x": 1})], where
        else:  # unclosed
            assert ours.calls == case.calls and len(theirs.calls) == len(case.calls) + 1, where
            assert ours.text.rstrip().endswith("<arg_value>a.txt</arg_value>"), where
    assert seen[""] >= 1000 and all(seen.get(d, 0) > 10 for d in ("untyped", "unknown", "unclosed"))
