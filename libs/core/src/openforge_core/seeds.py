"""Sampling seeds derived from a run's seed, so a run's rollouts are reproducible.

One seed a run (``RunConfig.seed``) becomes one seed a submission (the trainer: the run seed and
the request's key), one a rollout (the orchestrator: the submission's seed, the task's position
and the rollout's index in its group) and one a model call (the proxy: the rollout's seed and the
call's identity). Each is a keyed hash of the one above it, so rollouts of one group sample
differently and the same run sampled again samples the same.
"""

from __future__ import annotations

import hashlib

#: Derived seeds are in [0, 2**63): they fit ``SamplingParams.seed`` (int64) and every engine's
#: generator (torch's ``manual_seed`` takes at most 2**64 - 1, vLLM passes it to torch).
SEED_BITS = 63


def derive_seed(seed: int, *parts: str | int | bytes) -> int:
    """A seed for the thing named by ``parts`` under ``seed``.

    Args:
        seed: The parent seed (any int64).
        parts: What the derived seed is for (e.g. a request key, a position, an index); bytes
            are hashed as they are, str as UTF-8, ints in decimal.

    Returns:
        BLAKE2b (RFC 7693) of the parent and the parts, 8 bytes, big-endian, top bit cleared: an
        int in [0, 2**63). Equal arguments give equal seeds in every process.
    """
    h = hashlib.blake2b(digest_size=8, person=b"openforge-seed")
    h.update(str(seed).encode())
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        # length-prefixed, so ("ab", "c") and ("a", "bc") differ
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return int.from_bytes(h.digest(), "big") >> (64 - SEED_BITS)


#: The key every evaluation's sampling seed is derived from (:func:`request_seed`): the
#: evaluations of one run (before and after training, or every ``eval_interval``) sample each
#: task's rollouts with the same seeds, so they compare policies, not draws.
EVAL_SEED_KEY = "eval"


def request_seed(seed: int, key: str) -> int:
    """The sampling seed of a run's submission under ``key`` (the trainer's request keys
    ``step/3``, ``refill/1``, or :data:`EVAL_SEED_KEY`) in a run seeded ``seed``."""
    return derive_seed(seed, "rollouts", key)
