"""Which earlier record a session's next record is coded against (``SessionCalls.base_for``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from record_builders import make_record

from openforge_proxy.domain.handler import SessionCalls
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.splice import Splicer, SpliceReport
from openforge_proxy.domain.tokens import pack_ids


def _record(call_id: str, extends: str = "", attempt: int = 1) -> CallRecordData:
    return make_record(
        call_id,
        attempt=attempt,
        request_json=call_id.encode(),
        canonical_json=b"{}",
        completion=[7, 70000],
        splice=SpliceReport(extends_call_id=extends),
    )


def _state(heads: dict[str, Any] | None = None) -> SessionCalls:
    return SessionCalls(cast(Splicer, SimpleNamespace(heads=heads or {})))


def test_one_base_per_thread_the_one_extended_first() -> None:
    state = _state()
    assert state.base_for("") is None
    state.recorded(_record("a"), "a/1")
    state.recorded(_record("b", extends="a"), "b/1")  # b continues a's thread: a is dropped
    assert list(state.bases) == ["b"]
    state.recorded(_record("t"), "t/1")  # a side call (e.g. a title request) starts another thread
    assert list(state.bases) == ["b", "t"]
    base = state.base_for("b")  # the main thread's next call extends b, not the latest record
    assert base is not None and base.call_id == "b"
    latest = state.base_for("unknown")
    assert latest is not None and latest.call_id == "t"
    state.recorded(_record("b", extends="a", attempt=2), "b/2")  # a retry replaces its call's base
    b2 = state.base_for("b")
    assert b2 is not None and b2.attempt == 2
    for i in range(6):
        state.recorded(_record(f"s{i}"), f"s{i}/1")
    assert len(state.bases) == 4 and "b" not in state.bases  # the last few threads only


def test_the_base_sequence_is_the_prompt_then_the_sampled_ids() -> None:
    rec = _record("a")
    state = _state()
    state.recorded(rec, "a/1")  # no head kept by the splicer: packed here
    want = pack_ids([1, 2, 300, 7, 70000])
    assert state.bases["a"].sequence == want
    state = _state({"a/1": SimpleNamespace(packed=want)})
    state.recorded(rec, "a/1")
    assert state.bases["a"].sequence is want  # the splicer's bytes, not packed again
