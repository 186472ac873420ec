"""The JSON the dashboard page reads, built from the trajectory store's messages.

Every function here is pure: protobuf messages in, JSON-ready ``dict``/``list`` out. Times are
ISO 8601 UTC strings (``""`` when unset), durations are seconds (float), token ids are ints.
Token text comes from a :class:`TokenDecoder` over the run's ``tokenizer.json`` when the model
folder is known; without one the page shows the ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_cli.compare import RolloutCost, rollout_seconds, sandbox_usage

#: Request and response bodies longer than this many bytes are cut (the page says so).
MAX_BODY_BYTES = 256 * 1024


class TokenDecoder:
    """Decodes token ids to text with a model folder's ``tokenizer.json`` (Hugging Face ``tokenizers``).

    Args:
        model_dir: A Hugging Face model folder holding ``tokenizer.json``.

    Raises:
        FileNotFoundError: ``model_dir/tokenizer.json`` does not exist.
    """

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        self.model_dir = model_dir
        self.sha256 = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        self._tok = Tokenizer.from_file(str(path))
        self._cache: dict[int, str] = {}

    def piece(self, token_id: int) -> str:
        """The text of one token (special tokens included; partial UTF-8 shows as U+FFFD)."""
        text = self._cache.get(token_id)
        if text is None:
            text = self._tok.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text

    def pieces(self, ids: list[int]) -> list[str]:
        """The text of each token of ``ids``, position by position."""
        return [self.piece(i) for i in ids]

    def text(self, ids: list[int]) -> str:
        """The text of a whole id sequence (decoded together, so multi-byte characters join)."""
        return str(self._tok.decode(ids, skip_special_tokens=False))


def _time(ts: Timestamp) -> str:
    if ts.seconds == 0 and ts.nanos == 0:
        return ""
    return str(ts.ToDatetime().isoformat(timespec="milliseconds")) + "Z"


def _seconds(d: Duration) -> float:
    return d.seconds + d.nanos / 1e9


def _enum(enum_type: Any, value: int, prefix: str) -> str:
    name = str(enum_type.Name(value)) if value in enum_type.values() else str(value)
    return name.removeprefix(prefix)


def _body(raw: bytes) -> dict[str, Any]:
    """A recorded body: parsed JSON when it is JSON, else text; cut at :data:`MAX_BODY_BYTES`."""
    cut = len(raw) > MAX_BODY_BYTES
    data = raw[:MAX_BODY_BYTES]
    if not cut:
        try:
            return {"json": json.loads(data), "text": None, "bytes": len(raw), "truncated": False}
        except ValueError:
            pass
    return {"json": None, "text": data.decode("utf-8", "replace"), "bytes": len(raw), "truncated": cut}


def manifest(m: common_pb2.RunManifest) -> dict[str, Any]:
    """A run manifest as a flat-ish dict with the proto's field names (every field present)."""
    out: dict[str, Any] = MessageToDict(m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return out


def run(r: trajectory_pb2.RunSummary) -> dict[str, Any]:
    """A run summary: ids, counts, mean reward (``None`` when no rollout has one), manifest or ``None``."""
    return {
        "run_id": r.run_id,
        "create_time": _time(r.create_time),
        "rollouts": r.rollouts,
        "finished_rollouts": r.finished_rollouts,
        "mean_reward": r.mean_reward if r.HasField("mean_reward") else None,
        "tasks": r.tasks,
        "steps": r.steps,
        "last_policy_version": r.last_policy_version,
        "manifest": manifest(r.manifest) if r.HasField("manifest") else None,
    }


def step(s: trajectory_pb2.StepMetrics) -> dict[str, Any]:
    """One training step: ``step``, ``policy_version``, ``time`` and ``metrics`` (name → value)."""
    return {
        "step": s.step,
        "policy_version": s.policy_version,
        "time": _time(s.time),
        "metrics": dict(sorted(s.metrics.items())),
    }


def failure_cause(reason: str) -> str:
    """A failure reason without its particulars, so that rollouts failing alike count together:
    its first clause (up to ``;``), every number as ``N``, at most 100 characters; e.g.
    ``"harness timed out after 120s; verifier: ..."`` → ``"harness timed out after Ns"``."""
    first = reason.split(";", 1)[0].strip()
    return re.sub(r"\d+", "N", first)[:100]


def outcomes(
    rollouts: Iterable[common_pb2.Rollout],
    pass_threshold: float = 1.0,
    costs: Mapping[str, RolloutCost] | None = None,
) -> dict[str, Any]:
    """Rollouts by status (``{"SUCCEEDED": n, ...}``), failures by cause and the same figures per
    harness.

    ``causes`` is a list of ``{"status", "cause", "rollouts", "example"}`` (:func:`failure_cause`;
    ``example`` a rollout id), most rollouts first. ``harnesses`` is a list, by name, of
    ``{"harness", "rollouts", "statuses", "rewarded", "reward_mean", "passed", "mean_s",
    "peak_mib", "turns", "tokens", "samples"}``: ``reward_mean`` over the ``rewarded`` rollouts
    (None without one), ``passed`` those with reward >= ``pass_threshold``, ``mean_s`` the mean
    wall time of those that ended, ``peak_mib`` the highest sandbox memory, and ``turns``,
    ``tokens``, ``samples`` the mean :class:`~openforge_cli.compare.RolloutCost` of the rollouts
    in ``costs`` (None without one) — a harness comparison (``openforge eval --harness``) side
    by side."""
    statuses: Counter[str] = Counter()
    causes: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    per_harness: dict[str, list[common_pb2.Rollout]] = {}
    for r in rollouts:
        status = _enum(common_pb2.RolloutStatus, r.status, "ROLLOUT_STATUS_")
        statuses[status] += 1
        per_harness.setdefault(r.harness, []).append(r)
        if r.failure_reason:
            key = (status, failure_cause(r.failure_reason))
            causes[key] += 1
            example.setdefault(key, r.rollout_id)
    return {
        "statuses": dict(sorted(statuses.items())),
        "causes": [
            {"status": st, "cause": cause, "rollouts": n, "example": example[(st, cause)]}
            for (st, cause), n in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "harnesses": [
            _harness_figures(name, rs, pass_threshold, costs or {}) for name, rs in sorted(per_harness.items())
        ],
    }


def _harness_figures(
    name: str, rollouts: list[common_pb2.Rollout], pass_threshold: float, costs: Mapping[str, RolloutCost]
) -> dict[str, Any]:
    rewards = [r.reward for r in rollouts if r.HasField("reward")]
    seconds = [s for r in rollouts if (s := rollout_seconds(r)) is not None]
    peaks = [peak for r in rollouts if (peak := sandbox_usage(r)[1]) is not None]
    costed = [costs[r.rollout_id] for r in rollouts if r.rollout_id in costs]

    def mean(values: list[int]) -> float | None:
        return sum(values) / len(values) if values else None

    return {
        "harness": name,
        "rollouts": len(rollouts),
        "statuses": dict(
            sorted(Counter(_enum(common_pb2.RolloutStatus, r.status, "ROLLOUT_STATUS_") for r in rollouts).items())
        ),
        "rewarded": len(rewards),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "passed": sum(1 for x in rewards if x >= pass_threshold),
        "mean_s": sum(seconds) / len(seconds) if seconds else None,
        "peak_mib": max(peaks) if peaks else None,
        "turns": mean([c.turns for c in costed]),
        "tokens": mean([c.tokens for c in costed]),
        "samples": mean([c.samples for c in costed]),
    }


def rollout(r: common_pb2.Rollout) -> dict[str, Any]:
    """A rollout with its status name (``SUCCEEDED``...), reward (``None`` until verified),
    verifier output, times, duration in seconds (``None`` until it ended) and its sandbox's CPU
    seconds and peak MiB (``None`` where not accounted)."""
    cpu_s, peak_mib = sandbox_usage(r)
    return {
        "rollout_id": r.rollout_id,
        "run_id": r.run_id,
        "task_id": r.task_id,
        "group_id": r.group_id,
        "group_index": r.group_index,
        "harness": r.harness,
        "status": _enum(common_pb2.RolloutStatus, r.status, "ROLLOUT_STATUS_"),
        "reward": r.reward if r.HasField("reward") else None,
        "verifier_output": r.verifier_output,
        "failure_reason": r.failure_reason,
        "create_time": _time(r.create_time),
        "start_time": _time(r.start_time),
        "end_time": _time(r.end_time),
        "duration_s": rollout_seconds(r),
        "sandbox_cpu_s": cpu_s,
        "sandbox_peak_mib": peak_mib,
        "min_policy_version": r.min_policy_version,
    }


def _spans(spans: Any) -> list[dict[str, Any]]:
    return [{"start": s.start, "end": s.end, "source_call_id": s.source_call_id} for s in spans]


def call(c: common_pb2.CallRecord, decoder: TokenDecoder | None) -> dict[str, Any]:
    """One call attempt: the harness's request body, the bytes it got back, the model's sampled
    tokens (and their text with a decoder), timings in seconds and the proxy's splice report
    (reused/rendered prompt spans, break cause and detail, notes)."""
    completion = list(c.completion_token_ids)
    sp = c.splice
    return {
        "call_id": c.call_id,
        "attempt": c.attempt,
        "wire_api": _enum(common_pb2.WireApi, c.wire_api, "WIRE_API_"),
        "model": c.model,
        "stream": c.stream,
        "http_status": c.http_status,
        "finish_reason": _enum(common_pb2.FinishReason, c.finish_reason, "FINISH_REASON_"),
        "receive_time": _time(c.receive_time),
        "time_to_first_byte_s": _seconds(c.time_to_first_byte),
        "total_time_s": _seconds(c.total_time),
        "prompt_tokens": len(c.prompt_token_ids),
        "completion_token_ids": completion,
        "completion_text": decoder.text(completion) if decoder else None,
        "policy_versions": sorted(set(c.completion_policy_versions)),
        "request": _body(c.request_json),
        "response": _body(c.response_body),
        "splice": {
            "break_cause": _enum(common_pb2.BreakCause, sp.break_cause, "BREAK_CAUSE_"),
            "break_detail": sp.break_detail,
            "extends_call_id": sp.extends_call_id,
            "notes": list(sp.notes),
            "reused": _spans(sp.reused),
            "rendered": _spans(sp.rendered),
        },
    }


def sample(s: trajectory_pb2.Sample, decoder: TokenDecoder | None) -> dict[str, Any]:
    """One assembled sample: prompt ids, response ids with their loss mask (1 = sampled by the
    policy, trained on; 0 = harness/tool tokens), behaviour logprobs, policy versions, the token
    texts with a decoder (``None`` without), and why it is not part of the previous sample."""
    prompt = list(s.prompt_token_ids)
    response = list(s.response_token_ids)
    return {
        "sample_id": s.sample_id,
        "index": s.index,
        "break_cause": _enum(common_pb2.BreakCause, s.break_cause, "BREAK_CAUSE_"),
        "break_detail": s.break_detail,
        "call_ids": list(s.call_ids),
        "reward": s.reward,
        "partial": s.partial,
        "prompt_ids": prompt,
        "response_ids": response,
        "loss_mask": list(s.loss_mask),
        "logprobs": [round(x, 5) for x in s.rollout_logprobs],
        "policy_versions": list(s.policy_versions),
        "prompt_text": decoder.pieces(prompt) if decoder else None,
        "response_text": decoder.pieces(response) if decoder else None,
        "trained_tokens": sum(s.loss_mask),
    }


def resource_curves(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Curves over a run's time from its resource log (``openforge_cli.resource_log``).

    Returns ``{"cpu": [series], "memory": [series], "cores", "memory_total_gib"}``; a series is
    ``{"label", "points": [[minutes, value], ...]}``, minutes since the first sample, machine
    first then each service by name. CPU is in cores busy (a service's: the CPU time it used
    between two samples over the time between them, nothing across a restart, whose counter
    starts again); memory in GiB (machine: in use; services: resident). Empty lists without
    samples.
    """
    if not samples:
        return {"cpu": [], "memory": [], "cores": None, "memory_total_gib": None}
    t0 = samples[0]["t"]
    gib = 2.0**30

    def minutes(t: float) -> float:
        return round(float(t - t0) / 60.0, 4)

    cpu: dict[str, list[list[float]]] = {"machine": []}
    memory: dict[str, list[list[float]]] = {"machine": []}
    last: dict[str, tuple[float, float]] = {}
    for sample in samples:
        t, machine = sample["t"], sample["machine"]
        cpu["machine"].append([minutes(t), round(machine["cpu_cores"], 4)])
        memory["machine"].append([minutes(t), round(machine["memory_bytes"] / gib, 4)])
        for name, figures in sorted(sample["services"].items()):
            memory.setdefault(name, []).append([minutes(t), round(figures["rss_bytes"] / gib, 4)])
            before = last.get(name)
            last[name] = (t, figures["cpu_s"])
            if before is not None and t > before[0] and figures["cpu_s"] >= before[1]:
                cores = (figures["cpu_s"] - before[1]) / (t - before[0])
                cpu.setdefault(name, []).append([minutes(t), round(cores, 4)])

    def series(curves: dict[str, list[list[float]]]) -> list[dict[str, Any]]:
        names = ["machine", *sorted(n for n in curves if n != "machine")]
        return [{"label": n, "points": curves[n]} for n in names if curves[n]]

    final = samples[-1]["machine"]
    return {
        "cpu": series(cpu),
        "memory": series(memory),
        "cores": final["cores"],
        "memory_total_gib": round(final["memory_total_bytes"] / gib, 2),
    }
