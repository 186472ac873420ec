"""Rendering a chat template again for a grown conversation without re-running its message loop
over the messages it already rendered.

A chat template renders a conversation with one ``{% for message in messages %}`` loop between
a head (system prompt, tools) and a tail (the generation prompt). Rendered again for the next
call of a session, the loop produces the same text for every message but the last few, yet
Jinja runs it over the whole conversation: at turn 100 of a Claude Code session that is most
of a call's proxy time. This module proves, from the template's syntax tree, when an
iteration's text depends only on its own message, the ``lookahead`` messages after it, the
message before it, ``messages[0]``, its position (``loop.index0``, ``loop.index``,
``loop.first``, ``loop.last``) and the render's other variables, and then renders only the
iterations that can differ, reusing the text of the others from the previous render.

What makes an iteration's text a function of those only (Jinja 3.1):

* ``messages`` appears only as the loop's iterable, as ``messages[0]``, or inside the loop as
  ``messages[loop.index0 + c]`` / ``messages[loop.index + c]`` (``c`` a constant);
* ``loop`` inside the loop (outside nested loops) only as ``index0``, ``index``, ``first``,
  ``last`` (not ``length``, ``revindex``, ``previtem``, ``nextitem``, ``cycle``, ``changed``);
* no namespace attribute is assigned inside the loop or in a macro (``{% set ns.x = ... %}``
  carries state from one iteration to the next; a plain ``{% set %}`` in a loop body does not:
  Jinja starts every iteration without it); macros are defined at the top level only, and
  no ``{% break %}`` leaves the loop;
* no call of a global other than the template's macros, ``raise_exception``, ``range``,
  ``namespace`` and ``dict``, no mention anywhere of ``strftime_now`` (the clock),
  ``cycler`` and ``joiner`` (objects whose methods keep state from one iteration to the
  next), ``lipsum`` or the ``random`` filter, and no ``include``, ``import``, ``extends``
  or ``block``;
* no one-shot iterator (``map``, ``select``, ``selectattr``, ``items``...) made outside the
  loop (kept in a variable, it is used up by whichever iteration reads it first), no identity
  test (``sameas``: messages are compared by value), and no filter naming ``sameas`` or
  ``random`` by a string;
* macros do not read ``messages``.

The render's other variables (tools, ``add_generation_prompt``, template kwargs) must be the
same objects or equal values as at the previous render, else everything is rendered; values
and messages are compared strictly (types, key order, the sign of zero), since ``1`` and
``1.0`` are equal to Python but not to ``tojson``. The head and the tail (the text before
and after the loop) are rendered again when those variables or ``messages[0]`` changed, else
they are the last render's (the quiet template, below). Templates that do not qualify
(Qwen3's, which finds the last user message with a loop of its own first) are always
rendered whole.

The derived template loops over the iterations to render only (pairs of a position and its
message), with the loop's position attributes replaced by the same values computed from that
position (``loop.index0`` is the position, ``loop.index`` the position + 1, ``loop.first``
the position == 0, ``loop.last`` the position == the last one), so the unchanged iterations
cost nothing, not even a step of Jinja's loop. It marks where each rendered iteration starts
and where the loop ends with private-use characters around a random nonce of the process
(never part of a prompt, so no message can hold it); a render whose marks are not found is
rendered whole by the original template instead.

Each render also tells how many of its leading characters are known to equal the previous
render's (:attr:`LoopCache.same_prefix`: the head when it is the same, then the reused and
the equal re-rendered iterations), so a caller comparing the two texts need not compare them.
"""

from __future__ import annotations

import operator
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2 import nodes

