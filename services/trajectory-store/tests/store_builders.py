"""Builders of call records, rollouts and events for the store's tests."""

from __future__ import annotations

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge.proxy.v1 import events_pb2 as proxy


def make_call(
    rollout_id: str,
    call_id: str,
    prompt: list[int],
    completion: list[int],
    *,
    attempt: int = 1,
    t: int = 0,
    version: int = 1,
    finish: int = common_pb2.FINISH_REASON_STOP,
    rollout_attempt: int = 0,
    error: str = "",
) -> common_pb2.CallRecord:
    """A call record whose logprob for token k is -k/1000 (easy to check position by position)."""
    c = common_pb2.CallRecord(
        rollout_id=rollout_id,
        call_id=call_id,
        attempt=attempt,
        run_id="run",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-tok / 1000 for tok in completion],
        completion_policy_versions=[version] * len(completion),
        finish_reason=finish,  # type: ignore[arg-type]
        rollout_attempt=rollout_attempt,
        error=error,
    )
    c.receive_time.FromNanoseconds(1_000_000_000 + t)
    return c


def make_rollout(
    rollout_id: str,
    group_id: str = "g1",
    index: int = 0,
    status: int = common_pb2.ROLLOUT_STATUS_PENDING,
    reward: float | None = None,
    run_id: str = "run",
    task_id: str = "t1",
    t: int = 0,
) -> common_pb2.Rollout:
    r = common_pb2.Rollout(
        rollout_id=rollout_id,
        run_id=run_id,
        task_id=task_id,
        group_id=group_id,
        group_index=index,
        harness="mini-swe-agent",
        status=status,  # type: ignore[arg-type]
    )
    r.create_time.FromNanoseconds(1_000_000_000 + t)
    if reward is not None:
        r.reward = reward
    return r


def submitted(*rollouts: common_pb2.Rollout, event_id: str = "sub/1") -> tuple[str, orch.RolloutsSubmitted]:
    return event_id, orch.RolloutsSubmitted(event_id=event_id, rollouts=list(rollouts))


def failed_call(rollout_id: str, call_id: str, *, attempt: int = 1, t: int = 0) -> common_pb2.CallRecord:
    """The record the proxy publishes for a call admitted and not answered: no ids, an error."""
    c = common_pb2.CallRecord(
        rollout_id=rollout_id,
        call_id=call_id,
        attempt=attempt,
        run_id="run",
        finish_reason=common_pb2.FINISH_REASON_ERROR,
        http_status=503,
        error="inference: UNAVAILABLE",
    )
    c.receive_time.FromNanoseconds(1_000_000_000 + t)
    return c


def finished(r: common_pb2.Rollout, calls: int, attempts: int = 0) -> tuple[str, orch.RolloutFinished]:
    eid = f"finished/{r.rollout_id}"
    return eid, orch.RolloutFinished(event_id=eid, rollout=r, calls=calls, attempts=attempts)


def recorded(c: common_pb2.CallRecord) -> tuple[str, proxy.CallRecorded]:
    eid = f"{c.rollout_id}/{c.call_id}/{c.attempt}"
    return eid, proxy.CallRecorded(event_id=eid, record=c)


def conversation(rollout_id: str, turns: int, prompt_len: int = 40, seed: int = 0) -> list[common_pb2.CallRecord]:
    """Calls whose prompts extend each other, as the proxy's splice guarantees: prompt[i+1] =
    prompt[i] + completion[i] + tool tokens."""
    calls = []
    prompt = [(seed * 7 + k) % 500 + 1 for k in range(prompt_len)]
    for i in range(turns):
        completion = [600 + (i * 13 + k) % 300 for k in range(5 + i % 3)]
        calls.append(make_call(rollout_id, f"c{i}", prompt, completion, t=i * 1000))
        tool = [900 + (i + k) % 50 for k in range(3 + i % 4)]
        prompt = prompt + completion + tool
    return calls
