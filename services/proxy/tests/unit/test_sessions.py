"""Session registry: idempotent creation, keys, expiry, close, limits validation."""

from __future__ import annotations

import pytest

from openforge.common.v1.common_pb2 import SamplingParams
from openforge_core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unauthenticated
from openforge_proxy.domain.sessions import KEY_PREFIX, Limits, SessionRegistry, SessionState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _create(reg: SessionRegistry, rollout: str = "r1", request: str = "q1", **kw: object) -> tuple[object, str]:
    args: dict[str, object] = {
        "request_id": request,
        "rollout_id": rollout,
        "run_id": "run",
        "model_name": "tiny",
        "limits": Limits(max_turns=5),
        "sampling": SamplingParams(temperature=1.0),
        "ttl_s": None,
    }
    args.update(kw)
    return reg.create(**args)  # type: ignore[arg-type]


def test_create_is_idempotent_per_request_and_key_authenticates() -> None:
    reg = SessionRegistry(3600, 10, clock=Clock())
    s1, key1 = _create(reg)
    s2, key2 = _create(reg)
    assert key1 == key2 and key1.startswith(KEY_PREFIX) and len(key1) > 40
    assert s1 == s2
    assert reg.authenticate(key1).rollout_id == "r1"
    assert len(reg) == 1
    with pytest.raises(AlreadyExists):
        _create(reg, request="q2")


def test_unknown_closed_and_expired_keys_are_refused() -> None:
    clock = Clock()
    reg = SessionRegistry(60, 10, clock=clock)
    _, key = _create(reg)
    with pytest.raises(Unauthenticated) as unknown:
        reg.authenticate(KEY_PREFIX + "nope")
    assert unknown.value.reason == "UNKNOWN_KEY"
    clock.now += 61
    assert reg.get("r1").state is SessionState.EXPIRED
    with pytest.raises(Unauthenticated):
        reg.authenticate(key)
    _, key2 = _create(reg, request="q2")  # an expired session may be replaced
    assert reg.close("r1").state is SessionState.CLOSED
    assert reg.close("r1").state is SessionState.CLOSED  # idempotent
    with pytest.raises(Unauthenticated) as closed:
        reg.authenticate(key2)
    assert closed.value.reason == "SESSION_NOT_OPEN"
    assert key2 not in repr(reg.get("r1"))


def test_deadline_caps_expiry_and_validation() -> None:
    clock = Clock()
    reg = SessionRegistry(3600, 10, clock=clock)
    s, _ = _create(reg, limits=Limits(deadline=clock.now + 5))
    assert s.expire_time == clock.now + 5  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument) as empty:
        _create(reg, rollout="")
    assert empty.value.violations[0].field == "rollout_id"
    with pytest.raises(InvalidArgument):
        _create(reg, rollout="r2", limits=Limits(max_turns=-1))
    with pytest.raises(InvalidArgument):
        _create(reg, rollout="r2", ttl_s=0.0)
    with pytest.raises(NotFound):
        reg.get("nope")


def test_capacity_evicts_ended_sessions_first() -> None:
    reg = SessionRegistry(3600, 2, clock=Clock())
    _create(reg, rollout="a", request="1")
    _create(reg, rollout="b", request="2")
    with pytest.raises(ResourceExhausted):
        _create(reg, rollout="c", request="3")
    reg.close("a")
    _create(reg, rollout="c", request="3")
    assert len(reg) == 2


def test_ended_sessions_are_forgotten_beyond_a_bound() -> None:
    ended: list[str] = []
    reg = SessionRegistry(3600, 100, clock=Clock(), max_ended=3)
    reg.on_end.append(ended.append)
    keys = {}
    for i in range(6):
        _, keys[i] = _create(reg, rollout=f"r{i}", request=f"q{i}")
    for i in range(5):
        reg.close(f"r{i}")
    assert ended == [f"r{i}" for i in range(5)]
    assert len(reg) == 4  # the open r5 and the three most recently closed
    with pytest.raises(NotFound):
        reg.get("r1")
    with pytest.raises(Unauthenticated) as old:
        reg.authenticate(keys[0])
    assert old.value.reason == "UNKNOWN_KEY"
    assert reg.close("r4").state is SessionState.CLOSED  # recent ones still answer
    with pytest.raises(Unauthenticated) as recent:
        reg.authenticate(keys[4])
    assert recent.value.reason == "SESSION_NOT_OPEN"
    assert reg.authenticate(keys[5]).rollout_id == "r5"


def test_the_sweep_reclaims_expired_sessions_and_the_metrics_count_how_sessions_end() -> None:
    from prometheus_client import CollectorRegistry

    from openforge_proxy.http.metrics import SessionCollector

    clock = Clock()
    reg = SessionRegistry(60, 10, clock=clock)
    registry = CollectorRegistry()
    collector = SessionCollector()
    registry.register(collector)
    assert registry.get_sample_value("openforge_proxy_sessions", {"state": "open"}) is None  # nothing watched
    collector.watch(reg)
    for rollout in ("a", "b", "c"):
        _create(reg, rollout=rollout, request=rollout)
    reg.close("a")  # the rollout ended
    clock.now += 61  # b and c outlive their keys: the orchestrator never closed them
    assert reg.sweep() == 2 and reg.sweep() == 0

    def value(name: str, **labels: str) -> float | None:
        found: float | None = registry.get_sample_value(name, labels)
        return found

    assert value("openforge_proxy_sessions", state="open") == 0
    assert (value("openforge_proxy_sessions", state="closed"), value("openforge_proxy_sessions", state="expired")) == (
        1,
        2,
    )
    assert value("openforge_proxy_sessions_ended_total", how="closed") == 1
    assert value("openforge_proxy_sessions_ended_total", how="expired") == 2
    reg.close("b")  # closing an expired session ends nothing more
    assert value("openforge_proxy_sessions_ended_total", how="closed") == 1
