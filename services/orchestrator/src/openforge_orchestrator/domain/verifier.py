"""Reading a verifier's reward the way Harbor does.

A task's ``tests/test.sh`` writes its result into the verifier log folder
(``/logs/verifier`` in the sandbox): ``reward.txt`` holding one number, or ``reward.json``
holding an object of named numbers. ``reward.txt`` wins when both exist (Harbor's
precedence). The scalar reward of a ``reward.json`` is its ``"reward"`` entry, or its only
entry when it has exactly one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

REWARD_TXT = "reward.txt"
REWARD_JSON = "reward.json"
#: Longest verifier output kept on the rollout, characters (the tail is kept).
OUTPUT_TAIL_CHARS = 4000


class RewardError(Exception):
    """The verifier wrote no reward, an empty one, or one that is not a number."""


@dataclass(frozen=True)
class Reward:
    """What a verifier reported.

    Attributes:
        value: The scalar reward.
        values: Every named reward (``{"reward": value}`` for ``reward.txt``).
        source: The file it came from.
    """

    value: float
    values: dict[str, float] = field(default_factory=dict)
    source: str = REWARD_TXT


def _number(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise RewardError(f"{where}: not a number: {raw!r}")
    value = float(raw)
    if not math.isfinite(value):
        raise RewardError(f"{where}: not finite: {raw!r}")
    return value


def parse_reward(verifier_dir: Path) -> Reward:
    """Reads ``reward.txt`` (preferred) or ``reward.json`` from ``verifier_dir``.

    Raises:
        RewardError: Neither file exists, the file is empty, or it holds no usable number.
    """
    txt = verifier_dir / REWARD_TXT
    if txt.is_file():
        text = txt.read_text(errors="replace").strip()
        if not text:
            raise RewardError(f"{REWARD_TXT} is empty")
        try:
            value = float(text)
        except ValueError:
            raise RewardError(f"{REWARD_TXT}: not a number: {text[:80]!r}") from None
        value = _number(value, REWARD_TXT)
        return Reward(value=value, values={"reward": value}, source=REWARD_TXT)
    js = verifier_dir / REWARD_JSON
    if js.is_file():
        text = js.read_text(errors="replace").strip()
        if not text:
            raise RewardError(f"{REWARD_JSON} is empty")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RewardError(f"{REWARD_JSON}: {exc}") from None
        if isinstance(doc, int | float) and not isinstance(doc, bool):
            value = _number(doc, REWARD_JSON)
            return Reward(value=value, values={"reward": value}, source=REWARD_JSON)
        if not isinstance(doc, dict) or not doc:
            raise RewardError(f"{REWARD_JSON}: expected an object of numbers")
        values = {str(k): _number(v, f"{REWARD_JSON}[{k!r}]") for k, v in doc.items()}
        if "reward" in values:
            return Reward(value=values["reward"], values=values, source=REWARD_JSON)
        if len(values) == 1:
            return Reward(value=next(iter(values.values())), values=values, source=REWARD_JSON)
        raise RewardError(f"{REWARD_JSON}: several rewards {sorted(values)} and none named 'reward'")
    raise RewardError(f"the verifier wrote neither {REWARD_TXT} nor {REWARD_JSON}")


def tail(text: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``."""
    return text if len(text) <= limit else "…" + text[-limit:]
