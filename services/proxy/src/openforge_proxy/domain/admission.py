"""Requests into admitted calls, the first stages of a call (:class:`Admission`).

In order: the key → its session (401 when missing, unknown, closed or expired); the body → JSON
(a large one in the body parser's process, screened there for a prompt that cannot fit) → the
canonical request (400; unknown fields never refused) and the model name (404); the served
model's runtime (503 while inference is unreachable); the prompt ids by token-exact splice
(:mod:`.splice`); the call's identity (the same prompt and tools again is another *attempt* of
the same call: harness retries, Claude Code's non-streaming fallback); the session's limits
(turns, total tokens: 400, the status that stops each harness at once); the enforced sampling
and the call's seed. One request of a session is admitted at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import orjson

from openforge_core.errors import InvalidArgument, OpenForgeError, ResourceExhausted, Unauthenticated
from openforge_core.seeds import derive_seed
from openforge_proxy.domain.call import Prepared, error_response, new_request_id
from openforge_proxy.domain.conversation import CanonicalRequest, WireApi
from openforge_proxy.domain.engine import EngineUnavailable, Sampling
from openforge_proxy.domain.json_text import parse_object
from openforge_proxy.domain.offload import OFFLOAD_MIN_BYTES, off_loop
from openforge_proxy.domain.output import ApiError, ErrorKind
from openforge_proxy.domain.protocols import anthropic, dumps
from openforge_proxy.domain.protocols.codec import CODECS
from openforge_proxy.domain.protocols.memo import BodyMemo
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.screen import Screen, TooLong
from openforge_proxy.domain.session_calls import CallState, SessionCalls
from openforge_proxy.domain.sessions import Session, SessionRegistry
from openforge_proxy.domain.splice import Splicer
from openforge_proxy.domain.splice_plan import PromptPlan, PromptTooLong

RuntimeGetter = Callable[[], Awaitable[ModelRuntime]]


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


def api_key(headers: Mapping[str, str]) -> str:
    key = headers.get("x-api-key", "")
    if key:
        return key
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return ""


def _max_prompt(runtime: ModelRuntime) -> int:
    """The most tokens a prompt may have (0: no limit): the context less one for the answer. The
    splicer refuses past it, and the body parser's screen is given the same number."""
    return max(runtime.info.context_length - 1, 0)


def _check_model(session: Session, model: str) -> None:
    if session.model_name and model != session.model_name:
        raise ApiError(
            ErrorKind.NOT_FOUND, f"model {model!r} is not served in this session (use {session.model_name!r})"
        )


def _too_deep(exc: orjson.JSONEncodeError | RecursionError) -> ApiError:
    """A request whose JSON parses (orjson reads 1024 levels) but cannot be written again for its
    record (orjson writes at most 254 levels), or converted (a value nested past the interpreter's
    recursion limit): refused as such, never half served."""
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
    codec = CODECS[wire]
    try:
        try:
            request = codec.parse(parsed, state.parse_context(wire, memos=memos))
        except orjson.JSONEncodeError:
            if not memos:
                raise
            # the memos write each new message as they read it, so a part nested too deep is
            # found there first; without them (the reference path) the model and the prompt's
            # length are checked before the record is written: parsed as there
            request = codec.parse(parsed, state.parse_context(wire, memos=False))
    except InvalidArgument as exc:
        raise ApiError(ErrorKind.INVALID_REQUEST, exc.message) from exc
    except (orjson.JSONEncodeError, RecursionError) as exc:
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


