"""pass@k and pass^k of one task from ``c`` passes out of ``n`` rollouts (the trainer's step
metrics and ``openforge eval`` read the same two functions)."""

from __future__ import annotations

import math


def check_counts(n: int, c: int, k: int) -> None:
    """Raises ``ValueError`` unless 0 <= c <= n and 1 <= k <= n."""
    if not 0 <= c <= n:
        raise ValueError(f"passes c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: ``1 - C(n-c, k) / C(n, k)``.

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1.

    Args:
        n: Rollouts of the task.
        c: Rollouts that passed.
        k: Attempts (1 <= k <= n).

    Raises:
        ValueError: ``k`` outside [1, n] or ``c`` outside [0, n].
    """
    check_counts(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k of one task: the probability that k attempts drawn without replacement all pass,
    ``C(c, k) / C(n, k)``.

    Source: Yao et al. 2024, "τ-bench", section 5 (pass^k). Arguments and errors as
    :func:`pass_at_k`.
    """
    check_counts(n, c, k)
    return math.comb(c, k) / math.comb(n, k)