#: Globals an iteration may call besides the template's macros (pure functions of their arguments).
_PURE_CALLS = frozenset({"raise_exception", "range", "namespace", "dict"})
#: Globals whose values change by themselves: the clock, chance, and objects that keep state
#: from one call of their methods to the next (``cycler().next()``, a ``joiner``).
_STATEFUL = frozenset({"strftime_now", "cycler", "joiner", "lipsum"})
#: ``loop`` attributes whose value depends only on an iteration's position.
_POSITION = frozenset({"index0", "index", "first", "last"})
#: The properties of a ``loop`` variable (jinja2.runtime.LoopContext, Jinja 3.1).
LOOP_PROPERTIES = frozenset(
    {"index0", "index", "first", "last", "length", "revindex", "revindex0", "depth", "depth0", "previtem", "nextitem"}
)
#: ``loop`` attributes that keep no state (``changed()`` remembers its last argument).
_PURE_LOOP = LOOP_PROPERTIES | {"cycle"}
#: Filters that apply a test or a filter given by name.
_BY_NAME = frozenset({"map", "select", "reject", "selectattr", "rejectattr"})
#: Filters whose value is a one-shot iterator: stored by a statement outside the loop, it is used
#: up by whichever iteration (or statement) reads it first.
_ONE_SHOT = frozenset(
    {"map", "select", "reject", "selectattr", "rejectattr", "unique", "batch", "slice", "reverse", "items"}
)
#: Marks of the derived template's output: private-use characters around a random nonce of
#: this process, which never leaves it (the marks are cut out of the text), so no message can
#: hold one.
_NONCE = secrets.token_hex(8)
_END = f"\ue006{_NONCE}\ue006"
_ROWS, _MARK, _LAST, _AT = "openforge_loop_rows", "openforge_loop_mark", "openforge_loop_last", "openforge_loop_at"
#: The derived template's own variables (a template mentioning one does not qualify).
_OWN = frozenset({_ROWS, _MARK, _LAST, _AT})


class _NotLocal(Exception):
    """The template's message loop is not iteration-local (see the module docstring)."""


@dataclass
class LoopCache:
    """One conversation's previous render (a session's splicer keeps one).

    Attributes:
        messages: The messages rendered (their template dicts).
        bodies: The text of each loop iteration.
        context: The other variables of that render.
        text: The last render's text, None when that render was whole (:meth:`whole`) or
            there was none (the caller keeps it anyway: no copy).
        head_len: The length of its text before the loop.
        tail_len: The length of its text after the loop.
        reused: Iterations reused, over all renders (diagnostics and tests).
        quiet: Renders that made only the iterations, the text around them being the last
            render's (diagnostics and tests).
        off: The derived template's marks were not found once: renders are whole from then on.
        renders: Renders of the conversation, with the derived template or whole.
        same_prefix: How many leading characters of the last render are known to equal those
            of the render before it (0 when unknown).
    """

    messages: list[Mapping[str, Any]] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)
    context: dict[str, Any] | None = None
    text: str | None = None
    head_len: int = 0
    tail_len: int = 0
    reused: int = 0
    quiet: int = 0
    off: bool = False
    renders: int = 0
    same_prefix: int = 0

    def whole(self) -> None:
        """Notes a render of the conversation made by the original template (the iterations
        kept are still those of the last derived render; the text before is unknown)."""
        self.text, self.same_prefix = None, 0
        self.renders += 1


