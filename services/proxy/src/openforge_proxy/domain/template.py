"""Chat-template rendering the way ``transformers`` does it, without ``transformers``.

``PreTrainedTokenizerBase.apply_chat_template`` compiles the model's Jinja
template in an ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with the ``loopcontrols`` extension, a ``tojson`` filter
that keeps non-ASCII characters (``json.dumps(x, ensure_ascii=False)``), the
globals ``raise_exception`` and ``strftime_now``, and the ``{% generation %}``
block tag (rendered as its body); it renders with ``messages``, ``tools``
(None when empty), ``add_generation_prompt`` and the tokenizer's special
tokens (``bos_token``, ``eos_token``...). This module reproduces exactly that
(transformers 4.5x ``utils/chat_template_utils.py``), so a prompt rendered
here is the prompt a ``transformers``/vLLM server would render.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

from openforge_core.errors import FailedPrecondition
from openforge_proxy.domain.template_loop import LOOP_PROPERTIES, LoopCache, MessageLoop


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers' AssistantTracker)."""

    tags = {"generation"}  # noqa: RUF012  (jinja2's own attribute)

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


#: Objects whose ``tojson`` text a template remembers (then it forgets them all and starts over).
_JSON_MEMO = 4096
#: Distinct tool sets a template keeps (:meth:`ChatTemplate.shared_tools`).
_TOOL_SETS = 64


#: Render variable holding the clock ``strftime_now`` reads (not a name a template can write).
_NOW = "openforge.now"


@jinja2.pass_context
def _strftime_now(context: Context, fmt: str) -> str:
    """``strftime_now``: the render's clock (:meth:`ChatTemplate.render`'s ``now``), else the time."""
    now = context.get(_NOW)
    return (now if isinstance(now, datetime) else datetime.now()).strftime(fmt)


#: Attributes of plain dicts (methods); any other ``obj.name`` on a plain dict is an item lookup.
_DICT_ATTRS = frozenset(dir(dict))