class Admission:
    """Admits calls (:meth:`admit`) and keeps each session's call state.

    Args:
        sessions: The sessions.
        runtime: Loads the served model's runtime.
        max_heads: Generated turns a session's splicer keeps as heads.
        default_max_tokens: Completion cap when neither the harness nor the session gives one.
        offload_min_bytes: Bodies from this size (bytes) are converted in a worker thread.
        body_parser: Parses bodies from its ``min_bytes`` instead (None: none is). Such a
            body is converted without the session's parse memos.
        memos: Reuse what a session's earlier calls computed (the parsed body, the converted
            conversation, and the splicer's memos: ``Splicer(memos=...)``). False: every call
            is computed whole (the reference path; the same results).
    """

    def __init__(
        self,
        sessions: SessionRegistry,
        runtime: RuntimeGetter,
        *,
        max_heads: int = 4,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        offload_min_bytes: int = OFFLOAD_MIN_BYTES,
        body_parser: BodyParser | None = None,
        memos: bool = True,
    ) -> None:
        self._memos = memos
        self._sessions = sessions
        self._runtime = runtime
        self._max_heads = max_heads
        self._default_max = default_max_tokens
        self._offload_min = offload_min_bytes
        self._parser = body_parser
        self._loaded: ModelRuntime | None = None  # the model runtime, once loaded
        self._states: dict[str, SessionCalls] = {}
        # per session: the lock its requests are prepared under (present while one is held or
        # awaited) and its calls admitted and not yet answered
        self._locks: dict[str, _SessionLock] = {}
        self._in_flight: dict[str, int] = {}

    def state(self, rollout_id: str) -> SessionCalls | None:
        """A session's call state, if it made calls."""
        return self._states.get(rollout_id)

    @property
    def open_states(self) -> int:
        """Sessions holding call state."""
        return len(self._states)

    def forget(self, rollout_id: str) -> None:
        """Drops a session's call state (its key no longer works)."""
        self._states.pop(rollout_id, None)

    def done(self, p: Prepared) -> None:
        """An admitted call ended (answered or not): it is no longer in flight, and what it
        reserved of its session and did not use is free again."""
        rid = p.session.rollout_id
        left = self._in_flight.get(rid, 1) - 1
        if left > 0:
            self._in_flight[rid] = left
        else:
            self._in_flight.pop(rid, None)
        if not p.settled:
            self._sessions.release(p.session, p.reserved)

    async def count_tokens(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """``POST /v1/messages/count_tokens``: the prompt tokens of the request, spliced as a call would be.

        Returns:
            Status and JSON body (``{"input_tokens": N}`` or an Anthropic error).
        """
        wire = WireApi.ANTHROPIC_MESSAGES
        try:
            session = self.authenticate(headers)
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

    def authenticate(self, headers: Mapping[str, str]) -> Session:
        key = api_key(headers)
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
        if runtime is None or not _max_prompt(runtime) or not runtime.codec.plain_floor_piece:
            return None
        return Screen(wire, _max_prompt(runtime), runtime.codec.plain_floor_piece)

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
                    max_prompt_tokens=_max_prompt(runtime),
                    memos=self._memos,
                ),
                bodies,
            )
            self._states[rollout_id] = state
        return state

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

    async def admit(self, wire: WireApi, body: bytes, headers: Mapping[str, str]) -> Prepared:
        """The call a request makes, admitted and counted in its session (in flight until
        :meth:`done`). Nothing of a refused request stays in the session's state.

        Args:
            wire: The API called.
            body: The decompressed request body.
            headers: Request headers (lower-case names).

        Raises:
            ApiError: Refused (authentication, the body, the model, the prompt, a limit, or
                inference unavailable), with the status and message the caller gets.
        """
        session = self.authenticate(headers)
        rid = session.rollout_id
        async with self._session_lock(rid):
            prior = self._states.get(rid)
            # a large body is converted in a worker thread; never while a call of the session is
            # in flight (it commits its turn to the same splice state on the event loop)
            offload = len(body) >= self._offload_min and not self._in_flight.get(rid)
            try:
                prepared = await self._admit_locked(wire, body, session, prior, offload)
            except BaseException:
                self._refused(rid, prior)
                raise
            self._in_flight[rid] = self._in_flight.get(rid, 0) + 1
            return prepared

    async def _admit_locked(
        self, wire: WireApi, body: bytes, session: Session, prior: SessionCalls | None, offload: bool
    ) -> Prepared:
        bodies = prior.body if prior is not None else BodyMemo()
        large = self._large(body)
        memos = self._memos and not large
        call = self._screen(wire) if large else None
        parsed_or_refused = await self._parse(body, bodies if memos else None, offload=offload, call=call)
        runtime = await self._load_runtime()
        if isinstance(parsed_or_refused, TooLong):
            if self._screen(wire) != call:  # another model meanwhile: parsed again, unscreened
                parsed_or_refused = await self._parse(body, bodies if memos else None, offload=offload)
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
        # nothing awaits from here to the admission (_count)
        return self._count(session, state, request, tools[0], plan, runtime, canonical_json, body)

    def _count(
        self,
        session: Session,
        state: SessionCalls,
        request: CanonicalRequest,
        tools_key: str,
        plan: PromptPlan,
        runtime: ModelRuntime,
        canonical_json: bytes,
        body: bytes,
    ) -> Prepared:
        """The call's identity, the session's limits and the call's sampling, and the call
        counted in its session. Nothing awaits here: the limits are checked against the counts as
        they are now, calls in flight included, and the call is counted before any other can be.

        Raises:
            ApiError: The session ended, or a limit is reached.
        """
        # The call's identity is the prompt the engine would see (and the tools): the same
        # conversation sent again renders to the same ids, whatever the harness changed that
        # the model does not see. Hashing the packed ids (~2 bytes a token) is cheaper than
        # serializing the conversation again.
        call_key = state.call_key(tools_key, plan.prompt.packed)
        known = state.calls.get(call_key)
        try:
            session = self._sessions.current(session)
        except OpenForgeError as exc:
            raise ApiError(ErrorKind.AUTHENTICATION, "the session ended") from exc
        _check_limits(session, new_call=known is None)
        if known is not None:
            plan.report.retry(known.call_id)
        sampling = self._sampling(session, request, runtime, len(plan.prompt))
        if sampling.seed is not None:
            # a seed per call: the session's seed and the call's identity (its prompt and tools),
            # so each call of a rollout samples differently and the same call sent again the same
            sampling = replace(sampling, seed=derive_seed(sampling.seed, "call", call_key))
        new_call = known is None
        if known is None:
            state.counter += 1
            known = state.calls[call_key] = CallState(f"call{state.counter:04d}-{secrets.token_hex(3)}", 0)
        known.attempts += 1
        reserved = len(plan.prompt) + sampling.max_tokens
        session = self._sessions.admit(session, new_call=new_call, reserve_tokens=reserved)
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
            state.lineages.classify(request),
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


def _check_limits(session: Session, *, new_call: bool) -> None:
    """Refuses a call past its session's limits: turns (a new call only; a retry of a call the
    session counted is not another turn) and total tokens.

    Raises:
        ApiError: LIMIT_REACHED.
    """
    limits = session.limits
    if new_call and limits.max_turns and session.calls >= limits.max_turns:
        raise ApiError(ErrorKind.LIMIT_REACHED, f"rollout limit reached: {limits.max_turns} turns")
    if limits.max_total_tokens and session.total_tokens >= limits.max_total_tokens:
        raise ApiError(ErrorKind.LIMIT_REACHED, f"rollout limit reached: {limits.max_total_tokens} tokens")
