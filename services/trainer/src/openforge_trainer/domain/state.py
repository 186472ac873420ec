"""The trainer's resumable position in a run, saved in every checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainerState:
    """Everything a restarted trainer needs to continue a run without repeating or skipping a step.

    Saved with the weights of step ``step``; a restart loads the newest complete checkpoint and
    goes on with step ``step + 1``, reading completed groups after ``cursor``.

    Attributes:
        step: Last completed optimizer step (0 = none).
        policy_version: Policy version of the checkpoint's weights (0 = the initial model).
        cursor: Store cursor of the last completed group consumed by a step; groups after it
            are read again on resume.
        submitted_steps: Highest step whose rollout groups were requested from the orchestrator
            (requests are idempotent per step, so a resume may repeat them safely).
        refills: Extra group requests made so far (to replace dropped groups).
        pending_groups: Group ids requested and not yet consumed.
        requests: Request key (``step/3``, ``refill/1``) → the group ids the orchestrator
            returned for it, for the requests with groups still pending: a request is sent again
            under its key when the run stalls, and the orchestrator answers with other ids only
            when it no longer holds it (it restarted), so its groups are replaced.
        samples_dropped_total: Samples dropped as stale over the run.
        tokens_total: Tokens trained on over the run.
        eval_cursor: Store cursor in the evaluation run.
    """

    step: int = 0
    policy_version: int = 0
    cursor: str = ""
    submitted_steps: int = 0
    refills: int = 0
    pending_groups: list[str] = field(default_factory=list)
    requests: dict[str, list[str]] = field(default_factory=dict)
    samples_dropped_total: int = 0
    tokens_total: int = 0
    eval_cursor: str = ""

    def to_json(self) -> str:
        """JSON text of the state."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        """Parses :meth:`to_json`'s output (unknown keys are ignored).

        Raises:
            ValueError: Not a JSON object.
        """
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("trainer state must be a JSON object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
