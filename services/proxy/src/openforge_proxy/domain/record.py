"""The per-call record (ARCHITECTURE.md, data path step 6), before it becomes a proto.

The publisher adapter maps :class:`CallRecordData` onto
``openforge.common.v1.CallRecord`` inside a ``CallRecorded`` event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from openforge_core.record_delta import RecordBase, RecordCut
from openforge_proxy.domain.call_roles import CallRole
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.splice_plan import SpliceReport
from openforge_proxy.domain.tokens import PackedIds, ids_array, pack_ids


@dataclass
class CallRecordData:
    """Everything recorded about one attempt of one call: answered, or failed (``error``).

    Attributes:
        rollout_id: The rollout.
        run_id: Its run.
        call_id: The call (stable across the harness's retries).
        attempt: 1-based attempt number.
        wire_api: The API called.
        model: Model name the harness sent.
        request_json: The request body as received (decompressed), identifiers scrubbed.
        request_headers: Request headers without secrets, identifiers scrubbed.
        canonical_json: The canonical conversation as JSON, identifiers scrubbed.
        prompt: Exactly the ids the engine saw (with their packed encoding).
        completion_ids: Exactly the ids the engine sampled.
        logprobs: Logprob of each sampled id.
        policy_versions: Policy version of each sampled id.
        sampling: The call's sampling parameters (the session's enforced ones with its completion cap).
        finish: Why generation ended.
        receive_time: Unix seconds when the request arrived.
        ttfb_s: Seconds from arrival to the first response byte.
        total_s: Seconds from arrival to the end of the response.
        splice: How the prompt was built.
        http_status: Status the harness received.
        response_body: The bytes sent (SSE events or the JSON body).
        stream: Whether the response was streamed.
        cut: This record's prompt, request and canonical JSON cut against an earlier,
            acknowledged record of the session (its ``base``; ``RecordDelta``), or None: sent
            in full. The handler computes it while the engine generates.
        parts: What the recorder's :meth:`Recorder.encode_parts` made of the fields that do
            not depend on the answer (prompt, request and canonical JSON, splice report, cut),
            also while the engine generates; None: encoded with the rest.
        rollout_attempt: The orchestrator's attempt of the rollout (the session's).
        error: Why the call failed, empty when it was answered. A failed call's record has no
            prompt or sampled ids (:func:`failed_record`).
        role: What the call is for (:mod:`.call_roles`).
        lineage_id: The call's lineage in its session (main and sub-agent calls), else empty.
    """

    rollout_id: str
    run_id: str
    call_id: str
    attempt: int
    wire_api: WireApi
    model: str
    request_json: bytes
    request_headers: dict[str, str]
    canonical_json: bytes
    prompt: PackedIds
    completion_ids: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    sampling: Sampling
    finish: Finish
    receive_time: float
    ttfb_s: float
    total_s: float
    splice: SpliceReport
    http_status: int = 200
    response_body: bytes = b""
    stream: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    cut: RecordCut | None = None
    parts: object = None
    rollout_attempt: int = 1
    error: str = ""
    role: CallRole = CallRole.MAIN
    lineage_id: str = ""

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt ids as a list (tests and diagnostics)."""
        return self.prompt.tolist()

    def as_base(self, sequence: bytes | None = None) -> RecordBase:
        """This record as the base of a later one of its session.

        Args:
            sequence: The packed prompt + sampled ids when the caller has them (the splicer
                keeps them for the turn); else they are packed here.
        """
        if sequence is None:
            sequence = self.prompt.packed + pack_ids(self.completion_ids)
        return RecordBase(self.request_json, self.canonical_json, sequence, self.call_id, self.attempt)

    @property
    def event_id(self) -> str:
        """``<rollout_id>/<call_id>/<attempt>`` (the ``Nats-Msg-Id``)."""
        return f"{self.rollout_id}/{self.call_id}/{self.attempt}"


def failed_record(
    *,
    rollout_id: str,
    run_id: str,
    rollout_attempt: int,
    call_id: str,
    attempt: int,
    wire_api: WireApi,
    model: str,
    stream: bool,
    sampling: Sampling,
    request_headers: dict[str, str],
    error: str,
    http_status: int,
    finish: Finish,
    receive_time: float,
    total_s: float,
) -> CallRecordData:
    """The record of an admitted call that was not answered (ARCHITECTURE.md, invariants: "a call
    that fails still leaves a record"): its identity, the error, the status the harness got (0:
    none, it went away) and no token ids, bodies or splice report, so it is small enough to be
    stored whatever made the call fail, and assembly never trains on it.
    """
    return CallRecordData(
        rollout_id=rollout_id,
        run_id=run_id,
        call_id=call_id,
        attempt=attempt,
        wire_api=wire_api,
        model=model,
        request_json=b"",
        request_headers=request_headers,
        canonical_json=b"",
        prompt=PackedIds(ids_array(), b""),
        completion_ids=[],
        logprobs=[],
        policy_versions=[],
        sampling=sampling,
        finish=finish,
        receive_time=receive_time,
        ttfb_s=0.0,
        total_s=total_s,
        splice=SpliceReport(),
        http_status=http_status,
        stream=stream,
        rollout_attempt=rollout_attempt,
        error=error,
    )


class RecordTooLarge(Exception):
    """A call record is larger than the event bus accepts; retrying cannot succeed.

    Args:
        size: The serialized event, bytes.
        limit: The bus's message limit, bytes.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the call record is {size} bytes, over the event bus's limit of {limit} bytes")
        self.size = size
        self.limit = limit


class Recorder(Protocol):
    """Where finished calls go (NATS in the service, a list in tests)."""

    def encode_parts(
        self,
        prompt: PackedIds,
        request_json: bytes,
        canonical_json: bytes,
        splice: SpliceReport,
        cut: RecordCut | None,
    ) -> object:
        """Encodes the fields of a record that do not depend on the answer, ahead of it.

        The handler calls it while the engine generates and passes the result as
        :attr:`CallRecordData.parts` of the same call's record (whose fields must be these).

        Returns:
            Whatever :meth:`record` takes in ``parts`` (None: nothing ahead).
        """
        ...

    async def record(self, data: CallRecordData) -> None:
        """Stores one record durably; returns once it is acknowledged.

        Raises:
            RecordTooLarge: The record exceeds the bus's message limit (the call is failed
                towards the harness with a terminal error).
            Exception: The record could not be stored (the call is then failed
                towards the harness, which retries it).
        """
        ...