class MessageLoop:
    """The derived template of a qualifying chat template (:meth:`of`).

    Attributes:
        lookahead: How many messages after its own an iteration may read (at least 1:
            ``loop.last`` changes when a message is appended).
        lookbehind: How many before (the first iterations read from the end of the list).
    """

    def __init__(
        self, template: jinja2.Template, lookahead: int, lookbehind: int, quiet: jinja2.Template | None = None
    ) -> None:
        self._template = template
        self._quiet = quiet
        self.lookahead = lookahead
        self.lookbehind = lookbehind

    @staticmethod
    def of(env: jinja2.Environment, source: str) -> MessageLoop | None:
        """The derived template of ``source``, or None when its message loop does not qualify."""
        tree = env.parse(source)
        try:
            loop, lookahead, lookbehind = _check(tree)
        except _NotLocal:
            return None

        _rows(loop)
        index = tree.body.index(loop)
        tree.body.insert(index + 1, nodes.Output([nodes.TemplateData(_END)]))
        tree.set_lineno(loop.lineno)
        tree.set_environment(env)
        return MessageLoop(env.from_string(tree), lookahead, lookbehind, _quiet_template(env, source))

    def render(self, cache: LoopCache, messages: Sequence[Mapping[str, Any]], context: dict[str, Any]) -> str | None:
        """The template's text for ``messages`` and the other variables ``context``, rendering
        only the iterations that may differ from ``cache``'s render; updates ``cache``. None
        when the text holds the marks' characters (render it with the original template)."""
        if cache.off or not _OWN.isdisjoint(context):
            return None
        start = 0
        old = cache.messages
        same_context = cache.context is not None and _same(cache.context, context)
        if same_context:
            start = max(0, _unchanged(messages, old) - self.lookahead)
        first = min(self.lookbehind, start)  # these read from the end of the list: rendered too
        rendered = [*range(first), *range(start, len(messages))]
        rows = [(i, messages[i]) for i in rendered]
        variables = {**context, "messages": messages, _ROWS: rows, _MARK: _mark, _LAST: len(messages) - 1}
        last = cache.text  # None after a whole render: nothing is known then
        parts = None
        if same_context and messages and old and (messages[0] is old[0] or _equal(messages[0], old[0])):
            parts = self._iterations_only(cache, variables, rendered)
        same_head = parts is not None
        if parts is None:
            parts = _split(self._template.render(variables), rendered)
        if parts is None:  # not seen with a template that qualifies; if it were, stop trying
            cache.context, cache.off = None, True
            return None
        head, texts, tail = parts
        old_bodies = cache.bodies
        bodies = texts[:first] + old_bodies[first:start] + texts[first:]
        known = 0
        # the head cut from the last text is not compared with it: a slice whose characters are all
        # narrower than its text's widest is stored narrower, and strings stored at different
        # widths are compared character by character (a tenth of a millisecond for a long head)
        if same_head or (last is not None and len(head) == cache.head_len and last.startswith(head)):
            equal = 0  # leading iterations whose text is the previous render's
            while equal < min(len(bodies), len(old_bodies)) and bodies[equal] == old_bodies[equal]:
                equal = start if first <= equal < start else equal + 1  # those between are reused
            known = len(head) + sum(map(len, bodies[:equal]))
        out = "".join([head, *bodies, tail])
        cache.messages, cache.bodies, cache.context = list(messages), bodies, dict(context)
        cache.text, cache.head_len, cache.tail_len = out, len(head), len(tail)
        cache.reused += start - first
        cache.renders += 1
        cache.same_prefix = known
        return out

    def _iterations_only(
        self, cache: LoopCache, variables: dict[str, Any], rendered: list[int]
    ) -> tuple[str, list[str], str] | None:
        """The render with the text before and after the loop taken from the last render and
        only the iterations made (the template without its text around the loop), or None where
        that template writes around the iterations after all (or there is no last render)."""
        last = cache.text
        if self._quiet is None or last is None:
            return None
        parts = _split(self._quiet.render(variables), rendered)
        if parts is None or parts[0] or parts[2]:
            return None
        cache.quiet += 1
        return last[: cache.head_len], parts[1], last[len(last) - cache.tail_len :]


def _unchanged(messages: Sequence[Mapping[str, Any]], old: Sequence[Mapping[str, Any]]) -> int:
    """How many leading messages are the same as the last render's (the messages a session
    sends again are mostly the same objects: those are skipped at C speed)."""
    n = min(len(old), len(messages))
    same = same_objects(messages, old)
    while same < n and (messages[same] is old[same] or _equal(messages[same], old[same])):
        same += 1
    return same


