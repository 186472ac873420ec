"""Which earlier record a session's next record is coded against (``SessionCalls.base_for``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from record_builders import make_record

from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.session_calls import SessionCalls
from openforge_proxy.domain.splice import Splicer
from openforge_proxy.domain.splice_plan import SpliceReport
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


def test_call_keys_continue_the_previous_prompts_hash_and_equal_a_direct_hash() -> None:
    import hashlib
    import random

    def direct(tools_key: str, packed: bytes) -> str:
        h = hashlib.blake2b(tools_key.encode(), digest_size=16)
        h.update(packed)
        return h.hexdigest()

    rng = random.Random(7)
    packed = b""
    heads: dict[str, Any] = {}
    state = SessionCalls(cast(Splicer, SimpleNamespace(heads=heads)))
    tools = "t0"
    for i in range(400):
        op = rng.random()
        if op < 0.6:  # the conversation's next call: the prompt extends the previous one
            packed += rng.randbytes(rng.randint(0, 40))
        elif op < 0.7:  # an edit inside the history
            if packed:
                at = rng.randrange(len(packed))
                packed = packed[:at] + bytes([packed[at] ^ 1]) + packed[at + 1 :]
        elif op < 0.8:  # shorter (a compaction, a sub-agent)
            packed = packed[: rng.randint(0, len(packed))]
        elif op < 0.9:
            tools = rng.choice(["t0", "t1"])
        else:  # the call is recorded: the hash state keeps the base's bytes instead of the prompt
            rec = make_record(f"c{i}", prompt=[1], completion=[5])
            state.call_key(tools, rec.prompt.packed)
            heads[f"c{i}/1"] = SimpleNamespace(packed=rec.prompt.packed + b"\x05")
            state.recorded(rec, f"c{i}/1")
            assert state._key is not None and state._key[1] is heads[f"c{i}/1"].packed  # the prompt is not kept
            packed = rec.prompt.packed + b"\x05" + rng.randbytes(3)
        assert state.call_key(tools, packed) == direct(tools, packed)
    # two calls of the session in flight: the one recorded is not the one keyed last
    rec = make_record("x", prompt=[1, 2, 3], completion=[5])
    heads["x/1"] = SimpleNamespace(packed=rec.prompt.packed + b"\x05")
    state.call_key(tools, rec.prompt.packed)
    state.call_key(tools, b"\x09\x09")
    state.recorded(rec, "x/1")
    nxt = rec.prompt.packed + b"\x05\x06"
    assert state.call_key(tools, nxt) == direct(tools, nxt)
