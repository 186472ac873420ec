"""The template's sandbox fast paths (``message.role`` on plain dicts, macro calls) change no rendering
and no restriction."""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from openforge_proxy.domain import template as tpl
from openforge_testing.fakes import TEMPLATES

TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run", "parameters": {"type": "object"}}}]


def _plain(source: str) -> tpl.ChatTemplate:
    """The same template compiled in jinja2's own ImmutableSandboxedEnvironment (the reference)."""
    t = tpl.ChatTemplate(source)
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[tpl._GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = t._tojson
    env.globals["raise_exception"] = tpl._raise_exception
    env.globals["strftime_now"] = tpl._strftime_now
    t._template = env.from_string(source)
    return t


def _conversation() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [call]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1", "name": "Bash"},
        {"role": "assistant", "content": "done", "reasoning_content": None},
        {"role": "user", "content": "next", "items": "an item named like a dict method"},
    ]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_renders_equal_the_reference_sandbox(name: str) -> None:
    source = TEMPLATES[name]
    for tools in (None, TOOLS):
        for gen in (True, False):
            fast = tpl.ChatTemplate(source).render(_conversation(), tools, add_generation_prompt=gen)
            ref = _plain(source).render(_conversation(), tools, add_generation_prompt=gen)
            assert fast == ref


def test_restrictions_and_dict_methods_are_unchanged() -> None:
    probes = [
        "{{ messages[0].items is defined }}",  # a dict method, not the item
        "{{ messages[0].missing is defined }}",
        "{{ messages[0].role }}|{{ messages[0]['role'] }}",
        "{{ messages[0].__class__ is defined }}",
        # the loop's properties (returned without the sandbox's checks), its methods and internals
        "{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
        "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.depth }}{{ loop.depth0 }}{{ loop.previtem }}{{ loop.nextitem }}"
        "{{ loop.cycle('a', 'b') }}{{ loop._iterator is defined }}{% endfor %}",
    ]
    for probe in probes:
        got = tpl.ChatTemplate(probe).render([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])
        want = _plain(probe).render([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])
        assert got == want
    with pytest.raises(jinja2.exceptions.SecurityError):
        tpl.ChatTemplate("{{ messages[0].clear() }}").render([{"role": "user", "content": "x"}])


_MACROS = """\
{%- macro show(x, sep=':', upper=false) -%}
{{ x.role ~ sep }}{{ (x.content | string).upper() if upper else x.content }}{{ varargs | length }}{{ kwargs | length }}
{%- endmacro -%}
{%- macro wrap() -%}[{{ caller() }}]{%- endmacro -%}
{%- macro boxed(x) -%}<{{ caller() if caller is defined else x }}>{%- endmacro -%}
{%- for m in messages -%}
{{ show(m) }}|{{ show(m, '=', upper=true) }}|{{ show(m, '-', false, 1, 2, extra=3) }}|{{ show(m, sep=loop.index) }}|
{{- show(m, '+', true) }}|{{ boxed(m.role) }}|{% call boxed(m.role) %}called{% endcall %}|
{%- call wrap() %}{{ loop.index0 }}{{ show(m) }}{% endcall -%}
{%- endfor -%}
{%- set ns = namespace(total=0) -%}
{%- for m in messages %}{% set ns.total = ns.total + 1 %}{{ show(m) if loop.last }}{% endfor -%}
{{ ns.total }}
"""


def test_macro_calls_render_as_the_reference_and_stay_sandboxed() -> None:
    conv = _conversation()
    assert tpl.ChatTemplate(_MACROS).render(conv) == _plain(_MACROS).render(conv)
    # the active eval context reaches the macro (autoescaping decided where it is called)
    escaping = (
        "{% macro m(x) %}<b>{{ x }}</b>{% endmacro %}"
        "{% autoescape true %}{{ m('a&b') }}{% autoescape false %}{{ m('<i>') }}{% endautoescape %}{% endautoescape %}"
    )
    assert tpl.ChatTemplate(escaping).render([]) == _plain(escaping).render([]) == "<b>a&b</b><b><i></b>"
    for bad in ("{{ m(1) }}", "{{ m() }}", "{{ m(1, nope=2) }}"):
        source = "{% macro m(a) %}{{ a }}{% endmacro %}" + bad
        if bad == "{{ m(1, nope=2) }}":
            with pytest.raises(TypeError):
                tpl.ChatTemplate(source).render([])
            with pytest.raises(TypeError):
                _plain(source).render([])
        else:
            assert tpl.ChatTemplate(source).render([]) == _plain(source).render([])
    with pytest.raises(jinja2.exceptions.SecurityError):
        tpl.ChatTemplate("{% macro m(x) %}{{ x.clear() }}{% endmacro %}{{ m(messages[0]) }}").render(
            [{"role": "user", "content": "x"}]
        )
