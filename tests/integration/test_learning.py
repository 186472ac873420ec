"""RL makes the agent better through the real path, and the two negative controls do not.

The demo's task family and warm start (``examples/demo/demo.yaml``: mini-swe-agent in bubblewrap
sandboxes, the proxy, the store, the orchestrator, the trainer and vLLM, each started by
``openforge train`` as a user runs it), at a smaller size: the warm start is the demo's (the
``scripted-oracle`` demonstrator whose answers are saved to ``answer.txt`` only part of the
time, imitated by SFT), made reproducible and given more to start from: SFT's learning rate
decayed over its passes and a demonstrator that saves half of its answers (``SFT_LR_DECAY``,
``ERROR_RATE``), then three RL runs of a few GRPO steps from that same warm-started policy:

- true rewards (the demo's settings);
- ``learning_rate: 0`` (the weights never change);
- ``shuffle_rewards`` (each group's rewards permuted among its rollouts before advantages).

Sampling is seeded from ``run.seed`` (``seeded_sampling``, on by default): the three runs sample
with the same seeds, so their first step's rollouts are the same rollouts (one policy, one set of
seeds) and the arms differ only by what each trains on them: a paired comparison, and one that
gives the same figures every time the test runs.

The readout is the policy's own probability that its first answer saves the result: for each
distinct first-call prompt that mini-swe-agent sent (read back from the store) of a task whose
first command writes ``answer.txt``, the probability of the oracle's answer relative to the same
answer with its redirection dropped (the demonstrator's error), at the run's temperature, from
each run's last checkpoint. It is exact (no sampling), so the margins below are not rollout
noise: the true-reward run must raise it, the learning-rate-0 run must leave it unchanged and
the shuffled run must not raise it as the true run does.

Needs ``bwrap`` (Debian ``bubblewrap``) and mini-swe-agent (``openforge harness install
mini-swe-agent``); skips otherwise. About 9 to 12 minutes on two cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_inference.engines.scripted_oracle import ErrorDraws, OraclePlans, oracle_completion
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import require_sandboxed_harness
from openforge_testing.servers import NatsServer, stack_port_args

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo" / "demo.yaml"
HARNESS_DIR = Path(os.environ.get("OPENFORGE_TEST_HARNESS_DIR", ROOT / ".openforge" / "harnesses"))
#: GRPO steps of the true-reward and shuffled runs. With the seeds derived as they are, p(saved)
#: reads warm start 0.313, true 0.806, learning rate 0 0.313, shuffled 0.343, the same figures in
#: every run on one machine (another CPU's float rounding read shuffled 0.344). The shuffled run
#: is the weak control: pairing removes the rollouts' noise, not its own (which rollout gets which
#: reward). Under another derivation of the rollout and call seeds (keyed by task and attempt) it
#: failed: true 0.744, shuffled 0.733 at two steps; 0.826 and 0.817 at three. A change that moves
#: sampling draws this test anew.
STEPS = 2
#: Steps of the learning-rate-0 run: its weights never change, so one step (trained on the very
#: rollouts of the true run's first step) shows it as well as more would.
LR0_STEPS = 1
#: The warm start's SFT learning rate over its 100 passes. At the demo's constant rate the share
#: of saved first answers the warm-started policy samples varied from 0.05 to 0.24 between runs
#: of one config and seed (SFT ends wherever its last full-size step lands; micro-batch order
#: and which task's demonstration is the saved one vary with rollout timing), and from 0.05
#: three steps of groups that almost never differ in reward do not separate a rise from noise.
#: Decayed linearly, two runs ended at 0.101 and 0.099: reproducible, but low enough that three
#: steps raised it by as little as +0.14 on one instruction.
SFT_LR_DECAY = "linear"
#: The demonstrator's error rate (the demo's is 0.75): 2 of the 4 demonstrations of each command
#: saved, so the warm start samples a saved answer often enough that most groups differ in reward
#: (with the decay: 0.31, then 0.66 and 0.88 after one and two true-reward steps).
ERROR_RATE = 0.5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def _train(config: dict[str, Any], tmp: Path, name: str) -> dict[str, Any]:
    """``openforge train`` on ``config`` in its own state folder; returns its ``phases.json``."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    state = tmp / name
    ports = stack_port_args()
    exe = Path(sys.executable).parent / "openforge"
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        code = subprocess.run(
            [str(exe), "train", str(path), "--state-dir", str(state), *ports],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "120"},
            timeout=2400,
            check=False,
        ).returncode
    assert code == 0, log.read_text()[-6000:]
    phases: dict[str, Any] = json.loads((state / "phases.json").read_text())
    phases["state"] = str(state)
    return phases


