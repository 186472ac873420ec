"""Derived sampling seeds: stable across processes, in int64's range, distinct per part."""

from __future__ import annotations

import subprocess
import sys

from openforge_core.seeds import EVAL_SEED_KEY, SEED_BITS, derive_seed, request_seed


def test_a_derived_seed_is_the_same_in_another_process_and_fits_int64() -> None:
    here = derive_seed(2**63 - 1, "rollout", 3, 1)
    code = "from openforge_core.seeds import derive_seed; print(derive_seed(2**63 - 1, 'rollout', 3, 1))"
    there = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert here == there  # no per-process hash salt (PYTHONHASHSEED)
    assert 0 <= here < 2**SEED_BITS <= 2**63


def test_every_part_and_the_parent_seed_change_the_seed() -> None:
    seeds = {
        derive_seed(0, "rollout", 0, 0),
        derive_seed(0, "rollout", 0, 1),
        derive_seed(0, "rollout", 1, 0),
        derive_seed(1, "rollout", 0, 0),
        derive_seed(-1, "rollout", 0, 0),
        derive_seed(0, "call", 0, 0),
        derive_seed(0, b"rollout", 0, 0),  # bytes hash as their UTF-8 str: the same seed
    }
    assert len(seeds) == 6
    # parts are length-prefixed: splitting a part elsewhere is another seed
    assert derive_seed(0, "ab", "c") != derive_seed(0, "a", "bc")
    assert derive_seed(0, "12", 3) != derive_seed(0, 1, 23)


def test_request_seeds_differ_per_key_and_every_evaluation_shares_one() -> None:
    keys = ["step/1", "step/2", "refill/1", EVAL_SEED_KEY]
    assert len({request_seed(0, k) for k in keys}) == 4
    assert request_seed(0, EVAL_SEED_KEY) == request_seed(0, "eval") != request_seed(1, "eval")
