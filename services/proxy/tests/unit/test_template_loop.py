"""Re-rendering only the loop iterations that may differ (template_loop) gives the full render's text.

Every render with a :class:`LoopCache` is compared with a render of the same conversation by
the original template, over conversations that grow, are edited, truncated and change their
tools, for the fake Hermes template and for templates made to read neighbours, the list's
end, ``messages[0]`` and the loop's position.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from openforge_proxy.domain import template_loop
from openforge_proxy.domain.template import ChatTemplate
from openforge_proxy.domain.template_loop import LoopCache
from openforge_testing.fakes import TEMPLATES

TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]

_NEIGHBOURS = (
    "{{ messages[0].content }}|"
    "{%- for message in messages %}"
    "[{{ loop.index0 }}{{ 'F' if loop.first }}{{ 'L' if loop.last }}:{{ message.role }}"
    "<{{ messages[loop.index0 - 1].role }}>"  # at 0: the LAST message
    "{%- if not loop.last %}>{{ messages[loop.index0 + 1].role }}{% endif %}"
    "{%- if loop.index0 + 2 < 999 %}>>{{ messages[loop.index + 1].content if messages[loop.index + 1] is defined }}"
    "{% endif %}{% set x = message.content %}{{ x }}]"
    "{%- endfor %}{{ '|gen' if add_generation_prompt }}"
)

# ``loop`` of the message loop in a macro's argument, a ``with`` block, a nested loop's filter
# and else block; ``loop`` of nested loops in their bodies
_NESTED = (
    "{% macro wrap(x, y) %}<{{ x }}:{{ y }}>{% endmacro %}"
    "{%- for message in messages %}"
    "{{ wrap(loop.index, loop.first) }}"
    "{%- for c in [1, 2, 3] if loop.index0 % 3 == 1 or c < 3 %}"
    "({{ loop.index }}{{ loop.first }}{{ loop.last }}{{ c }}){% endfor %}"
    "{%- for c in [] %}{% else %}E{{ loop.index0 }}{% endfor %}"
    "{%- for c in [1] %}{% for d in [5, 6] %}{{ loop.index0 }}{{ d }}{% endfor %}{{ loop.last }}{% endfor %}"
    "{%- with y = loop.index0 * 2 %}{{ y }}{% endwith %}{{ message.role }}"
    "{%- endfor %}"
)
# statements before the loop that its iterations read: sets, a set block, a namespace filled by a
# loop over the tools, a with block, if/elif/else, each writing too; text after the loop
_HEADED = (
    "{% set ns = namespace(names='') %}{% set first = messages[0].content %}"
    "{% set block %}<{{ first }}>{% endset %}"
    "{%- if tools %}T:{% for t in tools %}{% set ns.names = ns.names ~ t.function.name %}"
    "[{{ t | tojson }}]{% endfor %}{% elif first is string %}{% set first = first ~ '?' %}X{% else %}N{% endif %}"
    "{% with w = first ~ '!' %}{{ w }}{% endwith %}|"
    "{%- for message in messages %}{{ loop.index0 }}{{ message.role }}{{ ns.names }}{{ block }}"
    "{{ first if loop.first }}{{ message.content if message.content is string }};{% endfor %}"
    "|{{ ns.names }}{{ '|gen' if add_generation_prompt }}"
)
# a statement before the loop that is not taken apart: iterations are still the only ones
# rendered, the text around them rendered every time
_FILTERED = (
    "{% filter upper %}{{ messages[0].content }}{% endfilter %}|"
    "{%- for message in messages %}{{ loop.index0 }}{{ message.role }};{% endfor %}"
)
_SOURCES = {"neighbours": _NEIGHBOURS, "nested": _NESTED, "headed": _HEADED, "filtered": _FILTERED}

_REJECTED = {
    "two loops": "{% for m in messages %}{% endfor %}{% for message in messages %}{{ message.role }}{% endfor %}",
    "length": "{% for message in messages %}{{ loop.length }}{% endfor %}",
    "revindex": "{% for message in messages %}{{ loop.revindex }}{% endfor %}",
    "nextitem": "{% for message in messages %}{{ loop.nextitem }}{% endfor %}",
    "last message": "{% for message in messages %}{{ messages[-1].role }}{% endfor %}",
    "messages filter": "{% for message in messages %}{{ messages | length }}{% endfor %}",
    "namespace": (
        "{% set ns = namespace(n=0) %}{% for message in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endfor %}"
    ),
    "nested namespace": (
        "{% set ns = namespace(n=0) %}{% for message in messages %}{% for c in message.content %}"
        "{% set ns.n = 1 %}{% endfor %}{{ ns.n }}{% endfor %}"
    ),
    "clock": "{% for message in messages %}{{ strftime_now('%d') }}{% endfor %}",
    "cycler": "{% set c = cycler('a', 'b') %}{% for message in messages %}{{ c.next() }}{% endfor %}",
    "joiner": "{% set j = joiner(',') %}{% for message in messages %}{{ j() }}{% endfor %}",
    "chance": "{% for message in messages %}{{ [1, 1] | random }}{% endfor %}",
    "macro reads messages": (
        "{% macro m() %}{{ messages[0] }}{% endmacro %}{% for message in messages %}{{ m() }}{% endfor %}"
    ),
    "loop in an if": "{% if true %}{% for message in messages %}{{ message.role }}{% endfor %}{% endif %}",
    "loop passed": "{% macro m(l) %}{{ l.length }}{% endmacro %}{% for message in messages %}{{ m(loop) }}{% endfor %}",
    "indexed by content": "{% for message in messages %}{{ messages[message.n].role }}{% endfor %}",
    # where ``loop`` is still the message loop: a nested loop's else block and filter
    "nested else": "{% for message in messages %}{% for x in [] %}{% else %}{{ loop.length }}{% endfor %}{% endfor %}",
    "nested filter": "{% for message in messages %}{% for x in [1] if loop.revindex > 2 %}R{% endfor %}{% endfor %}",
    "nested macro": (
        "{% set ns = namespace(x='') %}{% if true %}{% macro m() %}{% set ns.x = ns.x ~ 'a' %}{{ ns.x }}"
        "{% endmacro %}{% endif %}{% for message in messages %}{{ dict(f=m).f() }}{% endfor %}"
    ),
    "break": "{% for message in messages %}{% if message.role == 'x' %}{% break %}{% endif %}.{% endfor %}",
    # a one-shot iterator kept outside the loop: the first iteration reading it uses it up
    "one-shot iterator": (
        "{% set names = tools | map(attribute='function') | map(attribute='name') %}"
        "{% for message in messages %}{{ names | join(',') }}{% endfor %}"
    ),
    "items": "{% set kv = {'a': 1} | items %}{% for message in messages %}{{ kv | list }}{% endfor %}",
    # identity: the cache compares messages by value
    "sameas": "{% for message in messages %}{{ 'again' if message is sameas messages[0] }}{% endfor %}",
    "sameas by name": "{% for message in messages %}{{ [message] | select('sameas', messages[0]) | list }}{% endfor %}",
    "random by name": "{% for message in messages %}{{ [[1, 1]] | map('random') | list }}{% endfor %}",
    **{
        f"private name {name}": f"{{% for message in messages %}}{{{{ {name} }}}}{{% endfor %}}"
        for name in sorted(template_loop._OWN)
    },
}


def _message(rng: random.Random, i: int) -> dict[str, Any]:
    role = rng.choice(["user", "assistant", "tool", "tool", "system"])
    msg: dict[str, Any] = {
        "role": role,
        "content": rng.choice([f"c{i}", [{"type": "text", "text": f"p{i}"}], None, ""]),
    }
    if role == "assistant" and rng.random() < 0.5:
        msg["tool_calls"] = [{"type": "function", "function": {"name": "Bash", "arguments": {"n": i}}}]
        msg["reasoning_content"] = rng.choice([None, f"r{i}"])
    return msg


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral", "neighbours", "nested", "headed", "filtered"])
def test_incremental_renders_equal_full_renders(name: str) -> None:
    source = TEMPLATES[name] if name in TEMPLATES else _SOURCES[name]
    tpl = ChatTemplate(source)
    assert tpl.incremental
    rng = random.Random(5)
    reused = known = quiet = 0
    for _ in range(60):
        cache = LoopCache()
        previous: str | None = None
        messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
        tools: list[Any] | None = TOOLS
        for _ in range(30):
            op = rng.random()
            if op < 0.55:
                messages = [*messages, *(_message(rng, len(messages) + k) for k in range(rng.randint(1, 3)))]
            elif op < 0.7 and len(messages) > 1:
                k = rng.randrange(len(messages))
                messages = [*messages[:k], _message(rng, 1000 + k), *messages[k + 1 :]]
            elif op < 0.8:
                messages = messages[: rng.randint(0, len(messages))]
            elif op < 0.9:
                tools = rng.choice([None, TOOLS, copy.deepcopy(TOOLS)])
            gen = rng.random() < 0.9
            try:
                want = tpl.render(copy.deepcopy(messages), tools, add_generation_prompt=gen)
            except Exception as exc:  # the template refuses this conversation: so must the cached render
                renders = cache.renders
                with pytest.raises(type(exc)):
                    tpl.render(messages, tools, add_generation_prompt=gen, cache=cache)
                assert cache.renders == renders
                continue
            assert tpl.render(messages, tools, add_generation_prompt=gen, cache=cache) == want
            # what the cache claims equal to the render before is
            same = cache.same_prefix
            assert previous is not None or same == 0
            if previous is not None:
                assert same <= min(len(want), len(previous)) and want[:same] == previous[:same]
            known += same > 0
            previous = want
        reused += cache.reused
        quiet += cache.quiet
    assert reused > 5000  # iterations not rendered again
    assert known > 1000
    if name == "filtered":
        assert quiet == 0
    else:
        assert quiet > 500  # the text around the iterations not rendered again


@pytest.mark.parametrize("name", sorted(_REJECTED))
def test_templates_whose_iterations_are_not_local_are_rendered_whole(name: str) -> None:
    tpl = ChatTemplate(_REJECTED[name])
    assert not tpl.incremental
    # the cache changes nothing then
    messages = [{"role": "user", "content": "a", "n": 0}, {"role": "assistant", "content": "b", "n": 1}]
    cache = LoopCache()
    for _ in range(2):
        try:
            want = tpl.render(messages)
        except Exception as exc:  # some probes fail in the reference too: so must they here
            with pytest.raises(type(exc)):
                tpl.render(messages, cache=cache)
        else:
            assert tpl.render(messages, cache=cache) == want
    assert cache.reused == 0


def test_qwen3_which_scans_the_messages_first_is_rendered_whole() -> None:
    assert not ChatTemplate(TEMPLATES["qwen3"]).incremental
    assert not ChatTemplate(TEMPLATES["deepseek_v31"]).incremental  # it gathers the system messages first


def test_messages_holding_mark_characters_render_as_the_original_template(monkeypatch: pytest.MonkeyPatch) -> None:
    tpl = ChatTemplate(TEMPLATES["hermes"])
    cache = LoopCache()
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "\ue004x:1\ue005 \ue006x\ue006"}]
    assert tpl.render(messages, cache=cache) == tpl.render(messages)
    more = [*messages, {"role": "user", "content": "next"}, {"role": "user", "content": "\ue004"}]
    assert tpl.render(more, cache=cache) == tpl.render(more)
    more = [*more, {"role": "user", "content": "and next"}]
    assert tpl.render(more, cache=cache) == tpl.render(more)
    assert cache.reused > 0
    # marks not found: the original template renders it, and the cache starts over
    monkeypatch.setattr(template_loop, "_split", lambda text, rendered: None)
    again = [*more, {"role": "user", "content": "again"}]
    assert tpl.render(again, cache=cache) == tpl.render(again)
    assert cache.context is None
    # a whole render leaves nothing known about the next one's text
    assert cache.same_prefix == 0 and cache.text is None


def test_a_whole_render_between_two_derived_ones_is_not_taken_for_the_previous_text() -> None:
    tpl = ChatTemplate(TEMPLATES["hermes"])
    cache = LoopCache()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    tpl.render(messages, cache=cache)
    more = [*messages, {"role": "user", "content": "more"}]
    tpl.render(more, cache=cache)
    assert cache.same_prefix > len("sys")
    renders = cache.renders
    # rendered whole (the context holds a name of the derived template's): the next derived
    # render knows nothing of its text
    other = [{"role": "system", "content": "other"}, {"role": "user", "content": "x"}]
    tpl.render(other, cache=cache, openforge_loop_rows=1)
    assert cache.renders == renders + 1 and cache.same_prefix == 0
    tpl.render([*more, {"role": "user", "content": "next"}], cache=cache)
    assert cache.same_prefix == 0


def test_values_equal_to_python_but_rendered_otherwise_are_rendered_again() -> None:
    source = "{% for message in messages %}{{ message.args | tojson }}{{ effort }}|{% endfor %}"
    tpl = ChatTemplate(source)
    assert tpl.incremental
    cache = LoopCache()
    first: list[dict[str, Any]] = [{"args": {"a": 1, "b": 2}}, {"args": 0.0}, {"args": True}]
    second: list[dict[str, Any]] = [{"args": {"b": 2, "a": 1}}, {"args": -0.0}, {"args": 1}, {"args": None}]
    runs: list[tuple[list[dict[str, Any]], float]] = [
        (first, 1),
        (second, 1),
        (second, 1.0),
        ([*second, {"args": 2}], 1.0),
    ]
    for messages, effort in runs:
        want = tpl.render(copy.deepcopy(messages), effort=effort)
        assert tpl.render(messages, cache=cache, effort=effort) == want


# the text around the loop: stateful calls in what is written, names assigned after the loop
_AROUND = {
    "changed": (
        "{% set ns = namespace(x='') %}"
        "{% for t in ['a', 'b'] %}{{ loop.changed(t) }}{% if loop.changed(t) %}{% set ns.x = ns.x ~ t %}{% endif %}"
        "{% endfor %}|{% for message in messages %}{{ ns.x }}{{ message.content }};{% endfor %}"
    ),
    "set after the loop": (
        "{% for message in messages %}[{{ enable_thinking }}]{{ message.content }}{% endfor %}"
        "{% set enable_thinking = false %}{{ enable_thinking }}"
    ),
    **{
        f"changed {how}": (
            "{% set ns = namespace(x='') %}{% for t in ['a', 'b'] %}"
            + call.format("{{ ", " }}")
            + call.format("{% if ", " %}")
            + "{% set ns.x = ns.x ~ t %}{% endif %}{% endfor %}|"
            "{% for message in messages %}{{ ns.x }}{{ message.content }};{% endfor %}"
        )
        for how, call in {
            "subscript": "{0}loop['changed'](t){1}",
            "attr filter": "{0}(loop|attr('changed'))(t){1}",
            "alias": "{{% set l = loop %}}{0}l.changed(t){1}",
        }.items()
    },
}


@pytest.mark.parametrize("name", sorted(_AROUND))
def test_the_text_around_the_loop_is_reused_only_where_it_cannot_differ(name: str) -> None:
    tpl = ChatTemplate(_AROUND[name])
    assert tpl.incremental
    cache = LoopCache()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for i in range(4):
        assert tpl.render(messages, cache=cache, enable_thinking=True) == ChatTemplate(_AROUND[name]).render(
            copy.deepcopy(messages), enable_thinking=True
        )
        messages = [*messages, {"role": "assistant", "content": f"a{i}"}]
    assert cache.reused > 0
    assert (cache.quiet > 0) == (not name.startswith("changed"))


def test_messages_nested_deeper_than_python_recursion_compare_without_error() -> None:
    source = "{% for message in messages %}<{{ message.role }}>{{ message.content }}{% endfor %}"
    tpl = ChatTemplate(source)
    deep = orjson.dumps([{"role": "assistant", "content": "", "args": "ARGS"}]).replace(
        b'"ARGS"', b"[" * 1000 + b"]" * 1000
    )
    cache = LoopCache()
    tpl.render([{"role": "user", "content": "hi"}, *orjson.loads(deep)], cache=cache)
    # the same conversation parsed again (equal objects, not the same ones), and one more message
    messages = [{"role": "user", "content": "hi"}, *orjson.loads(deep), {"role": "user", "content": "next"}]
    assert tpl.render(messages, cache=cache) == tpl.render(messages)
    assert cache.reused > 0
