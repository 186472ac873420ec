"""One admitted call: what admission hands the serving stages (:class:`Prepared`), the context
the stages share (:class:`Call`), the HTTP layer they answer through (:class:`Responder`), and
errors in the caller's protocol (:func:`error_response`, :func:`break_off`)."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from openforge_core.record_delta import RecordCut
from openforge_proxy.domain.call_roles import CallClass
from openforge_proxy.domain.conversation import CanonicalRequest, WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.generation import Generation
from openforge_proxy.domain.output import ApiError, Usage
from openforge_proxy.domain.protocols import dumps
from openforge_proxy.domain.protocols.codec import CODECS, StreamEncoder, WireCodec
from openforge_proxy.domain.record import CallRecordData, Recorder
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.scrub import scrub_headers
from openforge_proxy.domain.session_calls import SessionCalls
from openforge_proxy.domain.sessions import Session
from openforge_proxy.domain.splice_plan import PromptPlan, turn_id_of


class ClientGone(Exception):
    """The harness closed the connection while the response was being written."""


class Responder(Protocol):
    """How the core answers over HTTP."""

    async def send_json(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """A complete JSON response, sent before this returns (a client gone meanwhile is not
        an error: it is simply not answered)."""
        ...

    async def hold_json(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """Sends a JSON response but its last byte (with a ``Content-Length`` of the whole):
        the client holds no complete answer until :meth:`release` or sees a broken one after
        :meth:`abort`. A client gone meanwhile is not an error."""
        ...

    async def release(self) -> None:
        """Sends the last byte of the response :meth:`hold_json` began."""
        ...

    def abort(self) -> None:
        """Drops the connection (a response begun is never completed)."""
        ...

    async def begin_stream(self, headers: Mapping[str, str]) -> None:
        """200 with ``text/event-stream``, chunked."""
        ...

    async def write(self, data: bytes) -> None:
        """Stream bytes out. Raises :class:`ClientGone`."""
        ...

    def client_gone(self) -> bool:
        """Whether the client's connection is closed or closing (what was sent may not have
        reached it)."""
        ...


def new_request_id() -> str:
    """A request id for the answer's headers and error bodies (``req`` and 24 hex digits)."""
    return "req" + secrets.token_hex(12)


def error_response(wire: WireApi, err: ApiError, request_id: str) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers of an error in the protocol's own shape."""
    codec = CODECS[wire]
    body = codec.error_body(err, request_id)
    headers = {codec.id_header: request_id}
    if err.retry_after_s is not None:
        headers["retry-after"] = str(err.retry_after_s)
    return err.status, dumps(body), headers


class RecordIdentity(TypedDict):
    """The fields every record of a call has, answered or failed."""

    rollout_id: str
    run_id: str
    rollout_attempt: int
    call_id: str
    attempt: int
    wire_api: WireApi
    model: str
    stream: bool
    sampling: Sampling


@dataclass
class Prepared:
    """An admitted call: what admission (authenticate, convert, splice, limits, sampling) hands
    the serving stages."""

    session: Session
    state: SessionCalls
    request: CanonicalRequest
    runtime: ModelRuntime
    plan: PromptPlan
    sampling: Sampling
    call_id: str
    attempt: int
    reserved: int  # tokens reserved in the session at admission (prompt + completion cap)
    canonical_json: bytes  # the record's canonical conversation
    body: bytes  # the request body as recorded (lone surrogates replaced)
    call_class: CallClass  # its role and lineage (:mod:`.call_roles`)
    settled: bool = False  # the tokens used were counted and the reservation freed
    failure_recorded: bool = False  # its failed record (error, no ids) was stored or tried

    @property
    def codec(self) -> WireCodec:
        """The codec of the request's API."""
        return CODECS[self.request.wire]

    def identity(self) -> RecordIdentity:
        """What identifies the call in its records (:class:`RecordIdentity`)."""
        return RecordIdentity(
            rollout_id=self.session.rollout_id,
            run_id=self.session.run_id,
            rollout_attempt=self.session.rollout_attempt,
            call_id=self.call_id,
            attempt=self.attempt,
            wire_api=self.request.wire,
            model=self.request.model,
            stream=self.request.stream,
            sampling=self.sampling,
        )


@dataclass(frozen=True)
class PreRecord:
    """The parts of a call's record that do not depend on the answer."""

    request_json: bytes
    canonical_json: bytes
    cut: RecordCut | None
    parts: object

    @staticmethod
    def of(p: Prepared, recorder: Recorder) -> PreRecord:
        request_json = p.state.scrubber.scrub(p.body)
        canonical_json = p.canonical_json
        base = p.state.base_for(p.plan.report.extends_call_id)
        cut = None
        prompt = p.plan.prompt
        if base is not None:
            cut = RecordCut.of(base, prompt.packed, request_json, canonical_json, prompt_ids=len(prompt))
        parts = recorder.encode_parts(prompt, request_json, canonical_json, p.plan.report, cut)
        return PreRecord(request_json, canonical_json, cut, parts)


@dataclass
class Call:
    """One admitted call through :meth:`CallHandler._serve`'s stages: what it came with, and what
    each stage leaves for the next."""

    p: Prepared
    headers: Mapping[str, str]
    responder: Responder
    request_id: str
    received: float  # time.monotonic() when the request arrived
    receive_time: float  # time.time() then
    gen: Generation
    encoder: StreamEncoder  # a streamed answer's (its ids assigned to gen.out either way)
    pre: PreRecord | None  # the record's parts that do not depend on the answer, once built
    sent: list[bytes] = field(default_factory=list)  # the answer's bytes, in order
    ttfb: float = 0.0  # seconds from the request to the answer's first byte
    held: bool = False  # the whole answer is out but its last byte (until the record is acknowledged)

    def record(self) -> CallRecordData:
        """The answered call's record (the answer's bytes as sent so far, its times to now)."""
        p, gen, pre = self.p, self.gen, self.pre
        assert pre is not None
        return CallRecordData(
            **p.identity(),
            request_json=pre.request_json,
            request_headers=scrub_headers(self.headers),
            canonical_json=pre.canonical_json,
            prompt=p.plan.prompt,
            completion_ids=gen.ids,
            logprobs=gen.logprobs,
            policy_versions=gen.versions,
            finish=gen.out.finish,
            receive_time=self.receive_time,
            ttfb_s=self.ttfb,
            total_s=time.monotonic() - self.received,
            splice=p.plan.report,
            response_body=b"".join(self.sent),
            extra={"turn_id": self.turn_id},
            cut=pre.cut,
            parts=pre.parts,
            role=p.call_class.role,
            lineage_id=p.call_class.lineage_id,
        )

    @property
    def turn_id(self) -> str:
        """The generated turn's id."""
        return turn_id_of(self.p.call_id, self.p.attempt)

    @property
    def usage0(self) -> Usage:
        """The usage before any completion token: the prompt's tokens and those cached."""
        return Usage(len(self.p.plan.prompt), 0, self.p.plan.cached_tokens)


async def break_off(
    responder: Responder,
    encoder: StreamEncoder,
    err: ApiError,
    wire: WireApi,
    request_id: str,
    *,
    stream: bool,
    held: bool,
) -> None:
    """Ends a call whose answer is ready or begun with ``err``: a held answer is broken off (the
    harness sees a broken response and retries), a stream ends with the protocol's error event,
    else the error body in the protocol's shape is sent."""
    if held:
        responder.abort()
    elif stream:
        with contextlib.suppress(ClientGone):
            await responder.write(encoder.error(err.message))
    else:
        status, payload, extra = error_response(wire, err, request_id)
        await responder.send_json(status, payload, extra)
