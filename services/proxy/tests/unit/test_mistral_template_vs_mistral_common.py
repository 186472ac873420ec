"""The ``mistral`` chat template against ``mistral-common``, Mistral's reference encoder.

``mistral-common`` (pinned with vLLM, which depends on it) encodes a chat request to tokens as
Mistral's models were trained on; here it runs over a byte-level Tekken tokenizer built in the
test (the 256 bytes and Mistral's control tokens), and its tokens decoded with the control
tokens kept give the text of the prompt. The project's template (``chat_formats.MISTRAL_TEMPLATE``,
rendered by the proxy's sandboxed template engine) must write exactly that text for a
conversation with a system prompt, tools, text, calls (two in one turn), tool results and a
final user message: the format of the v13 encoder (Devstral, Magistral), which places the
tools once after the system prompt and writes calls without ``[CALL_ID]``. The v11 encoder
differs in two deliberate ways, asserted as such: it places the tools before the last user
message (a conversation's render would not be a prefix of its next one), and writes each
call's id (``[CALL_ID]``, ``[TOOL_CONTENT]``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from openforge_core.chat_formats import MISTRAL_BOS_TOKEN, MISTRAL_EOS_TOKEN, MISTRAL_TEMPLATE
from openforge_proxy.domain.template import ChatTemplate

pytest.importorskip("mistral_common", reason="mistral-common not installed (requirements/inference-cpu.txt)")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": n,
            "description": d,
            "parameters": {"type": "object", "properties": {k: {"type": "string"}}, "required": [k]},
        },
    }
    for n, d, k in (("exec", "Run a shell command", "command"), ("read_file", "Read a file", "path"))
]


def _call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. Use the tools."},
    {"role": "user", "content": "Create hello.txt — using the shell."},
    {"role": "assistant", "content": "Sure.", "tool_calls": [_call(1, "exec", {"command": "echo hi > hello.txt"})]},
    {"role": "tool", "tool_call_id": "call00001", "content": ""},
    {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [_call(2, "read_file", {"path": "hello.txt"}), _call(3, "exec", {"command": "ls", "n": 2})],
    },
    {"role": "tool", "tool_call_id": "call00002", "content": "hi\n"},
    {"role": "tool", "tool_call_id": "call00003", "content": "hello.txt"},
    {"role": "assistant", "content": "Done: hello.txt now contains hi."},
    {"role": "user", "content": "Thanks. Now delete it."},
]


def _reference(version: str) -> str:
    """The prompt text ``mistral-common``'s encoder of ``version`` writes for the conversation."""
    from mistral_common.protocol.instruct.normalize import get_normalizer
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy, SpecialTokens, TokenizerVersion
    from mistral_common.tokens.tokenizers.instruct import InstructTokenizerV11, InstructTokenizerV13
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from mistral_common.tokens.tokenizers.tekken import SpecialTokenInfo, Tekkenizer, TokenInfo

    specials = [SpecialTokenInfo(rank=i, token_str=t.value, is_control=True) for i, t in enumerate(SpecialTokens)]
    vocab = [TokenInfo(rank=b, token_bytes=base64.b64encode(bytes([b])).decode(), token_str=None) for b in range(256)]
    v = TokenizerVersion(version)
    tekken = Tekkenizer(vocab, specials, r"[^\r\n]+|\s+", 256 + len(specials), len(specials), v)
    instruct = (InstructTokenizerV13 if version == "v13" else InstructTokenizerV11)(tekken)
    encoder: Any = MistralTokenizer(
        instruct, validator=get_validator(v, mode=ValidationMode.test), request_normalizer=get_normalizer(v, None)
    )
    tokens = encoder.encode_chat_completion(ChatCompletionRequest(messages=MESSAGES, tools=TOOLS)).tokens
    return str(tekken.decode(tokens, special_token_policy=SpecialTokenPolicy.KEEP))


def test_the_mistral_template_writes_what_mistral_common_v13_encodes() -> None:
    special = {"bos_token": MISTRAL_BOS_TOKEN, "eos_token": MISTRAL_EOS_TOKEN}
    tpl = ChatTemplate(MISTRAL_TEMPLATE, special_tokens=special)
    ours = tpl.render(MESSAGES, TOOLS, add_generation_prompt=True)
    assert ours == _reference("v13")
    # v11: the tools before the last user message, and the calls' ids
    v11 = _reference("v11")
    tools = "[AVAILABLE_TOOLS]" + json.dumps(TOOLS) + "[/AVAILABLE_TOOLS]"
    assert tools in ours and tools in v11
    assert v11.index(tools) > ours.index(tools) and v11.endswith(tools + "[INST]Thanks. Now delete it.[/INST]")
    assert "[CALL_ID]call00001[ARGS]" in v11 and "[TOOL_RESULTS]call00002[TOOL_CONTENT]hi\n[/TOOL_RESULTS]" in v11
    assert "[TOOL_CALLS]exec[ARGS]{" in ours and "[CALL_ID]" not in ours
