"""One model call, end to end: authenticate, convert, splice, generate, answer, record.

:class:`CallHandler` is the proxy's core, free of HTTP, gRPC and NATS: the
HTTP layer hands it a body and a :class:`Responder`, the engine and the
recorder are injected. Order of one call:

1. key → session (401 when missing/unknown/closed/expired; the deadline is a limit);
2. JSON → canonical request (400; unknown fields never refused) and model name check (404);
3. the served model's runtime (503 while inference is unreachable);
4. prompt ids by token-exact splice (:mod:`.splice`);
5. call identity: the same prompt again (the same conversation and tools,
   whatever else the harness changed) is another *attempt* of the same call
   (harness retries, Claude Code's non-streaming fallback); limits (turns,
   total tokens; 400, the status that stops each harness at once); the
   enforced sampling;
6. ``Generate``; nothing is sent before the engine's first tokens arrive, so
   an unreachable engine is still a proper 503 in the caller's error shape;
7. deltas stream out as tokens arrive; tool calls leave only once generation
   ended successfully (Codex runs a tool at its item's ``output_item.done``);
8. the record is stored *before* the final event (``message_stop``,
   ``response.completed``, ``[DONE]``) or the non-streaming body is sent: an
   answer the harness accepted is never lost. If storing fails, the harness
   gets an error and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import orjson
import structlog

from openforge_core.errors import InvalidArgument, OpenForgeError, ResourceExhausted, Unauthenticated
from openforge_core.seeds import derive_seed
from openforge_proxy.domain.call import (
    Call,
    ClientGone,
    Prepared,
    PreRecord,
    Responder,
    break_off,
    error_response,
    new_request_id,
)
from openforge_proxy.domain.conversation import CanonicalRequest, WireApi
from openforge_proxy.domain.engine import Delta, Engine, EngineRejected, EngineUnavailable, Sampling
from openforge_proxy.domain.generation import Generation, first_of, until_finish
from openforge_proxy.domain.json_text import parse_object
from openforge_proxy.domain.offload import OFFLOAD_MIN_BYTES, off_loop
from openforge_proxy.domain.output import ApiError, AssistantOutput, ErrorKind, Finish, Usage
from openforge_proxy.domain.protocols import anthropic, dumps
from openforge_proxy.domain.protocols.codec import CODECS
from openforge_proxy.domain.protocols.memo import BodyMemo
from openforge_proxy.domain.record import CallRecordData, Recorder, RecordTooLarge, failed_record
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.screen import Screen, TooLong
from openforge_proxy.domain.scrub import scrub_headers
from openforge_proxy.domain.session_calls import CallState, SessionCalls
from openforge_proxy.domain.sessions import Session, SessionRegistry
from openforge_proxy.domain.splice import PromptPlan, PromptTooLong, Splicer

log = structlog.get_logger(__name__)

EV_CALL_DONE = "call.done"
EV_CALL_FAILED = "call.failed"
EV_CLIENT_GONE = "call.client_gone"
EV_RECORD_FAILED = "call.record_failed"
EV_AFTER_FINISH = "call.engine_after_finish"

#: Completion-token cap when neither the harness nor the session gives one.
DEFAULT_MAX_TOKENS = 4096


class BodyParser(Protocol):
    """Parses large request bodies away from the event loop's interpreter (the large-body
    fast path; :mod:`openforge_proxy.adapters.body_parser`). Without one, every body is
    parsed by :func:`~openforge_proxy.domain.json_text.parse_object` in this process.

    Attributes:
        min_bytes: Bodies from this size (bytes) are given to :meth:`parse`.
    """

    min_bytes: int

    async def parse(self, body: bytes, call: Screen | None = None) -> tuple[dict[str, Any], bytes] | TooLong:
        """What ``parse_object(body)`` returns; with ``call``, :func:`.screen.screen`'s
        refusal instead where it has one (the body's strings are then never built here).

        Raises:
            ApiError: What ``parse_object(body)`` raises (the same kind, message and status).
        """
        ...


RuntimeGetter = Callable[[], Awaitable[ModelRuntime]]


def _key(headers: Mapping[str, str]) -> str:
    key = headers.get("x-api-key", "")
    if key:
        return key
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return ""


def _check_model(session: Session, model: str) -> None:
    if session.model_name and model != session.model_name:
        raise ApiError(
            ErrorKind.NOT_FOUND, f"model {model!r} is not served in this session (use {session.model_name!r})"
        )


def _too_deep(exc: orjson.JSONEncodeError) -> ApiError:
    """A request whose JSON parses (orjson reads 1024 levels) but cannot be written again for its
    record (orjson writes at most 254 levels): refused as such, never half served."""
    return ApiError(
        ErrorKind.INVALID_REQUEST, f"the request cannot be recorded ({exc}): JSON nested over 254 levels deep"
    )


def _api_error(exc: OpenForgeError) -> ApiError:
    if isinstance(exc, Unauthenticated):
        return ApiError(ErrorKind.AUTHENTICATION, exc.message)
    if isinstance(exc, ResourceExhausted):
        return ApiError(ErrorKind.LIMIT_REACHED, f"rollout limit reached: {exc.message}")
    if isinstance(exc, InvalidArgument):
        return ApiError(ErrorKind.INVALID_REQUEST, exc.message)
    return ApiError(ErrorKind.INTERNAL, exc.message)


class CallHandler:
    """Serves model calls for every session.

    Args:
        sessions: The session registry.
        engine: Token-in/token-out generation.
        runtime: Returns the served model's runtime (loads it once; raises
            :class:`EngineUnavailable` while inference is unreachable).
        recorder: Stores call records.
        max_heads: Conversation views kept per session.
        default_max_tokens: Completion cap when nothing else gives one.
        offload_min_bytes: Bodies from this size (bytes) are parsed, rendered and tokenized in
            a worker thread (one at a time per session, and only while none of the session's
            calls is in flight); smaller ones on the event loop.
        body_parser: Parses bodies from its ``min_bytes`` instead (None: none is). Such a
            body is parsed whole and converted without the session's memos
            (:mod:`.protocols.memo`): they would serialize its values again here, which holds
            the interpreter as long as parsing it would; the result is the same.
    """

    def __init__(
        self,
        sessions: SessionRegistry,
        engine: Engine,
        runtime: RuntimeGetter,
        recorder: Recorder,
        *,
        max_heads: int = 4,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        offload_min_bytes: int = OFFLOAD_MIN_BYTES,
        body_parser: BodyParser | None = None,
    ) -> None:
        self._sessions = sessions
        self._engine = engine
        self._runtime = runtime
        self._recorder = recorder
        self._max_heads = max_heads
        self._default_max = default_max_tokens
        self._states: dict[str, SessionCalls] = {}
        self._offload_min = offload_min_bytes
        self._parser = body_parser
        self._loaded: ModelRuntime | None = None  # the model runtime, once loaded
        # per session: the lock its requests are prepared under (present while one is held or
        # awaited) and its calls admitted and not yet answered
        self._locks: dict[str, _SessionLock] = {}
        self._in_flight: dict[str, int] = {}
        self._draining: set[asyncio.Future[None]] = set()
        sessions.on_end.append(self.forget)

    def forget(self, rollout_id: str) -> None:
        """Drops a session's state (its key no longer works)."""
        self._states.pop(rollout_id, None)

    @property
    def open_states(self) -> int:
        """Sessions holding splice state."""
        return len(self._states)

    def state(self, rollout_id: str) -> SessionCalls | None:
        """A session's state, if it made calls (for tests and diagnostics)."""
        return self._states.get(rollout_id)

    def models(self, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """``GET /v1/models``: the session's model name, in a shape both Anthropic and OpenAI SDKs read.

        Returns:
            Status and JSON body (401 in the Anthropic or OpenAI shape without a valid key).
        """
        wire = WireApi.ANTHROPIC_MESSAGES if "anthropic-version" in headers else WireApi.OPENAI_CHAT
        try:
            session = self._authenticate(headers)
        except ApiError as err:
            status, body, _ = error_response(wire, err, new_request_id())
            return status, body
        name = session.model_name or "policy"
        model = {
            "id": name,
            "object": "model",
            "type": "model",
            "display_name": name,
            "created": int(session.create_time),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session.create_time)),
            "owned_by": "openforge",
        }
        return 200, dumps({"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name})

    async def count_tokens(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """``POST /v1/messages/count_tokens``: the prompt tokens of the request, spliced as a call would be.

        Returns:
            Status and JSON body (``{"input_tokens": N}`` or an Anthropic error).
        """
        wire = WireApi.ANTHROPIC_MESSAGES
        try:
            session = self._authenticate(headers)
            parsed = await self._parse(body, None, offload=False)
            assert not isinstance(parsed, TooLong)  # not screened
            request, _ = parsed
            runtime = await self._load_runtime()
            try:
                canonical = anthropic.parse({"max_tokens": 1, **request})
            except InvalidArgument as exc:
                raise ApiError(ErrorKind.INVALID_REQUEST, exc.message) from exc
            except orjson.JSONEncodeError as exc:
                raise _too_deep(exc) from exc
            _check_model(session, canonical.model)
            async with self._session_lock(session.rollout_id):
                prior = self._states.get(session.rollout_id)
                state = self._state(session.rollout_id, runtime)
                try:
                    plan = _build(state, canonical)
                except ApiError:
                    self._refused(session.rollout_id, prior)
                    raise
        except ApiError as err:
            status, payload, _ = error_response(wire, err, new_request_id())
            return status, payload
        return 200, dumps({"input_tokens": len(plan.prompt)})

    def harness_of(self, headers: Mapping[str, str]) -> str:
        """The harness of the session the request's key names ("" without a known key)."""
        return self._sessions.harness_of(_key(headers))

    def _authenticate(self, headers: Mapping[str, str]) -> Session:
        key = _key(headers)
        if not key:
            raise ApiError(ErrorKind.AUTHENTICATION, "missing API key (x-api-key or Authorization: Bearer)")
        try:
            return self._sessions.authenticate(key)
        except OpenForgeError as exc:
            raise _api_error(exc) from exc

    def _large(self, body: bytes) -> bool:
        """Whether ``body`` is parsed by the body parser (and converted without memos)."""
        return self._parser is not None and len(body) >= self._parser.min_bytes

    async def _parse(
        self, body: bytes, memo: BodyMemo | None, *, offload: bool, call: Screen | None = None
    ) -> tuple[dict[str, Any], bytes] | TooLong:
        """The parsed body and the body as it is recorded (:func:`.json_text.parse_object`):
        by the body parser for a large body (screened with ``call``), else here, in a worker
        thread if ``offload``."""
        if self._parser is not None and self._large(body):
            return await self._parser.parse(body, call)
        loads = memo.loads if memo is not None else orjson.loads
        if offload:
            return await off_loop(parse_object, body, loads)
        return parse_object(body, loads)

    def _screen(self, wire: WireApi) -> Screen | None:
        """What the body parser screens a large body of ``wire`` with: the loaded model's limits
        (None before a model is loaded, or where its tokenizer has no plain bound)."""
        runtime = self._loaded
        if runtime is None or not runtime.info.context_length or not runtime.codec.plain_floor_piece:
            return None
        return Screen(wire, max(runtime.info.context_length - 1, 0), runtime.codec.plain_floor_piece)

    async def _load_runtime(self) -> ModelRuntime:
        try:
            self._loaded = await self._runtime()
            return self._loaded
        except EngineUnavailable as exc:
            raise ApiError(ErrorKind.UNAVAILABLE, f"inference is unavailable: {exc}") from exc
        except OpenForgeError as exc:
            raise ApiError(ErrorKind.UNAVAILABLE, f"the served model cannot be used: {exc.message}") from exc

    def _state(self, rollout_id: str, runtime: ModelRuntime, bodies: BodyMemo | None = None) -> SessionCalls:
        state = self._states.get(rollout_id)
        if state is None:
            state = SessionCalls(
                Splicer(
                    runtime.template,
                    runtime.family,
                    runtime.codec,
                    runtime.generation_prompt,
                    sorted(runtime.eos_ids),
                    max_heads=self._max_heads,
                    template_kwargs=runtime.template_kwargs,
                    max_prompt_tokens=max(runtime.info.context_length - 1, 0),
                ),
                bodies,
            )
            self._states[rollout_id] = state
        return state

    async def handle(
        self, wire: WireApi, body: bytes, headers: Mapping[str, str], responder: Responder, *, received: float
    ) -> None:
        """Serves one call.

        Args:
            wire: The API called.
            body: The decompressed request body.
            headers: Request headers (lower-case names).
            responder: Where the answer goes.
            received: ``time.monotonic()`` when the request arrived.
        """
        request_id = new_request_id()
        receive_time = time.time()
        try:
            prepared = await self._prepare(wire, body, headers)
        except ApiError as err:
            status, payload, extra = error_response(wire, err, request_id)
            log.info(EV_CALL_FAILED, wire=wire.value, status=status, kind=err.kind.value, message=err.message)
            await responder.send_json(status, payload, extra)
            return
        try:
            await self._serve(prepared, headers, responder, request_id, received, receive_time)
        except BaseException as exc:  # a bug, or the proxy stopping: the admitted call still leaves its record
            if not (prepared.settled or prepared.failure_recorded):
                log.error(EV_CALL_FAILED, call_id=prepared.call_id, attempt=prepared.attempt, error=repr(exc))
                await self._record_failed(
                    prepared, headers, f"the proxy failed serving the call: {exc!r}", 0, received, receive_time
                )
            raise
        finally:
            rid = prepared.session.rollout_id
            left = self._in_flight.get(rid, 1) - 1
            if left > 0:
                self._in_flight[rid] = left
            else:
                self._in_flight.pop(rid, None)
            if not prepared.settled:  # not served: what it reserved is free again
                self._sessions.release(prepared.session, prepared.reserved)

    @contextlib.asynccontextmanager
    async def _session_lock(self, rollout_id: str) -> AsyncIterator[None]:
        """Holds the session's lock: one request of a session is prepared at a time (its
        conversion and splice state is not shared with a worker thread)."""
        entry = self._locks.get(rollout_id)
        if entry is None:
            entry = self._locks[rollout_id] = _SessionLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:  # no request holds or awaits it
                del self._locks[rollout_id]

    def _refused(self, rollout_id: str, prior: SessionCalls | None) -> None:
        """A request of the session was refused: what it left in the session's state goes (a
        state it created, else the caches it filled)."""
        state = self._states.get(rollout_id)
        if state is None:
            return
        if prior is None:
            del self._states[rollout_id]
        else:
            state.drop_caches()

    async def _prepare(self, wire: WireApi, body: bytes, headers: Mapping[str, str]) -> Prepared:
        session = self._authenticate(headers)
        rid = session.rollout_id
        async with self._session_lock(rid):
            prior = self._states.get(rid)
            # a large body is converted in a worker thread; never while a call of the session is
            # in flight (it commits its turn to the same splice state on the event loop)
            offload = len(body) >= self._offload_min and not self._in_flight.get(rid)
            try:
                prepared = await self._prepare_locked(wire, body, session, prior, offload)
            except BaseException:
                self._refused(rid, prior)
                raise
            self._in_flight[rid] = self._in_flight.get(rid, 0) + 1
            return prepared

    async def _prepare_locked(
        self, wire: WireApi, body: bytes, session: Session, prior: SessionCalls | None, offload: bool
    ) -> Prepared:
        bodies = prior.body if prior is not None else BodyMemo()
        memos = not self._large(body)
        call = None if memos else self._screen(wire)
        parsed_or_refused = await self._parse(body, bodies, offload=offload, call=call)
        runtime = await self._load_runtime()
        if isinstance(parsed_or_refused, TooLong):
            if self._screen(wire) != call:  # another model meanwhile: parsed again, unscreened
                parsed_or_refused = await self._parse(body, bodies, offload=offload)
            else:  # what the reference path checks before the prompt's length, then that
                _check_model(session, parsed_or_refused.model)
                raise ApiError(ErrorKind.INVALID_REQUEST, str(parsed_or_refused.error()))
        assert not isinstance(parsed_or_refused, TooLong)
        parsed, body = parsed_or_refused
        state = self._state(session.rollout_id, runtime, bodies)
        if offload:
            request, tools, canonical_json, plan = await off_loop(_convert, wire, parsed, state, session, memos)
        else:
            request, tools, canonical_json, plan = _convert(wire, parsed, state, session, memos)
        # The call's identity is the prompt the engine would see (and the tools): the same
        # conversation sent again renders to the same ids, whatever the harness changed that
        # the model does not see. Hashing the packed ids (~2 bytes a token) is cheaper than
        # serializing the conversation again.
        call_key = state.call_key(tools[0], plan.prompt.packed)
        known = state.calls.get(call_key)
        # From here to the admission nothing awaits: the limits are checked against the counts as
        # they are now, calls in flight included, and the call is counted before any other can be.
        try:
            session = self._sessions.current(session)
        except OpenForgeError as exc:
            raise ApiError(ErrorKind.AUTHENTICATION, "the session ended") from exc
        limits = session.limits
        if known is None:
            if limits.max_turns and session.calls >= limits.max_turns:
                raise ApiError(ErrorKind.LIMIT_REACHED, f"rollout limit reached: {limits.max_turns} turns")
        else:
            plan.report.retry(known.call_id)
        if limits.max_total_tokens and session.total_tokens >= limits.max_total_tokens:
            raise ApiError(ErrorKind.LIMIT_REACHED, f"rollout limit reached: {limits.max_total_tokens} tokens")
        sampling = self._sampling(session, request, runtime, len(plan.prompt))
        if sampling.seed is not None:
            # a seed per call: the session's seed and the call's identity (its prompt and tools),
            # so each call of a rollout samples differently and the same call sent again the same
            sampling = replace(sampling, seed=derive_seed(sampling.seed, "call", call_key))
        if known is None:
            state.counter += 1
            known = CallState(f"call{state.counter:04d}-{secrets.token_hex(3)}", 0)
            state.calls[call_key] = known
            new_call = True
        else:
            new_call = False
        known.attempts += 1
        reserved = len(plan.prompt) + sampling.max_tokens
        session = self._sessions.admit(session, new_call=new_call, reserve_tokens=reserved)
        call_class = state.lineages.classify(request)
        return Prepared(
            session,
            state,
            request,
            runtime,
            plan,
            sampling,
            known.call_id,
            known.attempts,
            reserved,
            canonical_json,
            body,
            call_class,
        )

    def _sampling(
        self, session: Session, request: CanonicalRequest, runtime: ModelRuntime, prompt_len: int
    ) -> Sampling:
        enforced = session.sampling
        caps = [request.max_tokens or self._default_max]
        if enforced.max_tokens > 0:
            caps.append(enforced.max_tokens)
        limits = session.limits
        if limits.max_tokens_per_call:
            caps.append(limits.max_tokens_per_call)
        if limits.max_total_tokens:
            caps.append(limits.max_total_tokens - session.total_tokens - session.reserved_tokens - prompt_len)
        context = runtime.info.context_length
        if context:
            if prompt_len >= context:
                raise ApiError(
                    ErrorKind.INVALID_REQUEST,
                    f"prompt is too long: {prompt_len} tokens > {context - 1} maximum",
                )
            caps.append(context - prompt_len)
        max_tokens = min(caps)
        if max_tokens < 1:
            if limits.max_total_tokens and limits.max_total_tokens - session.total_tokens - prompt_len >= 1:
                # room once the calls in flight end: a retry can succeed, the rollout goes on
                raise ApiError(
                    ErrorKind.UNAVAILABLE,
                    "the rollout's token budget is held by its calls in flight; retry",
                    retry_after_s=1,
                )
            raise ApiError(ErrorKind.LIMIT_REACHED, "rollout limit reached: no tokens left in the budget")
        return Sampling.enforced(enforced, max_tokens)

    async def _serve(
        self,
        p: Prepared,
        headers: Mapping[str, str],
        responder: Responder,
        request_id: str,
        received: float,
        receive_time: float,
    ) -> None:
        """One admitted call's stages: first delta, generation, answer, record (published, the
        turn committed), tokens counted, answer delivered. Each stage that ends the call answers
        it and leaves its failed record itself."""
        gen_id = f"{p.session.rollout_id}/{p.call_id}/{p.attempt}"
        stream = self._engine.generate(gen_id, p.plan.prompt, p.sampling)
        try:
            first, pre = await self._first_delta(p, stream)
        except (EngineUnavailable, EngineRejected) as exc:
            kind = ErrorKind.UNAVAILABLE if isinstance(exc, EngineUnavailable) else ErrorKind.INVALID_REQUEST
            status, payload, extra = error_response(p.request.wire, ApiError(kind, f"inference: {exc}"), request_id)
            log.info(EV_CALL_FAILED, wire=p.request.wire.value, status=status, call_id=p.call_id, reason=str(exc))
            await self._record_failed(p, headers, f"inference: {exc}", status, received, receive_time)
            await responder.send_json(status, payload, extra)
            return
        gen = Generation(p)
        encoder = p.codec.stream_encoder(p.request, gen.out, p.sampling)
        call = Call(p, headers, responder, request_id, received, receive_time, gen, encoder, pre)
        try:
            tail = await self._generate(call, first, stream, gen_id)
            if tail is None:
                return
            usage, final = self._answer(call, tail)
            if not await self._check_session(call):
                return
            record = self._record(call, usage)
            if await self._publish(call, record, final) and await self._settle(call, usage):
                p.state.recorded(record, call.turn_id)
                await self._deliver(call, final, usage)
        finally:
            self._drain(stream, p.call_id)

    async def _first_delta(self, p: Prepared, stream: AsyncIterator[Delta]) -> tuple[Delta, PreRecord | None]:
        """The generation's first delta, and for a non-streamed answer the record's parts that do
        not depend on the answer, built while the engine computes (its prefill is the longest
        wait of a call); a stream's are built after its first byte, so that byte does not wait.

        Raises:
            EngineUnavailable, EngineRejected: The generation failed before its first token.
        """
        pre = None
        first_delta = asyncio.ensure_future(first_of(stream))
        if not p.request.stream:
            try:
                for _ in range(_SEND_YIELDS):  # let the Generate request leave first
                    await asyncio.sleep(0)
                pre = PreRecord.of(p, self._recorder)
            except BaseException:  # cancelled meanwhile (client gone), or a bug: end the generation
                first_delta.cancel()
                raise
        return await first_delta, pre

    async def _generate(self, call: Call, first: Delta, stream: AsyncIterator[Delta], gen_id: str) -> bytes | None:
        """The generation read to its finish (a streamed answer written as it comes); returns
        what the encoder still holds, or None where the call ended here (the client left, or
        inference failed mid-generation: answered and recorded as failed)."""
        p, gen, encoder, responder = call.p, call.gen, call.encoder, call.responder
        try:
            if p.request.stream:
                await responder.begin_stream({p.codec.id_header: call.request_id})
                call.ttfb = time.monotonic() - call.received
                data = encoder.start(call.usage0) + gen.feed(first, encoder)
                call.sent.append(data)
                await responder.write(data)
                call.pre = PreRecord.of(p, self._recorder)
                async for delta in until_finish(first, stream):
                    data = gen.feed(delta, encoder)
                    if data:
                        call.sent.append(data)
                        await responder.write(data)
            else:
                gen.feed(first, None)
                async for delta in until_finish(first, stream):
                    gen.feed(delta, None)
            return gen.close(encoder if p.request.stream else None)
        except ClientGone:
            log.info(EV_CLIENT_GONE, call_id=p.call_id, attempt=p.attempt)
            await self._engine.abort(gen_id)
            await self._record_failed(
                p, call.headers, "the client went away", 0, call.received, call.receive_time, finish=Finish.ABORT
            )
        except (EngineUnavailable, EngineRejected) as exc:
            log.info(EV_CALL_FAILED, call_id=p.call_id, attempt=p.attempt, reason=str(exc), mid_stream=True)
            err = ApiError(ErrorKind.UNAVAILABLE, f"inference: {exc}")
            # a stream began with 200 and ends with the protocol's error event
            status = 200 if p.request.stream else err.status
            await self._record_failed(p, call.headers, err.message, status, call.received, call.receive_time)
            if p.request.stream:
                try:
                    await responder.write(encoder.error(f"inference failed: {exc}"))
                except ClientGone:
                    pass
            else:
                status, payload, extra = error_response(p.request.wire, err, call.request_id)
                await responder.send_json(status, payload, extra)
        return None

    def _answer(self, call: Call, tail: bytes) -> tuple[Usage, bytes]:
        """The call's usage and the answer's last bytes (a stream's end, or the whole answer).
        The RPC's end is read once the answer is out: what it costs is not on the answer's path."""
        p, out = call.p, call.gen.out
        usage = call.gen.usage(p.plan.cached_tokens)
        self._finish_ids(p, out)
        if p.request.stream:
            final = tail + call.encoder.finish(usage)
        else:
            call.ttfb = time.monotonic() - call.received
            final = dumps(p.codec.response_body(p.request, out, usage, p.sampling))
        call.sent.append(final)
        if call.pre is None:
            call.pre = PreRecord.of(p, self._recorder)
        return usage, final

    async def _check_session(self, call: Call) -> bool:
        """Whether the call's session is still the one it was admitted in (checked before anything
        is published or sent: a session gone meanwhile fails the call cleanly)."""
        try:
            self._sessions.current(call.p.session)
        except OpenForgeError:
            err = ApiError(ErrorKind.AUTHENTICATION, "the session ended while the call was served")
            log.info(EV_CALL_FAILED, call_id=call.p.call_id, attempt=call.p.attempt, reason=err.message)
            await self._record_failed(call.p, call.headers, err.message, 0, call.received, call.receive_time)
            await self._break_off(call, err)
            return False
        return True

    def _record(self, call: Call, usage: Usage) -> CallRecordData:
        """The call's record."""
        p, gen, pre = call.p, call.gen, call.pre
        assert pre is not None
        return CallRecordData(
            rollout_id=p.session.rollout_id,
            run_id=p.session.run_id,
            call_id=p.call_id,
            attempt=p.attempt,
            wire_api=p.request.wire,
            model=p.request.model,
            request_json=pre.request_json,
            request_headers=scrub_headers(call.headers),
            canonical_json=pre.canonical_json,
            prompt=p.plan.prompt,
            completion_ids=gen.ids,
            logprobs=gen.logprobs,
            policy_versions=gen.versions,
            sampling=p.sampling,
            finish=gen.out.finish,
            receive_time=call.receive_time,
            ttfb_s=call.ttfb,
            total_s=time.monotonic() - call.received,
            splice=p.plan.report,
            response_body=b"".join(call.sent),
            stream=p.request.stream,
            extra={"turn_id": call.turn_id},
            cut=pre.cut,
            parts=pre.parts,
            rollout_attempt=p.session.rollout_attempt,
            role=p.call_class.role,
            lineage_id=p.call_class.lineage_id,
        )

    async def _publish(self, call: Call, record: CallRecordData, final: bytes) -> bool:
        """Publishes the record and commits the call's turn to the session's splice state; False
        (the call broken off, recorded as failed) where the bus did not acknowledge the record.

        A whole answer is held one byte short while the bus acknowledges (:meth:`Responder.hold_json`):
        the harness holds no complete answer before its record is stored."""
        p, responder = call.p, call.responder
        recording = asyncio.ensure_future(self._recorder.record(record))
        # one turn: the record is encoded and queued, or refused (too large, no connection);
        # another: the bus client's writer sends it, so its acknowledgement is under way
        # while the answer is written and the turn committed
        for _ in range(_PUBLISH_YIELDS):
            await asyncio.sleep(0)
        if not p.request.stream and not recording.done():
            await responder.hold_json(200, final, {p.codec.id_header: call.request_id})
            call.held = True
        # no request can hold this turn before its answer is complete (after the acknowledgement)
        try:
            p.state.splicer.commit(
                p.plan, call_id=p.call_id, attempt=p.attempt, output=call.gen.out, sampled=call.gen.ids
            )
            if responder.client_gone():  # left already: its answer will not reach it
                p.state.splicer.undelivered(call.turn_id)
        except BaseException:  # a bug: the answer must not stay one byte short
            if call.held:
                responder.abort()
            recording.cancel()
            raise
        try:
            await recording
        except Exception as exc:
            if isinstance(exc, RecordTooLarge):  # retrying cannot succeed: the harness must stop
                log.error(EV_RECORD_FAILED, call_id=p.call_id, attempt=p.attempt, error=str(exc))
                err = ApiError(ErrorKind.LIMIT_REACHED, f"rollout limit reached: {exc}")
                # nothing of the refused call stays in the session (its ids, the body parsed)
                p.state.splicer.forget_head(call.turn_id)
                p.state.drop_caches()
            else:
                log.error(EV_RECORD_FAILED, call_id=p.call_id, attempt=p.attempt, error=type(exc).__name__)
                err = ApiError(ErrorKind.UNAVAILABLE, "the call could not be recorded; retry")
            await self._record_failed(p, call.headers, f"record: {exc}", 0, call.received, call.receive_time)
            await self._break_off(call, err)
            return False
        return True

    async def _settle(self, call: Call, usage: Usage) -> bool:
        """Counts the call's tokens in its session once stored (a call that could not be recorded
        is retried, and counted then); False (the call broken off) where the session was
        replaced while the record was acknowledged."""
        p = call.p
        try:
            self._sessions.settle(p.session, reserved=p.reserved, tokens=usage.prompt_tokens + len(call.gen.ids))
        except OpenForgeError:
            p.settled = True  # nothing of it is left to release
            err = ApiError(ErrorKind.AUTHENTICATION, "the session ended while the call was served")
            log.info(EV_CALL_FAILED, call_id=p.call_id, attempt=p.attempt, reason=err.message, recorded=True)
            await self._break_off(call, err)
            return False
        p.settled = True
        return True

    async def _deliver(self, call: Call, final: bytes, usage: Usage) -> None:
        """The answer's last bytes to the harness (a held answer released)."""
        p, responder = call.p, call.responder
        try:
            if p.request.stream:
                await responder.write(final)
            elif call.held:
                await responder.release()
            else:
                await responder.send_json(200, final, {p.codec.id_header: call.request_id})
            if responder.client_gone():
                raise ClientGone()
        except ClientGone:
            log.info(
                EV_CLIENT_GONE, rollout_id=p.session.rollout_id, call_id=p.call_id, attempt=p.attempt, after_record=True
            )
            p.state.splicer.undelivered(call.turn_id)
            return
        log.info(
            EV_CALL_DONE,
            rollout_id=p.session.rollout_id,
            call_id=p.call_id,
            attempt=p.attempt,
            wire=p.request.wire.value,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            finish=call.gen.out.finish.value,
            break_cause=p.plan.report.break_cause.value,
        )

    async def _break_off(self, call: Call, err: ApiError) -> None:
        await break_off(
            call.responder,
            call.encoder,
            err,
            call.p.request.wire,
            call.request_id,
            stream=call.p.request.stream,
            held=call.held,
        )

    async def _record_failed(
        self,
        p: Prepared,
        headers: Mapping[str, str],
        error: str,
        status: int,
        received: float,
        receive_time: float,
        *,
        finish: Finish = Finish.ERROR,
    ) -> None:
        """Stores the record of an admitted call that was not answered (:func:`.record.failed_record`),
        so the rollout's count of calls (taken at admission) is met by its records. Best effort: a
        record that cannot be stored is logged (the harness's retry of the call, a new attempt with
        the same call id, closes the count then)."""
        record = failed_record(
            rollout_id=p.session.rollout_id,
            run_id=p.session.run_id,
            rollout_attempt=p.session.rollout_attempt,
            call_id=p.call_id,
            attempt=p.attempt,
            wire_api=p.request.wire,
            model=p.request.model,
            stream=p.request.stream,
            sampling=p.sampling,
            request_headers=scrub_headers(headers),
            error=error,
            http_status=status,
            finish=finish,
            receive_time=receive_time,
            total_s=time.monotonic() - received,
        )
        record.role, record.lineage_id = p.call_class.role, p.call_class.lineage_id
        p.failure_recorded = True
        try:
            await asyncio.shield(self._recorder.record(record))
        except Exception as exc:
            log.error(EV_RECORD_FAILED, call_id=p.call_id, attempt=p.attempt, error=type(exc).__name__, failed=True)

    def _drain(self, stream: AsyncIterator[Delta], call_id: str) -> None:
        """Reads a generation's stream to its end in the background, once a delta said it finished
        and the call's answer is out (or the call ended otherwise): the answer waits neither for
        the RPC's closing status nor for the reading of it, and the RPC still ends as the engine
        ends it (not cancelled)."""

        async def rest() -> None:
            try:
                async for delta in stream:
                    if delta.token_ids:  # not part of the answer or the record
                        log.warning(EV_AFTER_FINISH, call_id=call_id, tokens=len(delta.token_ids))
            except Exception as exc:  # the answer is out: what went wrong after it is only logged
                log.warning(EV_AFTER_FINISH, call_id=call_id, error=repr(exc))

        task = asyncio.ensure_future(rest())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    def _finish_ids(self, p: Prepared, out: AssistantOutput) -> None:
        p.codec.prepare_ids(out, p.request)


def _build(
    state: SessionCalls, request: CanonicalRequest, tools: tuple[str, list[dict[str, Any]]] | None = None
) -> PromptPlan:
    """The request's prompt plan.

    Raises:
        ApiError: The prompt cannot fit the context, or the template refused the conversation.
    """
    try:
        return state.splicer.build(request.messages, request.tools, tools_of=tools)
    except PromptTooLong as exc:
        raise ApiError(ErrorKind.INVALID_REQUEST, str(exc)) from exc
    except Exception as exc:  # the template refused the conversation
        raise ApiError(ErrorKind.INVALID_REQUEST, f"the conversation cannot be rendered: {exc}") from exc


def _convert(
    wire: WireApi, parsed: dict[str, Any], state: SessionCalls, session: Session, memos: bool = True
) -> tuple[CanonicalRequest, tuple[str, list[dict[str, Any]]], bytes, PromptPlan]:
    """A parsed body into its canonical request, tools key, recorded canonical JSON and prompt
    plan (the CPU-heavy part of a call's preparation; touches only the session's state).
    ``memos``: through the session's conversation memos (the same result, less work for a
    conversation that grew; their own work is serializing every new message once).

    Raises:
        ApiError: The request is invalid, names another model, or cannot be rendered or fit.
    """
    try:
        request = CODECS[wire].parse(parsed, state.parse_context(wire, memos=memos))
    except InvalidArgument as exc:
        raise ApiError(ErrorKind.INVALID_REQUEST, exc.message) from exc
    except orjson.JSONEncodeError as exc:
        raise _too_deep(exc) from exc
    _check_model(session, request.model)
    try:
        tools = state.splicer.tools_key(request.tools)
    except orjson.JSONEncodeError as exc:
        raise _too_deep(exc) from exc
    plan = _build(state, request, tools)  # first: a prompt that cannot fit is refused before the rest
    try:
        canonical_json = request.record_json()
    except orjson.JSONEncodeError as exc:
        raise _too_deep(exc) from exc
    return request, tools, canonical_json, plan


class _SessionLock:
    """A session's lock and the requests holding or awaiting it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


#: Event-loop turns given to a new ``Generate`` call to send its request (grpc.aio sends it
#: from a task of its own) before the handler goes on with work that does not need the answer.
_SEND_YIELDS = 3
#: Event-loop turns given to a record's publication before a non-streamed answer is written:
#: one to encode and queue it (or refuse it), one for the NATS client's writer task to send it.
_PUBLISH_YIELDS = 2