def same_objects(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items of ``a`` and ``b`` are the same objects (compared at C speed)."""
    n = min(len(a), len(b))
    identical = list(map(operator.is_, a[:n], b[:n]))
    return identical.index(False) if False in identical else n


def _mark(i: int) -> str:
    return f"\ue004{_NONCE}:{i}\ue005"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return list(a) == list(b) and all(a[k] is b[k] or _equal(a[k], b[k]) for k in a)


def _equal(a: Any, b: Any) -> bool:
    """Equal values that a template renders alike: of the same types, dict keys in the same
    order, floats with the same sign (``==`` takes ``1``, ``1.0`` and ``True`` for one another,
    ``0.0`` for ``-0.0``, and ignores key order, all of which ``tojson`` or ``~`` can show).
    Compared with a stack of its own, not by recursion: JSON may nest deeper than Python's
    recursion limit."""
    pending = [(a, b)]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue
        if type(a) is not type(b):
            return False
        if type(a) is dict:
            if list(a) != list(b):
                return False
            pending.extend((a[k], b[k]) for k in a)
        elif type(a) is list or type(a) is tuple:
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif type(a) is float:
            if repr(a) != repr(b):
                return False
        elif not a == b:
            return False
    return True


def _split(text: str, rendered: list[int]) -> tuple[str, list[str], str] | None:
    """(head, the texts of the ``rendered`` iterations, tail) of a marked render, or None when a
    mark is missing. The marks are looked for from the end (the head, mostly the system prompt
    and the tools, is the longest part and is not searched)."""
    end = text.rfind(_END)
    if end < 0:
        return None
    texts = []
    stop = end
    for i in reversed(rendered):
        mark = _mark(i)
        at = text.rfind(mark, 0, stop)
        if at < 0:
            return None
        texts.append(text[at + len(mark) : stop])
        stop = at
    texts.reverse()
    return text[:stop], texts, text[end + len(_END) :]


def _check(tree: nodes.Template) -> tuple[nodes.For, int, int]:
    """The template's message loop, its lookahead and lookbehind, if it qualifies; raises
    :class:`_NotLocal`."""
    for bad in (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport, nodes.Block):
        if any(True for _ in tree.find_all(bad)):
            raise _NotLocal(bad.__name__)
    loops = [f for f in tree.find_all(nodes.For) if isinstance(f.iter, nodes.Name) and f.iter.name == "messages"]
    if len(loops) != 1 or loops[0] not in tree.body:
        raise _NotLocal("not one top-level loop over messages")
    loop = loops[0]
    if loop.recursive or loop.else_ or loop.test is not None or not isinstance(loop.target, nodes.Name):
        raise _NotLocal("loop form")
    walker = _Walker([m for m in tree.body if isinstance(m, nodes.Macro)])
    for node in tree.body:
        if node is loop:
            walker.visit(loop.target, in_loop=False)
            for child in loop.body:
                walker.visit(child, in_loop=True)
        elif isinstance(node, nodes.Macro):
            walker.visit(node, in_loop=False, in_macro=True)
        else:
            walker.visit(node, in_loop=False)
    return loop, max(1, walker.lookahead), max(0, -walker.lookbehind)


class _Walker:
    def __init__(self, macros: list[nodes.Macro]) -> None:
        self.macros = {m.name for m in macros}
        self.top_macros = {id(m) for m in macros}
        self.lookahead = 0
        self.lookbehind = 0  # the most negative offset

    def visit(self, node: nodes.Node, *, in_loop: bool, in_macro: bool = False) -> None:
        """``in_loop``: directly in the message loop (``loop`` is its loop)."""
        if isinstance(node, nodes.Name):
            if node.name == "messages":
                raise _NotLocal("messages used otherwise")
            if node.name == "loop" and in_loop:
                raise _NotLocal("loop used otherwise")
            if node.name in _STATEFUL:
                raise _NotLocal(f"{node.name} (state or chance)")
            if node.name in _OWN:
                raise _NotLocal(f"{node.name} is the derived template's")
            return
        if isinstance(node, nodes.Filter) and node.name == "random":
            raise _NotLocal("chance")
        if isinstance(node, nodes.Filter) and node.name in _ONE_SHOT and not (in_loop or in_macro or self._inside_loop):
            raise _NotLocal(f"a one-shot iterator ({node.name}) made outside the loop")
        if isinstance(node, nodes.Test) and node.name == "sameas":
            raise _NotLocal("identity (the cache compares messages by value)")
        if isinstance(node, nodes.Filter) and node.name in _BY_NAME:  # a test or filter named by a string
            if any(isinstance(a, nodes.Const) and a.value in ("sameas", "random") for a in node.args):
                raise _NotLocal("identity or chance named by a string")
        if isinstance(node, nodes.Macro) and id(node) not in self.top_macros:
            raise _NotLocal("a macro defined below the top level")
        if isinstance(node, nodes.Break) and in_loop:
            raise _NotLocal("a break out of the loop (the later iterations are not rendered)")
        if isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) and node.node.name == "messages":
            if in_macro:
                raise _NotLocal("messages in a macro")
            if isinstance(node.arg, nodes.Const) and node.arg.value == 0:
                return
            if not in_loop:
                raise _NotLocal("messages indexed outside the loop")
            offset = _offset(node.arg)
            self.lookahead = max(self.lookahead, offset)
            self.lookbehind = min(self.lookbehind, offset)
            return
        if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop":
            if in_loop and node.attr not in _POSITION:
                raise _NotLocal(f"loop.{node.attr}")
            return
        if isinstance(node, (nodes.Assign, nodes.AssignBlock)) and isinstance(node.target, nodes.NSRef):
            if in_loop or in_macro or self._inside_loop:
                raise _NotLocal("a namespace assigned in the loop or a macro")
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name):
            name = node.node.name
            if name not in self.macros and name not in _PURE_CALLS:
                raise _NotLocal(f"a call of {name}")
        if isinstance(node, nodes.For):
            # a nested loop: its iterable, its filter and its else block are evaluated where it
            # stands (``loop`` there is the enclosing one); its body has its own ``loop``
            for child in (node.iter, *([node.test] if node.test is not None else []), *node.else_):
                self.visit(child, in_loop=in_loop, in_macro=in_macro)
            outer = self._inside_loop
            self._inside_loop = outer or in_loop
            for child in (node.target, *node.body):
                self.visit(child, in_loop=False, in_macro=in_macro)
            self._inside_loop = outer
            return
        for child in node.iter_child_nodes():
            self.visit(child, in_loop=in_loop, in_macro=in_macro)

    _inside_loop = False


def _offset(arg: nodes.Expr) -> int:
    """The constant ``c`` of an index ``loop.index0 + c`` (``loop.index`` is ``loop.index0 + 1``)."""
    if isinstance(arg, nodes.Getattr) and isinstance(arg.node, nodes.Name) and arg.node.name == "loop":
        if arg.attr == "index0":
            return 0
        if arg.attr == "index":
            return 1
    if isinstance(arg, (nodes.Add, nodes.Sub)) and isinstance(arg.right, nodes.Const) and type(arg.right.value) is int:
        base = _offset(arg.left)
        return base + arg.right.value if isinstance(arg, nodes.Add) else base - arg.right.value
    raise _NotLocal("messages indexed by something else than the loop's position")


def _positions(node: nodes.Node, *, in_loop: bool) -> nodes.Node:
    """``node`` with the message loop's ``loop.<attr>`` (where ``in_loop``: its body, outside
    the bodies of nested loops; :class:`_Walker` proved these are ``index0``, ``index``,
    ``first`` and ``last`` only) replaced by the same value computed from the position."""
    if in_loop and isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop":
        at = nodes.Name(_AT, "load")
        if node.attr == "index0":
            return at
        if node.attr == "index":
            return nodes.Add(at, nodes.Const(1))
        if node.attr == "first":
            return nodes.Compare(at, [nodes.Operand("eq", nodes.Const(0))])
        if node.attr == "last":
            return nodes.Compare(at, [nodes.Operand("eq", nodes.Name(_LAST, "load"))])
        raise AssertionError(f"loop.{node.attr} in a qualifying loop")  # the walker refused it
    nested = isinstance(node, nodes.For)
    for name, value in node.iter_fields():
        # a nested loop's target and body have their own ``loop``; its iterable, filter and
        # else block are evaluated where it stands
        inner = in_loop and not (nested and name in ("target", "body"))
        if isinstance(value, nodes.Node):
            setattr(node, name, _positions(value, in_loop=inner))
        elif isinstance(value, list):
            setattr(node, name, [_positions(v, in_loop=inner) if isinstance(v, nodes.Node) else v for v in value])
    return node


def _rows(loop: nodes.For) -> None:
    """Makes the message loop step through ``openforge_loop_rows`` (position, message), each
    iteration starting with its mark, its ``loop`` attributes computed from the position."""
    loop.iter = nodes.Name(_ROWS, "load")
    loop.target = nodes.Tuple([nodes.Name(_AT, "store"), loop.target], "store")
    body = [_positions(child, in_loop=True) for child in loop.body]
    mark = nodes.Output([nodes.Call(nodes.Name(_MARK, "load"), [nodes.Name(_AT, "load")], [], None, None)])
    loop.body = [mark, *body]


def _quiet_template(env: jinja2.Environment, source: str) -> jinja2.Template | None:
    """The derived template that writes only the rendered iterations (and their marks), or None.

    What a qualifying template writes before and after its message loop depends only on the
    render's other variables and ``messages[0]`` (the walker allows ``messages`` outside the
    loop only as ``messages[0]``; nothing is random, read from the clock, or a one-shot
    iterator kept outside the loop), so with those unchanged it is the last render's text. The
    statements around the loop still run, without writing (their assignments may be read in
    the loop, and decide which names are the template's own). None when a statement around the
    loop is one this does not take apart, or uses a ``loop`` otherwise than by a stateless
    attribute (``loop.changed()`` called in dropped writing would change what the kept
    statements see).
    """
    tree = env.parse(source)
    try:
        loop, _, _ = _check(tree)
        at = tree.body.index(loop)
        _pure_loops(tree.body[:at] + tree.body[at + 1 :])
        before, after = _quiet_all(tree.body[:at]), _quiet_all(tree.body[at + 1 :])
    except _NotLocal:
        return None
    _rows(loop)
    # the statements after the loop stay (without writing): a name a template assigns anywhere at
    # its top level is the template's own from its start (Jinja reads it as undefined before)
    tree.body = [*before, loop, nodes.Output([nodes.TemplateData(_END)]), *after]
    tree.set_environment(env)
    return env.from_string(tree)


def _quiet(node: nodes.Node) -> nodes.Node | None:
    """``node`` without what it writes (None when it only writes); raises :class:`_NotLocal` for
    a statement it does not take apart."""
    if isinstance(node, nodes.Output):
        return None
    if isinstance(node, (nodes.Macro, nodes.Assign, nodes.AssignBlock)):  # a set block's text is its value
        return node
    if isinstance(node, nodes.If):
        node.body = _quiet_all(node.body)
        node.elif_ = [_quiet_if(e) for e in node.elif_]
        node.else_ = _quiet_all(node.else_)
        return node
    if isinstance(node, (nodes.For, nodes.With)):
        node.body = _quiet_all(node.body)
        if isinstance(node, nodes.For):
            node.else_ = _quiet_all(node.else_)
        return node
    raise _NotLocal(f"{type(node).__name__} around the loop")


def _quiet_if(node: nodes.If) -> nodes.If:
    quiet = _quiet(node)
    assert isinstance(quiet, nodes.If)
    return quiet


def _quiet_all(body: list[nodes.Node]) -> list[nodes.Node]:
    return [q for q in map(_quiet, body) if q is not None]


def _pure_loops(statements: list[nodes.Node]) -> None:
    """Raises :class:`_NotLocal` when ``statements`` use a ``loop`` otherwise than by a stateless
    attribute (``loop.changed()``, ``loop['changed']``, ``loop|attr(...)``, an alias of it): a
    call in dropped writing would change what the kept statements see."""
    for statement in statements:
        pure = {
            id(g.node)
            for g in statement.find_all(nodes.Getattr)
            if isinstance(g.node, nodes.Name) and g.node.name == "loop" and g.attr in _PURE_LOOP
        }
        for name in statement.find_all(nodes.Name):
            if name.name == "loop" and id(name) not in pure:
                raise _NotLocal("loop used with state around the message loop")
