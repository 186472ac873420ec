"""Remembered ``tojson`` and shared tool definitions render exactly what a fresh template renders."""

from __future__ import annotations

import copy

from openforge_proxy.domain.template import ChatTemplate
from openforge_testing.fakes import TEMPLATES

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Runs a command — «quoted» text stays as is.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


def _messages(n: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"role": "system", "content": "sys"}]
    for i in range(n):
        out.append({"role": "user", "content": f"do {i}"})
        call = {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": {"command": f"ls {i}"}}}
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        out.append({"role": "tool", "content": "ok", "tool_call_id": f"c{i}"})
    return out


def test_memoized_renders_equal_fresh_ones() -> None:
    for source in TEMPLATES.values():
        warm = ChatTemplate(source)
        shared = warm.shared_tools("k", TOOLS)
        assert warm.shared_tools("k", copy.deepcopy(TOOLS)) is shared
        messages = _messages(3)
        for n in range(1, 4):
            msgs = messages[: 1 + 3 * n]
            expected = ChatTemplate(source).render(copy.deepcopy(msgs), copy.deepcopy(TOOLS))
            assert warm.render(msgs, shared) == expected
            assert warm.render(msgs, shared) == expected  # served from the memo