class _Sandbox(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` with fast paths for ``message.role`` on plain dicts and
    for calls of the template's own macros.

    The sandbox resolves ``obj.name`` by trying the attribute first and, on
    ``AttributeError``, the item. For a plain ``dict`` and a name that is not an
    attribute of ``dict`` that attempt always fails, so the result is always the item (or
    undefined): returning it directly is the same value without raising and catching an
    exception per lookup (a template reads several per message, every call). The public
    properties of a ``loop`` variable (``loop.first``, ``loop.index0``...) are safe
    attributes the sandbox returns as they are; they are returned without its checks.

    A call of a macro the template defined (``render_content(message.content)``, once per
    message in Qwen-style templates) is always safe, so it is made directly, with what
    ``SandboxedEnvironment.call`` and ``Context.call`` (Jinja 3.1) would do for it: pass the
    active eval context first (``Macro.__call__`` takes it, for autoescaping), drop the
    ``_loop_vars``/``_block_vars`` bookkeeping arguments, and turn a ``StopIteration`` into
    an undefined value. A call with exactly the macro's positional arguments, of a macro
    without ``caller``, ``varargs`` or ``kwargs``, is its function's call (wrapped in
    ``Markup`` when autoescaping), which is all ``Macro.__call__`` does for it (Jinja 3.1.6).
    Everything else goes through the sandbox unchanged.
    """

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if type(__obj) is Macro:
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            try:
                if (
                    not kwargs
                    and len(args) == __obj._argument_count
                    and not (__obj.caller or __obj.explicit_caller or __obj.catch_kwargs or __obj.catch_varargs)
                    and not __self.is_async
                ):  # what Macro.__call__ and Macro._invoke come to for exactly the macro's arguments
                    rv = __obj._func(*args)
                    return Markup(rv) if __context.eval_ctx.autoescape else rv
                return __obj(__context.eval_ctx, *args, **kwargs)
            except StopIteration:
                return __self.undefined("value was undefined because a callable raised a StopIteration exception")
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if type(obj) is LoopContext and attribute in LOOP_PROPERTIES:
            return getattr(obj, attribute)  # public properties: the sandbox returns them as they are
        return super().getattr(obj, attribute)


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: The Jinja template text.
        special_tokens: ``bos_token``, ``eos_token``... passed to every render.

    Raises:
        FailedPrecondition: The template does not compile.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = self._tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise FailedPrecondition(f"the chat template does not compile: {exc}", reason="BAD_TEMPLATE") from exc
        self.source = source
        self._loop = MessageLoop.of(env, source)
        self._special = dict(special_tokens or {})
        self._json: dict[int, tuple[Any, tuple[Any, ...], str]] = {}
        self._tools: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def shared_tools(self, key: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tool definitions kept under ``key`` (their identity), else ``tools``, now kept.

        Every session of a harness offers the same tools: handing the renders one set of
        objects lets :meth:`_tojson` serialize them once. The objects are never changed.
        """
        kept = self._tools.get(key)
        if kept is not None:
            self._tools.move_to_end(key)
            return kept
        self._tools[key] = tools
        if len(self._tools) > _TOOL_SETS:
            self._tools.popitem(last=False)
        return tools

    def _tojson(
        self,
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        """``tojson``, remembered per object for dicts and lists.

        Renders get the same tool dicts while the tools do not change (:meth:`shared_tools`),
        and messages their same argument objects, so a call serializes only what is new.
        Entries hold their object (its id cannot be reused while remembered); nothing the
        proxy passes to a render is changed afterwards.
        """
        if not isinstance(x, dict | list):
            return _tojson(x, ensure_ascii, indent, separators, sort_keys)
        opts = (ensure_ascii, indent, separators, sort_keys)
        hit = self._json.get(id(x))
        if hit is not None and hit[0] is x and hit[1] == opts:
            return hit[2]
        out = _tojson(x, ensure_ascii, indent, separators, sort_keys)
        if len(self._json) >= _JSON_MEMO:
            self._json.clear()
        self._json[id(x)] = (x, opts, out)
        return out

    @property
    def incremental(self) -> bool:
        """Whether a :class:`LoopCache` spares re-rendering earlier messages (see
        :mod:`.template_loop`)."""
        return self._loop is not None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        cache: LoopCache | None = None,
        now: datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """Renders a conversation to prompt text.

        Args:
            messages: Messages as chat templates expect them (never changed afterwards, as
                everything given to a render: ``cache`` compares them with the next call's).
            tools: Tool definitions, or None/empty for none.
            add_generation_prompt: Append the assistant header.
            cache: The conversation's previous render: when the template qualifies, only the
                loop iterations that may differ from it are rendered (:mod:`.template_loop`);
                the text is the same.
            now: The time ``strftime_now`` gives (None: the current time). A session passes the
                same time to every render, so a template that writes today's date (Llama
                3.1-3.3: ``Today Date:`` in the system message) renders the conversation the
                model saw alike after midnight, and the prompt still extends the previous call.
            **kwargs: Extra template variables (``enable_thinking``...).

        Returns:
            The prompt text.

        Raises:
            jinja2.TemplateError: The template refused the conversation.
        """
        context = {
            "tools": (tools if isinstance(tools, list) else list(tools)) if tools else None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            **self._special,
            **kwargs,
        }
        if now is not None:
            context[_NOW] = now
        if cache is None:
            return self._template.render(messages=list(messages), **context)
        if self._loop is not None:
            text = self._loop.render(cache, list(messages), context)
            if text is not None:
                return text
        text = self._template.render(messages=list(messages), **context)
        cache.whole()
        return text

    def generation_prompt(self, **kwargs: Any) -> str:
        """The text ``add_generation_prompt=True`` appends after a conversation (both renders
        compared at one time: a template that writes the date would otherwise differ at
        midnight)."""
        probe = [{"role": "user", "content": "\x00probe\x00"}]
        now = datetime.now()
        with_prompt = self.render(probe, add_generation_prompt=True, now=now, **kwargs)
        without = self.render(probe, add_generation_prompt=False, now=now, **kwargs)
        if not with_prompt.startswith(without):
            raise FailedPrecondition("the generation prompt does not extend the conversation", reason="BAD_TEMPLATE")
        return with_prompt[len(without) :]
