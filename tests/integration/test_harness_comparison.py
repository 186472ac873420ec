"""``openforge eval --harness mini-swe-agent,claude-code,codex,openclaw``: one checkpoint compared
across harnesses on the same tasks, run as a user runs it (a subprocess).

The command starts NATS and the five services with the ``scripted-oracle`` engine (a scripted
engine, not a model: it answers each model call with the task's oracle ``solve.sh``, one command
line per call here, through whatever shell tool the harness offers: mini-swe-agent's ``bash``,
Claude Code's ``Bash``, Codex's ``exec_command``, OpenClaw's ``exec``), then each harness works the same two held-out
`lines` tasks in its bubblewrap sandbox through the real proxy: ``first-4`` (one command) and
``check-2`` (two, the second acting on the first's output: a multi-step task), each to the
verifier's reward 1. The comparison table and ``eval.json`` give, per harness, pass@1 and
what its rollouts cost (turns, tokens, samples, seconds, and its sandbox's CPU time and peak
memory), read back from the store. The tasks ask for 512 MiB sandboxes; OpenClaw's get its
2 GiB floor (it needs about 1.4 GiB).

Needs ``bwrap``, mini-swe-agent (``openforge harness install mini-swe-agent``) and the npm CLIs
(``openforge harness install`` or ``make harness-clis``); skips otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from openforge_orchestrator.backends import cgroups
from openforge_testing.rollouts import npm_harness_dir, require_sandboxed_harness
from openforge_testing.servers import stack_port_args

ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = Path(os.environ.get("OPENFORGE_TEST_HARNESS_DIR", ROOT / ".openforge" / "harnesses"))
HARNESSES = ("mini-swe-agent", "claude-code", "codex", "openclaw")
#: Held-out tasks of the demo's family: ``check-2`` takes two tool calls (run check.sh, write the
#: verdict it printed), ``first-4`` one.
TASKS = ("check-2", "first-4")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _installs(tmp: Path) -> Path:
    """One install folder holding every compared harness's manifest."""
    require_sandboxed_harness(HARNESS_DIR, "mini-swe-agent")
    into = tmp / "harnesses"
    (into / "mini-swe-agent").mkdir(parents=True)
    shutil.copy2(HARNESS_DIR / "mini-swe-agent" / "manifest.json", into / "mini-swe-agent" / "manifest.json")
    for harness in HARNESSES[1:]:
        found = npm_harness_dir(harness, ROOT, HARNESS_DIR, into)
        if found is None:
            pytest.skip(f"{harness} is installed neither in {HARNESS_DIR} (with node on PATH) nor by make harness-clis")
        if found != into:
            (into / harness).mkdir()
            shutil.copy2(found / harness / "manifest.json", into / harness / "manifest.json")
    return into


def test_one_command_compares_harnesses_on_the_same_tasks_with_their_costs(tmp_path: Path) -> None:
    installs = _installs(tmp_path)
    from openforge_inference.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", size="1m", seed=0)
    config = tmp_path / "compare.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_id": "cmp",
                "model": {"path": str(model)},
                "harness": "mini-swe-agent",
                "stack": {
                    "tasks_root": str(ROOT / "examples" / "demo" / "tasks"),
                    "harness_dir": str(installs),
                    "max_concurrent": 2,
                },
                # a Node CLI's first call can take a minute on a loaded 2-core machine
                "run": {"temperature": 0.7, "max_tokens": 256, "rollout_timeout_s": 300},
                "eval": {"split": "test", "k": 1},
            }
        )
    )
    state = tmp_path / "state"
    exe = Path(sys.executable).parent / "openforge"
    argv = [
        str(exe),
        "eval",
        str(config),
        "--checkpoint",
        str(model),
        "--engine",
        "scripted-oracle",
        "--harness",
        ",".join(HARNESSES),
        "--tasks",
        ",".join(TASKS),
        "--run-id",
        "cmp-eval",
        "--state-dir",
        str(state),
        *stack_port_args(),
    ]
    done = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=1500, env={**os.environ, "COLUMNS": "160"}
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "harness comparison cmp-eval on test" in done.stdout

    record = json.loads((state / "eval.json").read_text())
    assert record["run_id"] == "cmp-eval" and list(record["harnesses"]) == list(HARNESSES)
    for harness, result in record["harnesses"].items():
        assert result["harness"] == harness and result["run_id"] == "cmp-eval"
        assert set(result["tasks"]) == set(TASKS)
        for task in result["tasks"].values():
            assert task == {"rewards": [1.0], "statuses": ["SUCCEEDED"]}, (harness, task)
        assert result["summary"]["pass@1"] == 1.0 and result["summary"]["pass^1"] == 1.0
        cost = result["cost"]
        # the tool calls (2 and 1) and the call that ends the run (mini-swe-agent: its submit
        # command; the others: a text answer)
        assert cost["turns"] >= 2.5, (harness, cost)
        assert cost["samples"] >= 1 and cost["tokens"] > cost["sampled"] > 0, (harness, cost)
        assert cost["seconds"] > 0
        if cgroups.detect().kind != "none":  # each sandbox's cgroup was read when its harness ended
            assert cost["cpu_s"] > 0 and cost["peak_mib"] > 16, (harness, cost)
    costs = {h: r["cost"] for h, r in record["harnesses"].items()}
    # the npm CLIs send their large tool sets with every call: far more context per rollout
    assert costs["claude-code"]["tokens"] > 5 * costs["mini-swe-agent"]["tokens"]
    assert costs["codex"]["tokens"] > 5 * costs["mini-swe-agent"]["tokens"]
    assert costs["openclaw"]["tokens"] > 5 * costs["mini-swe-agent"]["tokens"]
