"""The arguments a tool call streams to the harness are the arguments the proxy parsed, as the
model wrote them."""

from __future__ import annotations

import orjson
import pytest

from openforge_proxy.domain.families import HermesFamily


@pytest.mark.parametrize(
    ("body", "raw"),
    [
        ('{"name": "exec", "arguments": {"command":  "ls"}}', '{"command":  "ls"}'),
        ('{"name": "exec", "meta": {"parameters": {"x": 1}}, "arguments": {"command": "ls"}}', '{"command": "ls"}'),
        ('{"name": "exec", "parameters": {"command": "rm"}, "arguments": {"command": "ls"}}', '{"command": "ls"}'),
        ('{"name": "exec", "arguments": {"arguments": {"a": 1}}}', '{"arguments": {"a": 1}}'),
        ('{"name": "exec", "parameters": {"q": [1, 2]}}', '{"q": [1, 2]}'),
        ('{"name": "exec", "arguments": {"c": "x"}, "arguments": {"c": "y"}}', '{"c": "y"}'),
    ],
)
def test_raw_arguments_are_the_parsed_ones(body: str, raw: str) -> None:
    call = HermesFamily().parse_call(body)
    assert call is not None
    assert call.arguments_json == raw
    assert orjson.loads(call.arguments_json) == call.arguments
