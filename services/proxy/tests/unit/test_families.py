"""Model families: detection from the chat template, the served model of a Llama 3, a
GLM-4.5, a Mistral and a DeepSeek-V3.1 template (stop ids, manifest parsers), and the Llama 3,
GLM-4.5, Mistral and DeepSeek-V3.1 parsers' rules on readable examples (the differential tests
against vLLM cover them at scale)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from openforge_core.chat_formats import (
    DEEPSEEK_V31_SPECIAL_TOKENS,
    GLM45_SPECIAL_TOKENS,
    LLAMA3_SPECIAL_TOKENS,
    MISTRAL_SPECIAL_TOKENS,
)
from openforge_proxy.domain.engine import ModelInfo
from openforge_proxy.domain.families import (
    DeepSeekV31Family,
    Event,
    Family,
    Glm45Family,
    HermesFamily,
    Llama3Family,
    MistralFamily,
    family_for,
)
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_testing.fakes import HERMES_TEMPLATE, TEMPLATES, build_fake_model_dir, build_fake_tokenizer

LLAMA_SPECIAL_TOKENS = LLAMA3_SPECIAL_TOKENS

#: The framing and tool-call rendering of Llama 3.1's template, shortened.
LLAMA3_TEMPLATE = """\
{{- bos_token }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{{- '{"name": "' + tool_call.function.name + '", "parameters": ' + (tool_call.function.arguments | tojson) + '}' }}
{%- endfor %}
{%- else %}
{{- message.content }}
{%- endif %}
{{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""


def test_the_family_is_detected_from_the_template() -> None:
    assert family_for("auto", HERMES_TEMPLATE) == HermesFamily()
    assert family_for("auto", LLAMA3_TEMPLATE) == Llama3Family()
    assert family_for("llama3", HERMES_TEMPLATE) == Llama3Family()  # a name is taken as given
    # the test fakes' templates: Qwen-style ones are hermes, the Llama 3.1-style one llama3,
    # the GLM-4.5-style one glm45
    assert {name: family_for("auto", src).name for name, src in TEMPLATES.items()} == {
        "hermes": "hermes",
        "qwen3": "hermes",
        "llama3": "llama3",
        "glm45": "glm45",
        "mistral": "mistral",
        "deepseek_v31": "deepseek_v31",
    }


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("llama")
    build_fake_tokenizer(special_tokens=LLAMA_SPECIAL_TOKENS).save(str(out / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_a_llama3_model_stops_at_either_end_token_and_reports_its_parsers(llama_dir: Path) -> None:
    info = ModelInfo(
        model_path=str(llama_dir),
        model_name="m",
        chat_template=LLAMA3_TEMPLATE,
        chat_template_hash="sha256:" + hashlib.sha256(LLAMA3_TEMPLATE.encode()).hexdigest(),
        tokenizer_hash="sha256:" + hashlib.sha256((llama_dir / "tokenizer.json").read_bytes()).hexdigest(),
        eos_token_ids=(LLAMA_SPECIAL_TOKENS.index("<|end_of_text|>"),),
        context_length=8192,
    )
    rt = ModelRuntime.load(info)
    assert isinstance(rt.family, Llama3Family)
    ids = {LLAMA_SPECIAL_TOKENS.index(t) for t in ("<|end_of_text|>", "<|eot_id|>", "<|eom_id|>")}
    assert rt.eos_ids == ids
    assert rt.generation_prompt == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert rt.served.parsers == ("family:llama3", "tool_call:llama3_json")


def _parse(family: Family, text: str) -> list[Event]:
    parser = family.parser("")
    events = [ev for ch in text for ev in parser.feed(ch)]
    return events + parser.finish()


def _summary(events: list[Event]) -> tuple[str, list[tuple[str, str]]]:
    text = "".join(ev.text for ev in events if ev.kind == "text")
    calls = [(ev.call.name, ev.call.arguments_json) for ev in events if ev.call is not None]
    return text, calls


def _fake_runtime(directory: Path, template: str) -> ModelRuntime:
    """The proxy's runtime over a fake model directory of ``template`` (as inference describes it)."""
    model = build_fake_model_dir(directory, template=template)
    source = (model / "chat_template.jinja").read_text()
    info = ModelInfo(
        model_path=str(model),
        model_name="m",
        chat_template=source,
        chat_template_hash="sha256:" + hashlib.sha256(source.encode()).hexdigest(),
        tokenizer_hash="sha256:" + hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest(),
        eos_token_ids=(json.loads((model / "config.json").read_text())["eos_token_id"],),
        context_length=8192,
    )
    return ModelRuntime.load(info)


def test_the_fake_llama3_model_dir_serves_as_a_llama3_model(tmp_path: Path) -> None:
    rt = _fake_runtime(tmp_path / "llama", "llama3")
    assert isinstance(rt.family, Llama3Family)
    assert {rt.codec.decode([i]) for i in rt.eos_ids} == {"<|eot_id|>", "<|eom_id|>"}
    text = rt.template.render([{"role": "user", "content": "hi"}])
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")  # bos_token given
    assert text.endswith("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>" + rt.generation_prompt)
    marker_ids = [rt.codec.token_id(m) for m in (*Llama3Family().end_tokens, "<|python_tag|>", "<|begin_of_text|>")]
    assert None not in marker_ids  # each marker is one special token


def test_llama3_calls_after_the_python_tag_separated_by_semicolons() -> None:
    text = '<|python_tag|>{"name": "a", "parameters": {"x": {"y": "}"}}}; {"name": "b", "arguments": {}}'
    assert _summary(_parse(Llama3Family(), text)) == ("", [("a", '{"x": {"y": "}"}}'), ("b", "{}")])


def test_llama3_text_around_calls_is_kept_less_the_tag_and_separators() -> None:
    text = 'Let me look.\n<|python_tag|>{"name": "a", "parameters": {}} ;\n\nThen I answer.'
    assert _summary(_parse(Llama3Family(), text)) == ("Let me look.\n\nThen I answer.", [("a", "{}")])


@pytest.mark.parametrize(
    "text",
    [
        "Use {x} here.",  # not JSON
        '{"name": "a", "parameters": {}} and {"k": 1}',  # a later object is no call: none is
        '{"name": "a", "parameters": {"x": 1}',  # never closed
        '{"name": "a"}',  # no arguments
        "<|python_tag|>brave_search.call(query='x')",  # a built-in tool, no JSON call
    ],
)
def test_llama3_braces_that_are_not_all_calls_are_text(text: str) -> None:
    assert _summary(_parse(Llama3Family(), text)) == (text, [])


def test_text_before_the_first_brace_streams_before_the_call_is_decided() -> None:
    parser = Llama3Family().parser("")
    assert [ev.text for ev in parser.feed("Sure, calling it now: ")] == ["Sure, calling it now:"]
    assert parser.feed('{"name": "a", "parameters": {}}') == []  # a later `{` could undo it
    assert [ev.call.name for ev in parser.finish() if ev.call is not None] == ["a"]


def test_the_fake_glm45_model_dir_serves_as_a_glm45_model(tmp_path: Path) -> None:
    rt = _fake_runtime(tmp_path / "glm", "glm45")
    assert isinstance(rt.family, Glm45Family)
    assert {rt.codec.decode([i]) for i in rt.eos_ids} == {"<|user|>", "<|observation|>", "<|endoftext|>"}
    assert rt.generation_prompt == "<|assistant|>"
    assert rt.served.parsers == ("family:glm45", "tool_call:glm45", "reasoning:glm45")
    call = {"type": "function", "function": {"name": "exec", "arguments": {"command": "ls", "n": 2}}}
    text = rt.template.render(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Sure.", "reasoning_content": "think", "tool_calls": [call]},
            {"role": "tool", "content": "ok"},
        ]
    )
    assert text == (
        "[gMASK]<sop><|user|>\nhi<|assistant|>\n<think>think</think>\nSure.\n<tool_call>exec"
        "\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>"
        "\n</tool_call><|observation|>\n<tool_response>\nok\n</tool_response><|assistant|>"
    )
    assert None not in [rt.codec.token_id(m) for m in GLM45_SPECIAL_TOKENS]  # each marker is one special token


@dataclass(frozen=True)
class _Tool:
    name: str
    parameters: dict[str, Any]


def test_glm45_values_are_strings_for_string_parameters_else_json_when_they_parse() -> None:
    tools = [_Tool("exec", {"type": "object", "properties": {"command": {"type": "string"}, "n": {"type": "integer"}}})]
    text = (
        "<think>plan</think>\nRunning it.\n<tool_call>exec\n<arg_key>command</arg_key>\n<arg_value>12</arg_value>"
        '\n<arg_key>n</arg_key>\n<arg_value>12</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>[1, {"a": null}]'
        "</arg_value>\n<arg_key>note</arg_key>\n<arg_value>not json</arg_value>\n</tool_call>"
    )
    parser = Glm45Family().parser("<|assistant|>", tools)
    events = [ev for ch in text for ev in parser.feed(ch)] + parser.finish()
    assert "".join(ev.text for ev in events if ev.kind == "reasoning") == "plan"
    args = '{"command":"12","n":12,"extra":[1,{"a":null}],"note":"not json"}'
    assert _summary(events) == ("Running it.", [("exec", args)])


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>",  # no name
        "<tool_call>exec\n<arg_key>x</arg_key><arg_value>1</arg_value>",  # never closed
    ],
)
def test_glm45_a_call_with_no_name_or_no_end_is_text(text: str) -> None:
    assert _summary(_parse(Glm45Family(), text)) == (text, [])


def test_the_fake_mistral_model_dir_serves_as_a_mistral_model(tmp_path: Path) -> None:
    rt = _fake_runtime(tmp_path / "mistral", "mistral")
    assert isinstance(rt.family, MistralFamily)
    assert {rt.codec.decode([i]) for i in rt.eos_ids} == {"</s>"}
    assert rt.generation_prompt == ""
    assert rt.served.parsers == ("family:mistral", "tool_call:mistral")
    call = {"type": "function", "function": {"name": "exec", "arguments": {"command": "ls", "n": 2}}}
    tool = {"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}}
    text = rt.template.render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Sure.", "tool_calls": [call]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "Done."},
        ],
        [tool],
    )
    assert text.startswith("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS][{")
    assert text.endswith(
        '[/AVAILABLE_TOOLS][INST]hi[/INST]Sure.[TOOL_CALLS]exec[ARGS]{"command": "ls", "n": 2}</s>'
        "[TOOL_RESULTS]ok[/TOOL_RESULTS]Done.</s>"
    )
    assert None not in [rt.codec.token_id(m) for m in MISTRAL_SPECIAL_TOKENS]  # each marker is one special token


def test_mistral_calls_follow_text_and_each_other() -> None:
    text = 'Let me look.[TOOL_CALLS]a[ARGS]{"x": {"y": "}"}}[TOOL_CALLS]b[ARGS]{}'
    assert _summary(_parse(MistralFamily(), text)) == ("Let me look.", [("a", '{"x": {"y": "}"}}'), ("b", "{}")])


@pytest.mark.parametrize(
    "text",
    [
        "[TOOL_CALLS][ARGS]{}",  # no name
        '[TOOL_CALLS]a[ARGS]["x"]',  # arguments not an object
        "[TOOL_CALLS]a{}",  # no [ARGS] (the pre-v11 form is not read either)
        '[TOOL_CALLS]a[ARGS]{"x": 1',  # never closed
    ],
)
def test_mistral_a_call_that_is_not_valid_is_text(text: str) -> None:
    assert _summary(_parse(MistralFamily(), text)) == (text, [])


def test_the_fake_deepseek_v31_model_dir_serves_as_a_deepseek_v31_model(tmp_path: Path) -> None:
    rt = _fake_runtime(tmp_path / "deepseek", "deepseek_v31")
    assert isinstance(rt.family, DeepSeekV31Family)
    assert {rt.codec.decode([i]) for i in rt.eos_ids} == {"<｜end▁of▁sentence｜>"}
    assert rt.generation_prompt == "<｜Assistant｜></think>"
    assert rt.served.parsers == ("family:deepseek_v31", "tool_call:deepseek_v31", "reasoning:deepseek_v3")
    call = {"type": "function", "function": {"name": "exec", "arguments": {"command": "ls", "n": 2}}}
    tool = {"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}}
    text = rt.template.render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Sure.", "tool_calls": [call, call]},
            {"role": "tool", "content": "ok"},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "Done.", "reasoning_content": "never rendered"},
            {"role": "user", "content": "more"},
        ],
        [tool],
        add_generation_prompt=True,
    )
    assert text.startswith("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\n")
    one = '<｜tool▁call▁begin｜>exec<｜tool▁sep｜>{"command": "ls", "n": 2}<｜tool▁call▁end｜>'
    assert text.endswith(
        f"<｜User｜>hi<｜Assistant｜></think>Sure.<｜tool▁calls▁begin｜>{one}{one}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        "<｜tool▁output▁begin｜>ok<｜tool▁output▁end｜><｜tool▁output▁begin｜>ok<｜tool▁output▁end｜>"
        "Done.<｜end▁of▁sentence｜><｜User｜>more<｜Assistant｜></think>"
    )
    # after tool results the model writes right away: no generation prompt
    after_tool: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    after_tool += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "ok"}]
    assert rt.template.render(after_tool, add_generation_prompt=True).endswith("<｜tool▁output▁end｜>")
    thinking = rt.template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True, thinking=True)
    assert thinking.endswith("<｜User｜>hi<｜Assistant｜><think>")
    assert None not in [rt.codec.token_id(m) for m in DEEPSEEK_V31_SPECIAL_TOKENS]  # each marker is one special token


