"""One generation read into its answer: :class:`Generation` (ids, logprobs, policy versions, the
parsed output, the stream's bytes), and the helpers that read the engine's stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import structlog

from openforge_proxy.domain.conversation import ToolKind
from openforge_proxy.domain.engine import Delta, EngineUnavailable
from openforge_proxy.domain.families import Event
from openforge_proxy.domain.output import AssistantOutput, Finish, ToolCallOut, Usage
from openforge_proxy.domain.protocols.codec import StreamEncoder

if TYPE_CHECKING:
    from openforge_proxy.domain.call import Prepared


log = structlog.get_logger(__name__)


class Generation:
    """Accumulates one generation: ids, logprobs, versions, parsed output."""

    def __init__(self, p: Prepared) -> None:
        rt = p.runtime
        self._p = p
        self._eos = rt.eos_ids | set(p.sampling.stop_token_ids)
        self._codec = rt.codec
        self._decoder = rt.codec.decoder()
        # the text the model writes after: none where the template opened the turn with nothing
        self._parser = rt.family.parser(rt.generation_prompt if p.plan.opened else "", p.request.tools)
        self.out = AssistantOutput()
        if p.request.logprobs:
            self.out.token_logprobs = []
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.reasoning_tokens = 0
        self._finish: Finish | None = None
        self._stopped = False

    def feed(self, delta: Delta, encoder: StreamEncoder | None) -> bytes:
        k = len(delta.token_ids)
        self.ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.versions.extend(delta.policy_versions)
        n = len(self.ids)
        if (
            len(delta.logprobs) not in (0, k)
            or len(delta.policy_versions) not in (0, k)
            or len(self.logprobs) not in (0, n)
            or len(self.versions) not in (0, n)
        ):
            # a record the store would refuse (and later records coded against it with it)
            raise EngineUnavailable(
                f"the engine sent {n} token ids with {len(self.logprobs)} logprobs and "
                f"{len(self.versions)} policy versions"
            )
        data = b""
        logprobs = self.out.token_logprobs
        for i, tid in enumerate(delta.token_ids):
            if self._stopped:
                continue
            if tid in self._eos:
                self._stopped = True
                continue
            text = self._decoder.step(tid)
            if logprobs is not None:
                logprobs.append((self._codec.token_bytes(tid), delta.logprobs[i] if i < len(delta.logprobs) else None))
            if self._parser.in_reasoning:
                self.reasoning_tokens += 1
            if text:
                data += self._events(self._parser.feed(text), encoder)
        if delta.finish is not None:
            self._finish = delta.finish
        return data

    def _events(self, events: list[Event], encoder: StreamEncoder | None) -> bytes:
        data = b""
        out = self.out
        for ev in events:
            if ev.kind == "reasoning":
                out.reasoning += ev.text
                if encoder is not None:
                    data += encoder.reasoning(ev.text)
            elif ev.kind == "text":
                out.text += ev.text
                if encoder is not None:
                    data += encoder.text(ev.text)
            elif ev.call is not None:
                out.tool_calls.append(self._call(ev))
        return data

    def _call(self, ev: Event) -> ToolCallOut:
        call = ev.call
        assert call is not None
        tool = self._p.request.tool(call.name)
        if tool is not None and tool.kind is ToolKind.CUSTOM:
            args = call.arguments
            raw = args.get("input") if isinstance(args, dict) and isinstance(args.get("input"), str) else None
            text = raw if raw is not None else call.arguments_json
            return ToolCallOut(
                id="",
                name=call.name,
                arguments=text,
                arguments_json=text,
                kind=ToolKind.CUSTOM,
                namespace=tool.namespace,
            )
        return ToolCallOut(
            id="",
            name=call.name,
            arguments=call.arguments,
            arguments_json=call.arguments_json,
            namespace=tool.namespace if tool is not None else None,
        )

    def close(self, encoder: StreamEncoder | None) -> bytes:
        """Ends parsing (the stream finished); returns the last deltas' bytes."""
        data = self._events(self._parser.finish(), encoder)
        self.out.finish = self._finish or Finish.STOP
        return data

    def usage(self, cached: int) -> Usage:
        return Usage(len(self._p.plan.prompt), len(self.ids), cached, self.reasoning_tokens)


async def until_finish(first: Delta, stream: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """The deltas after ``first`` up to the one that says the generation finished (the stream
    itself is left open: :meth:`CallHandler._drain` reads the rest)."""
    if first.finish is not None:
        return
    async for delta in stream:
        yield delta
        if delta.finish is not None:
            return


async def first_of(stream: AsyncIterator[Delta]) -> Delta:
    """The stream's first delta (a stream that ended without one: an empty stop).

    Raises:
        EngineUnavailable, EngineRejected: As the stream raises them.
    """
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return Delta(finish=Finish.STOP)
