"""pass@k and pass^k against their definitions."""

from __future__ import annotations

from itertools import combinations

import pytest

from openforge_core.passk import pass_at_k, pass_hat_k


def test_worked_example() -> None:
    # n = 4 rollouts, c = 2 pass: pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6,
    # pass^1 = 1/2, pass^2 = C(2,2)/C(4,2) = 1/6.
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_hat_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_at_k(5, 4, 2) == 1.0  # fewer than k failures: some draw of k always passes


@pytest.mark.parametrize(("n", "c", "k"), [(4, 0, 1), (4, 1, 1), (4, 2, 2), (5, 2, 3), (8, 8, 4), (6, 1, 6)])
def test_both_equal_enumeration_over_every_k_subset(n: int, c: int, k: int) -> None:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize(("n", "c", "k"), [(2, 3, 1), (2, -1, 1), (2, 1, 0), (2, 1, 3)])
def test_impossible_counts_are_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="must be in"):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="must be in"):
        pass_hat_k(n, c, k)