def _deepseek(text: str, generation_prompt: str = "<｜Assistant｜></think>") -> tuple[str, str, list[tuple[str, str]]]:
    parser = DeepSeekV31Family().parser(generation_prompt)
    events = [ev for ch in text for ev in parser.feed(ch)] + parser.finish()
    reasoning = "".join(ev.text for ev in events if ev.kind == "reasoning")
    return (reasoning, *_summary(events))


_DS_ONE = '<｜tool▁call▁begin｜>a<｜tool▁sep｜>{"x": {"y": "}"}}<｜tool▁call▁end｜>'
_DS_TWO = "<｜tool▁call▁begin｜>b<｜tool▁sep｜>{}<｜tool▁call▁end｜>"


def test_deepseek_v31_calls_in_one_block_after_text_and_reasoning() -> None:
    text = f"Let me look.<｜tool▁calls▁begin｜>{_DS_ONE}\n{_DS_TWO}<｜tool▁calls▁end｜>"
    calls = [("a", '{"x": {"y": "}"}}'), ("b", "{}")]
    assert _deepseek(text) == ("", "Let me look.", calls)
    # reasoning only where the generation prompt opened it
    assert _deepseek("plan</think>" + text, "<｜Assistant｜><think>") == ("plan", "Let me look.", calls)
    assert _deepseek("<think>plan</think>ok") == ("", "<think>plan</think>ok", [])
    # the text after the block is kept
    assert _deepseek(f"<｜tool▁calls▁begin｜>{_DS_TWO}<｜tool▁calls▁end｜> Then.") == ("", "Then.", [("b", "{}")])


@pytest.mark.parametrize(
    "text",
    [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",  # no name
        # arguments not an object
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>["x"]<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",  # no separator
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{"x": 1',  # never closed
        "<｜tool▁calls▁begin｜>a call<｜tool▁calls▁end｜>",  # not a call inside the block
        "<｜tool▁calls▁begin｜>",  # a block left open
    ],
)
def test_deepseek_v31_what_is_not_a_call_is_text_as_written(text: str) -> None:
    assert _deepseek(text) == ("", text, [])
