"""Call roles over the recorded harness runs: model calls, samples and merge ratio per harness.

Reads every run of the harness captures (``../shared/cases/harness-captures``, or ``--captures``),
classifies each request as the proxy does (:mod:`openforge_proxy.domain.call_roles`) and prints,
per harness and role: requests per rollout (retries included), model calls per rollout (a retry
of the same conversation counted once), samples per rollout (one per main or sub-agent lineage,
one per compaction or side call, as the store assembles them) and the merge ratio (model calls
per sample). One JSON object per harness with ``--json``.

Usage::

    python tools/bench/call_roles_bench.py
    python tools/bench/call_roles_bench.py --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from openforge_proxy.domain.call_roles import CallRole, LineageTracker, history_keys, signature
from openforge_proxy.domain.protocols import anthropic, chat, responses
from openforge_testing.captures import CAPTURES, load_run, runs

_PARSERS: dict[str, Any] = {"/v1/messages": anthropic, "/v1/chat/completions": chat, "/v1/responses": responses}


def run_roles(run: Path) -> list[tuple[CallRole, str, str]]:
    """(role, lineage id, call identity) of each request of a run, in arrival order."""
    docs, _ = load_run(run)
    tracker = LineageTracker()
    out: list[tuple[CallRole, str, str]] = []
    for d in docs:
        path = d["path"]
        req = _PARSERS[path.split("?", 1)[0]].parse(d["body"])
        c = tracker.classify(req, path)
        h = hashlib.blake2b(signature(req) + b"".join(history_keys(req)), digest_size=8).hexdigest()
        out.append((c.role, c.lineage_id, h))
    return out


def table(root: Path) -> dict[str, dict[str, Any]]:
    """Per harness: rollouts, and per role requests, calls and samples per rollout and merge ratio."""
    per: dict[str, list[list[tuple[CallRole, str, str]]]] = defaultdict(list)
    for run in runs(root):
        per[run.parent.name].append(run_roles(run))
    out: dict[str, dict[str, Any]] = {}
    for harness, rollouts in sorted(per.items()):
        n = len(rollouts)
        row: dict[str, Any] = {"rollouts": n}
        for role in CallRole:
            requests = calls = samples = 0
            for reqs in rollouts:
                mine = [r for r in reqs if r[0] is role]
                requests += len(mine)
                calls += len({r[2] for r in mine})
                merged = role in (CallRole.MAIN, CallRole.SUB_AGENT)
                samples += len({r[1] for r in mine}) if merged else len(mine)
            row[role.value] = {
                "requests_per_rollout": requests / n,
                "calls_per_rollout": calls / n,
                "samples_per_rollout": samples / n,
                "merge_ratio": calls / samples if samples else 0.0,
            }
        out[harness] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--captures", type=Path, default=CAPTURES)
    ap.add_argument("--json", action="store_true", help="one JSON object per harness")
    args = ap.parse_args()
    result = table(args.captures)
    if args.json:
        for harness, row in result.items():
            print(json.dumps({"harness": harness, **row}))
        return
    head = ("harness", "rollouts", "role", "req/roll", "calls/roll", "samples/roll", "merge")
    print("{:16} {:>8} {:11} {:>8} {:>10} {:>12} {:>6}".format(*head))
    for harness, row in result.items():
        for role in CallRole:
            r = row[role.value]
            if not r["requests_per_rollout"]:
                continue
            print(
                f"{harness:16} {row['rollouts']:>8} {role.value:11} {r['requests_per_rollout']:>8.2f}"
                f" {r['calls_per_rollout']:>10.2f} {r['samples_per_rollout']:>12.2f} {r['merge_ratio']:>6.2f}"
            )


if __name__ == "__main__":
    main()
