"""Known request fields with the wrong JSON type are refused with the field's name (never a crash)."""

from __future__ import annotations

from typing import Any

import pytest

from openforge_core.errors import InvalidArgument
from openforge_proxy.domain.protocols import anthropic, chat, responses


def _anthropic(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def _responses(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **extra}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize(
    ("parse", "body", "field"),
    [
        (anthropic.parse, _anthropic(max_tokens=True), "max_tokens"),
        (responses.parse, _responses(max_output_tokens=True), "max_output_tokens"),
        (chat.parse, _chat(max_completion_tokens=True), "max_completion_tokens"),
        (chat.parse, _chat(max_tokens=False), "max_tokens"),
    ],
)
def test_a_boolean_token_cap_is_refused(parse: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^{field}: must be an integer"):
        parse(body)


def test_token_caps_that_are_not_positive_integers_leave_the_default() -> None:
    assert anthropic.parse(_anthropic(max_tokens=7)).max_tokens == 7
    for value in (0, -1, 1.5, "100", None):
        assert anthropic.parse(_anthropic(max_tokens=value)).max_tokens is None
        assert responses.parse(_responses(max_output_tokens=value)).max_tokens is None
    assert chat.parse(_chat(max_completion_tokens=None, max_tokens=9)).max_tokens is None
    assert chat.parse(_chat(max_tokens=9)).max_tokens == 9


@pytest.mark.parametrize("value", ["auto", 5, 1.5, True, [], ["x"], [{"type": "auto"}]])
def test_anthropic_tool_choice_must_be_an_object(value: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"^tool_choice: must be an object"):
        anthropic.parse(_anthropic(tool_choice=value))


def test_anthropic_tool_choice_object_or_null_is_read() -> None:
    assert anthropic.parse(_anthropic(tool_choice=None)).parallel_tool_calls
    assert anthropic.parse(_anthropic(tool_choice={"type": "auto"})).parallel_tool_calls
    assert not anthropic.parse(
        _anthropic(tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    ).parallel_tool_calls


@pytest.mark.parametrize("value", [5, -1, 1.5, True, "text", {"type": "summary_text"}])
def test_responses_reasoning_summary_must_be_a_list(value: Any) -> None:
    items = [{"type": "message", "role": "user", "content": "hi"}, {"type": "reasoning", "id": "rs", "summary": value}]
    with pytest.raises(InvalidArgument, match=r"^input\[1\]\.summary: must be a list"):
        responses.parse(_responses(input=items))


def test_responses_reasoning_without_summary_is_read() -> None:
    items = [{"type": "message", "role": "user", "content": "hi"}, {"type": "reasoning", "id": "rs", "summary": None}]
    request = responses.parse(_responses(input=items))
    assert [m.role for m in request.messages] == ["user", "assistant"]


@pytest.mark.parametrize("value", [5, -1, 1.5, True, "auto", {"type": "function"}])
def test_chat_tools_must_be_a_list(value: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"^tools: must be a list"):
        chat.parse(_chat(tools=value))


@pytest.mark.parametrize("value", [5, -1, 1.5, True, "call", {"id": "c1"}])
def test_chat_assistant_tool_calls_must_be_a_list(value: Any) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": value}]
    with pytest.raises(InvalidArgument, match=r"^messages\[1\]\.tool_calls: must be a list"):
        chat.parse(_chat(messages=messages))


def test_chat_null_tools_and_tool_calls_are_read_as_none() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "tool_calls": None}]
    request = chat.parse(_chat(messages=messages, tools=None))
    assert request.tools == [] and request.messages[-1].tool_calls == []
