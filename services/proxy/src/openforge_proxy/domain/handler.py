"""One model call, end to end: admitted, generated, answered, recorded, delivered.

:class:`CallHandler` is the proxy's core, free of HTTP, gRPC and NATS: the HTTP layer hands it
a body and a :class:`~.call.Responder`; the engine and the recorder are injected. The stages:

1. admission (:mod:`.admission`): key → session, body → canonical request, model runtime,
   prompt by token-exact splice, call identity and attempt, limits, sampling;
2. ``Generate``; nothing is sent before the engine's first tokens arrive, so an unreachable
   engine is still a proper 503 in the caller's error shape;
3. deltas stream out as tokens arrive; tool calls leave only once generation ended
   successfully (Codex runs a tool at its item's ``output_item.done``);
4. the record is stored *before* the final event (``message_stop``, ``response.completed``,
   ``[DONE]``) or the last byte of a whole answer is sent: an answer the harness accepted is
   never lost. If storing fails, the harness gets an error and retries;
5. the session's tokens are counted and the answer delivered.

Each API's shapes come from its :class:`~.protocols.codec.WireCodec`; the stages name none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping

import structlog

from openforge_core.errors import OpenForgeError
from openforge_proxy.domain.admission import Admission, api_key
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
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.engine import Delta, Engine, EngineRejected, EngineUnavailable
from openforge_proxy.domain.generation import Generation, first_of, until_finish
from openforge_proxy.domain.output import ApiError, AssistantOutput, ErrorKind, Finish, Usage
from openforge_proxy.domain.protocols import dumps
from openforge_proxy.domain.record import CallRecordData, Recorder, RecordTooLarge, failed_record
from openforge_proxy.domain.scrub import scrub_headers
from openforge_proxy.domain.session_calls import SessionCalls
from openforge_proxy.domain.sessions import SessionRegistry

log = structlog.get_logger(__name__)

EV_CALL_DONE = "call.done"
EV_CALL_FAILED = "call.failed"
EV_CLIENT_GONE = "call.client_gone"
EV_RECORD_FAILED = "call.record_failed"
EV_AFTER_FINISH = "call.engine_after_finish"


class CallHandler:
    """Serves model calls for every session: admitted by ``admission``, then generated, answered,
    recorded and delivered.

    Args:
        sessions: The session registry.
        engine: Token-in/token-out generation.
        recorder: Stores call records.
        admission: Admits calls and keeps each session's call state.
    """

    def __init__(self, sessions: SessionRegistry, engine: Engine, recorder: Recorder, admission: Admission) -> None:
        self._sessions = sessions
        self._engine = engine
        self._recorder = recorder
        self._admission = admission
        self._draining: set[asyncio.Future[None]] = set()
        sessions.on_end.append(self.forget)

    def forget(self, rollout_id: str) -> None:
        """Drops a session's state (its key no longer works)."""
        self._admission.forget(rollout_id)

    @property
    def open_states(self) -> int:
        """Sessions holding splice state."""
        return self._admission.open_states

    def state(self, rollout_id: str) -> SessionCalls | None:
        """A session's state, if it made calls (for tests and diagnostics)."""
        return self._admission.state(rollout_id)

    def models(self, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """``GET /v1/models``: the session's model name, in a shape both Anthropic and OpenAI SDKs read.

        Returns:
            Status and JSON body (401 in the Anthropic or OpenAI shape without a valid key).
        """
        wire = WireApi.ANTHROPIC_MESSAGES if "anthropic-version" in headers else WireApi.OPENAI_CHAT
        try:
            session = self._admission.authenticate(headers)
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
        """``POST /v1/messages/count_tokens``: :meth:`.admission.Admission.count_tokens`."""
        return await self._admission.count_tokens(body, headers)

    def harness_of(self, headers: Mapping[str, str]) -> str:
        """The harness of the session the request's key names ("" without a known key)."""
        return self._sessions.harness_of(api_key(headers))

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
            prepared = await self._admission.admit(wire, body, headers)
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
            self._admission.done(prepared)

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
            record = call.record()
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
            **p.identity(),
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


#: Event-loop turns given to a new ``Generate`` call to send its request (grpc.aio sends it
#: from a task of its own) before the handler goes on with work that does not need the answer.
_SEND_YIELDS = 3
#: Event-loop turns given to a record's publication before a non-streamed answer is written:
#: one to encode and queue it (or refuse it), one for the NATS client's writer task to send it.
_PUBLISH_YIELDS = 2