def _configs(tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The demo config at test size (warm start + true-reward RL), and a control's base config."""
    demo: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    demo["model"]["path"] = str(tmp / "model")
    demo["harness_config"] = str(ROOT / demo["harness_config"])
    demo["stack"]["tasks_root"] = str(ROOT / demo["stack"]["tasks_root"])
    demo["stack"]["harness_dir"] = str(HARNESS_DIR)
    demo["run"]["steps"] = STEPS
    demo["warm_start"]["run"]["sft"]["lr_decay"] = SFT_LR_DECAY
    demo["warm_start"]["error_rate"] = ERROR_RATE
    demo["eval"] = None
    demo["run_id"] = "learn"
    control = {k: v for k, v in demo.items() if k != "warm_start"}
    return demo, control


async def _first_prompts(store: str, run_id: str) -> dict[tuple[int, ...], str]:
    """Each distinct first-call prompt of ``run_id``'s rollouts, with its task id."""
    out: dict[tuple[int, ...], str] = {}
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        resp = await stub.ListRollouts(trajectory_pb2.ListRolloutsRequest(run_id=run_id, page_size=1000))
        for r in resp.rollouts:
            calls = (await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=r.rollout_id))).calls
            if calls:
                first = min(calls, key=lambda c: len(c.prompt_token_ids))
                out.setdefault(tuple(first.prompt_token_ids), r.task_id)
    return out


def _answers(plans: OraclePlans, tokenizer: Any, prompt: tuple[int, ...]) -> tuple[list[int], list[int]] | None:
    """The token ids of the oracle's first answer to ``prompt`` and of the same answer unsaved
    (None when the first command writes no file)."""
    text = tokenizer.decode(list(prompt), skip_special_tokens=False)
    saved = oracle_completion(plans, text)
    unsaved = oracle_completion(plans, text, errors=ErrorDraws(1.0, 0), error_kind="unwritten")
    if saved == unsaved:
        return None
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    enc = tokenizer.encode
    return [*enc(saved, add_special_tokens=False), end], [*enc(unsaved, add_special_tokens=False), end]


def _p_saved(model_dir: Path, items: list[tuple[tuple[int, ...], list[int], list[int]]], temperature: float) -> float:
    """Mean over ``items`` of p(saved) / (p(saved) + p(unsaved)) under the model in ``model_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()

    def logprob(prompt: tuple[int, ...], answer: list[int]) -> float:
        ids = torch.tensor([[*prompt, *answer]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        return float(logits.log_softmax(-1).gather(-1, torch.tensor(answer)[:, None]).sum())

    shares = []
    for prompt, saved, unsaved in items:
        a, b = logprob(prompt, saved), logprob(prompt, unsaved)
        shares.append(1.0 / (1.0 + math.exp(b - a)))
    return sum(shares) / len(shares)


def test_rl_raises_the_saved_answer_share_and_the_negative_controls_do_not(
    tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    require_sandboxed_harness(HARNESS_DIR, "mini-swe-agent")
    from transformers import AutoTokenizer

    demo, control = _configs(tmp_path)
    true_run = _train(demo, tmp_path, "true")
    warm = Path(true_run["warm_start"]["model"])
    control["model"] = {"path": str(warm)}
    lr0_run = {**control["run"], "learning_rate": 0.0, "steps": LR0_STEPS}
    lr0 = _train({**control, "run_id": "learn-lr0", "run": lr0_run}, tmp_path, "lr0")
    shuffled = _train(
        {**control, "run_id": "learn-shuffled", "run": {**control["run"], "shuffle_rewards": True}}, tmp_path, "shuf"
    )
    for phases, steps in ((true_run, STEPS), (lr0, LR0_STEPS), (shuffled, STEPS)):
        assert phases["rl"]["state"] == "RUN_STATE_COMPLETED" and phases["rl"]["policy_version"] >= steps

    store = service_process(
        "openforge_trajectory_store",
        {
            "OPENFORGE_NATS__URL": nats_server_fn.url,
            "OPENFORGE_STORE__DSN": f"sqlite:///{Path(true_run['state']) / 'trajectories.db'}",
        },
    )
    prompts = asyncio.run(_first_prompts(store.address, "learn"))
    tokenizer: Any = AutoTokenizer.from_pretrained(str(warm))
    plans = OraclePlans(Path(demo["stack"]["tasks_root"]))
    items = [(p, *pair) for p in prompts if (pair := _answers(plans, tokenizer, p)) is not None]
    assert len(items) >= 2, f"too few first-call prompts with a saved answer: {sorted(prompts.values())}"

    temperature = float(demo["run"]["temperature"])
    share = {
        "warm start": _p_saved(warm, items, temperature),
        **{
            name: _p_saved(Path(phases["rl"]["checkpoint_uri"]), items, temperature)
            for name, phases in (("true", true_run), ("lr0", lr0), ("shuffled", shuffled))
        },
    }
    rise = {k: v - share["warm start"] for k, v in share.items()}
    print(f"p(saved answer) over {len(items)} prompts: " + ", ".join(f"{k} {v:.3f}" for k, v in share.items()))
    assert rise["true"] >= 0.15, share
    assert abs(rise["lr0"]) < 1e-6, share  # no update at all
    assert rise["shuffled"] <= rise["true"] - 0.1, share
