"""The demo's RL phase: where the time goes on the real path, against an in-process reference.

``learn_bench.py`` (the benchmark), in one run:

1. The real path: ``openforge train`` on the demo config (default ``examples/demo/demo.yaml``;
   no evaluation, run id ``learn-bench``) in a fresh state folder: warm start, then the RL phase
   through mini-swe-agent, the proxy, vLLM, the store and the trainer. ``--from-state DIR`` reads
   a finished run instead (e.g. ``.openforge/train/demo`` after ``make demo``, run id ``demo``).
2. From that run: per RL step, the reward and the trainer's time split (waiting for the step's
   groups, training, checkpoint, weight update; ``metrics.jsonl``), and per rollout, read back
   from the run's store (``ListRollouts``, ``GetCalls``): harness start (sandbox and harness up
   to its first model call), generation (the proxy's time in model calls) and the rest (tool
   commands, the harness's own work between calls, the verifier).
3. The reference: the same RL phase in this process, on the same warm-started model with the same
   settings (steps, groups, group size, learning rate, temperature, token and turn limits, the
   conversation mini-swe-agent holds with the demo's harness settings, the tasks' own verifiers
   in bubblewrap, the trainer's ``torch`` backend), sampling with transformers ``generate``:
   no harness, proxy, store or inference service.

It prints both reward curves against wall-clock, the time split, and the ratio of wall-clock per
RL step (real / reference): the cost of the real path.

``learn_bench.py reference [...]`` runs only the in-process loop, warm start included (SFT on
oracle demonstrations, teacher-forced): a quick way to try task and training settings.

Usage::

    .venv/bin/python tools/bench/learn_bench.py [--config examples/demo/demo.yaml] [--steps N]
    .venv/bin/python tools/bench/learn_bench.py --from-state .openforge/train/demo
    .venv/bin/python tools/bench/learn_bench.py reference --demo-tasks count-0,sort-0 --sft-steps 80
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from openforge_inference.engines.scripted_oracle import (
    ERROR_KINDS,
    SUBMIT_COMMAND,
    ErrorDraws,
    OraclePlans,
    oracle_completion,
)

ROOT = Path(__file__).resolve().parents[2]
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


@dataclass(frozen=True)
class Task:
    """One Harbor task folder of the family."""

    task_id: str
    folder: Path
    instruction: str
    files: dict[str, str]

    @classmethod
    def load(cls, folder: Path) -> Task:
        files_dir = folder / "environment" / "files"
        files = {p.name: p.read_text() for p in files_dir.iterdir()} if files_dir.is_dir() else {}
        return cls(folder.name, folder, (folder / "instruction.md").read_text().strip(), files)


def load_split(root: Path, split: str) -> list[Task]:
    """Every task of ``root/split``, by name."""
    return [Task.load(p) for p in sorted((root / split).iterdir()) if p.is_dir()]


@dataclass
class Harness:
    """The conversation mini-swe-agent holds with the demo's settings (templates rendered here)."""

    system: str
    instance: str
    observation: str
    format_error: str

    @classmethod
    def load(cls, settings: Path) -> Harness:
        import jinja2

        doc = yaml.safe_load(settings.read_text())
        fmt = (
            "Tool call error:\n\n<error>\n{{error}}\n</error>\n\nEvery response needs to use the 'bash' tool "
            "at least once to execute commands."
        )
        env = jinja2.Environment()
        return cls(
            system=doc["agent"]["system_template"],
            instance=doc["agent"]["instance_template"],
            observation=doc["model"]["observation_template"],
            format_error=env.from_string(fmt).render(error="No tool calls found in the response."),
        )

    def render(self, template: str, **kw: Any) -> str:
        import jinja2

        return jinja2.Environment().from_string(template).render(**kw)


def run_in_sandbox(workdir: Path, logs: Path, argv: list[str], timeout: float = 10.0) -> tuple[int, str]:
    """``argv`` in bubblewrap: the host's ``/usr`` and ``/etc`` read-only, ``workdir`` as
    ``/app``, ``logs`` as ``/logs``, no network."""
    cmd = [
        "bwrap", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--bind", str(workdir), "/app",
        "--bind", str(logs), "/logs", "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
        "--die-with-parent", "--chdir", "/app", *argv,
    ]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return out.returncode, out.stdout + out.stderr


@dataclass
class Episode:
    """One rollout being generated."""

    task: Task
    workdir: Path
    logs: Path
    messages: list[dict[str, Any]]
    prompt_ids: list[int] = field(default_factory=list)
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    turns: int = 0
    reward: float = 0.0


class Reference:
    """The in-process policy, environment and trainer.

    Args:
        model_dir: HF model folder the policy starts from.
        settings: The harness settings file (its templates).
        run: Trainer ``RunConfig`` fields of the phase (learning rate, temperature, ...).
    """

    def __init__(self, model_dir: Path, settings: Path, run: dict[str, Any]) -> None:
        import torch
        from transformers import AutoTokenizer

        from openforge_core.run_config import RunConfig
        from openforge_trainer.backends.torch_backend import TorchBackend

        self.tok: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self.harness = Harness.load(settings)
        self.cfg = RunConfig.model_validate({"model": str(model_dir), "tasks": ["x"], **run})
        self.backend = TorchBackend(self.cfg)
        self.backend.load(model_dir, None)
        self.model: Any = self.backend.model
        self.version = 0
        self.tmp = Path(tempfile.mkdtemp(prefix="learn-ref-"))
        torch.manual_seed(self.cfg.seed)

    def _ids(self, messages: list[dict[str, Any]]) -> list[int]:
        ids: Any = self.tok.apply_chat_template(messages, tools=[BASH_TOOL], add_generation_prompt=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    def _start(self, task: Task) -> Episode:
        wd = Path(tempfile.mkdtemp(dir=self.tmp))
        (wd / "app").mkdir()
        (wd / "logs" / "verifier").mkdir(parents=True)
        for name, text in task.files.items():
            (wd / "app" / name).write_text(text)
        messages = [
            {"role": "system", "content": self.harness.system},
            {"role": "user", "content": self.harness.render(self.harness.instance, task=task.instruction)},
        ]
        ep = Episode(task, wd / "app", wd / "logs", messages)
        ep.prompt_ids = self._ids(messages)
        return ep

    def _append(self, ep: Episode, text_ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        ep.response += text_ids
        ep.mask += [mask] * len(text_ids)
        ep.logprobs += logprobs if logprobs is not None else [0.0] * len(text_ids)

    def _act(self, ep: Episode, completion: str, ids: list[int], logprobs: list[float]) -> None:
        """Applies one model answer: runs its command or sends the format error, as mini does."""
        ep.turns += 1
        self._append(ep, ids, 1, logprobs)
        m = _CALL.search(completion)
        command = None
        if m:
            try:
                command = json.loads(m.group(1))["arguments"]["command"]
            except (ValueError, KeyError, TypeError):
                command = None
        full = [*ep.messages, {"role": "assistant", "content": completion}]
        if command is None:
            ep.messages = [*full, {"role": "user", "content": self.harness.format_error}]
        elif command.strip() == SUBMIT_COMMAND:
            ep.done = True
            return
        else:
            rc, out = run_in_sandbox(ep.workdir, ep.logs, ["bash", "-c", command])
            obs = self.harness.render(self.harness.observation, output={"output": out, "returncode": rc})
            ep.messages = [*full, {"role": "tool", "content": obs}]
        before = len(ep.prompt_ids) + len(ep.response)
        new = self._ids(ep.messages)
        # The template re-renders the answer: take what follows the answer (its end and the result).
        ans_end = self.tok.convert_tokens_to_ids("<|im_end|>")
        tail = new[before:] if new[: len(ep.prompt_ids)] == ep.prompt_ids else []
        if not tail:
            idx = len(new) - 1 - new[::-1].index(ans_end) if ans_end in new else len(new)
            tail = new[idx:]
        self._append(ep, tail, 0)

    def _verify(self, ep: Episode) -> float:
        run_in_sandbox(ep.workdir, ep.logs, ["python3", "-c", (ep.task.folder / "tests" / "check.py").read_text()])
        p = ep.logs / "verifier" / "reward.json"
        return float(json.loads(p.read_text())["reward"]) if p.is_file() else 0.0

    def generate(self, eps: list[Episode], max_tokens: int, temperature: float) -> None:
        """One turn for every unfinished episode (batched, left-padded)."""
        import torch

        live = [e for e in eps if not e.done]
        if not live:
            return
        seqs = [e.prompt_ids + e.response for e in live]
        width = max(len(s) for s in seqs)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
        att = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=att, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                max_new_tokens=max_tokens, output_scores=True, return_dict_in_generate=True,
                eos_token_id=self.tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=pad,
            )  # fmt: skip
        self.model.train()
        gen = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)
        eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        for i, ep in enumerate(live):
            toks: list[int] = []
            lps: list[float] = []
            for j, t in enumerate(gen[i].tolist()):
                toks.append(t)
                lps.append(float(scores[i, j, t]))
                if t == eos:
                    break
            text = self.tok.decode(toks, skip_special_tokens=False).removesuffix("<|im_end|>")
            self._act(ep, text, toks, lps)

    def rollouts(self, tasks: list[Task], n: int, run: dict[str, Any]) -> list[Episode]:
        """``n`` rollouts of each task, to the end or ``max_turns``; each verified."""
        eps = [self._start(t) for t in tasks for _ in range(n)]
        for _ in range(int(run.get("max_turns", 4))):
            self.generate(eps, int(run.get("max_tokens", 64)), float(run.get("temperature", 1.0)))
        for ep in eps:
            ep.reward = self._verify(ep)
        return eps

    def demonstrations(
        self, tasks: list[Task], max_turns: int, error_rate: float = 0.0, error_kind: str = "plan"
    ) -> list[Episode]:
        """The oracle's conversations, teacher-forced: each answer is the ``scripted-oracle``
        engine's own (:func:`oracle_completion` on the decoded prompt), for ``max_turns`` turns
        at most (the submit call ends a conversation)."""
        plans = {root: OraclePlans(root) for root in {t.folder.parents[1] for t in tasks}}
        errors = ErrorDraws(error_rate, self.cfg.seed) if error_rate > 0 else None
        eps = []
        for t in tasks:
            ep = self._start(t)
            for _ in range(max_turns):
                prompt = self.tok.decode(ep.prompt_ids + ep.response, skip_special_tokens=False)
                text = oracle_completion(plans[t.folder.parents[1]], prompt, errors=errors, error_kind=error_kind)
                ids = self.tok.encode(text + "<|im_end|>", add_special_tokens=False)
                self._act(ep, text, ids, [0.0] * len(ids))
                if ep.done:
                    break
            ep.reward = self._verify(ep)
            eps.append(ep)
        return eps

    def samples(self, eps: list[Episode], group: str) -> list[Any]:
        from openforge_trainer.domain.samples import TrainSample

        out = []
        for i, ep in enumerate(eps):
            g = f"{group}/{ep.task.task_id}"
            out.append(
                TrainSample(
                    sample_id=f"{g}/{i}/0",
                    rollout_id=f"{g}/{i}",
                    group_id=g,
                    task_id=ep.task.task_id,
                    prompt_ids=tuple(ep.prompt_ids),
                    response_ids=tuple(ep.response),
                    loss_mask=tuple(ep.mask),
                    behaviour_logprobs=tuple(ep.logprobs),
                    policy_versions=tuple(self.version if m else 0 for m in ep.mask),
                    reward=ep.reward,
                )
            )
        return out

    def train(self, samples: list[Any], sft: bool) -> dict[str, float]:
        from openforge_trainer.domain.samples import TrainBatch

        if not sft and self.cfg.shuffle_rewards:  # the negative control, as the trainer's loop applies it
            from openforge_trainer.domain.samples import shuffle_rewards

            groups = list(dict.fromkeys(s.group_id for s in samples))
            samples = [
                x
                for g in groups
                for x in shuffle_rewards([s for s in samples if s.group_id == g], random.Random(f"{self.cfg.seed}:{g}"))
            ]
        batch = TrainBatch(tuple(samples), self.version)
        metrics = self.backend.train_sft(batch) if sft else self.backend.train_rl(batch)
        self.version += 1
        return metrics


def evaluate(ref: Reference, tasks: list[Task], k: int, limits: dict[str, Any], show: bool) -> float:
    """Mean reward of ``k`` rollouts of each task (printed per rollout with ``show``)."""
    eps = ref.rollouts(tasks, k, limits)
    if show:
        for e in eps:
            text = ref.tok.decode([t for t, m in zip(e.response, e.mask, strict=True) if m])
            print(f"  {e.task.task_id} {e.reward}: {text!r}")
    return statistics.fmean(e.reward for e in eps)


def reference_main(argv: list[str]) -> int:
    """``reference``: warm start (SFT on oracle demonstrations), held-out evaluation, GRPO, evaluation."""
    ap = argparse.ArgumentParser(prog="learn_bench.py reference", description=reference_main.__doc__)
    ap.add_argument("--model", type=Path, default=None, help="model folder (default: build the tiny one)")
    ap.add_argument("--size", default="1m")
    ap.add_argument("--tasks", type=Path, default=ROOT / "examples/demo/tasks")
    ap.add_argument("--settings", type=Path, default=ROOT / "examples/demo/mini-swe-agent.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demo-tasks", default="", help="comma-separated train task ids demonstrated (default: all)")
    ap.add_argument("--sft-steps", type=int, default=80, help="SFT passes over the demonstrations (0: none)")
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--demo-error-rate", type=float, default=0.0, help="the demonstrator's error rate")
    ap.add_argument("--demo-error-kind", default="plan", choices=ERROR_KINDS, help="the demonstrator's error")
    ap.add_argument("--save-sft", type=Path, default=None, help="write the warm-started model here")
    ap.add_argument("--rl-steps", type=int, default=10)
    ap.add_argument("--rl-lr", type=float, default=2e-4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--eval-k", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--show", action="store_true", help="print every evaluation rollout's answers")
    ap.add_argument("--run", default="{}", help="more RunConfig fields of the RL phase, as JSON")
    args = ap.parse_args(argv)
    model = args.model
    if model is None:
        model = Path(tempfile.mkdtemp(prefix="learn-ref-model-")) / "m"
        subprocess.run(
            [sys.executable, "-m", "openforge_inference.tiny_model", "--size", args.size, "--out", str(model),
             "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    train, test = load_split(args.tasks, "train"), load_split(args.tasks, "test")
    limits = {"max_turns": args.max_turns, "max_tokens": args.max_tokens, "temperature": args.temperature}
    t0 = time.perf_counter()
    if args.sft_steps:
        sft = Reference(model, args.settings, {"learning_rate": args.sft_lr, "seed": args.seed})
        picked = [t for t in train if t.task_id in args.demo_tasks.split(",")] if args.demo_tasks else train
        demo_eps = sft.demonstrations(picked, args.max_turns, args.demo_error_rate, args.demo_error_kind)
        print(f"demonstrations: {len(demo_eps)}, reward {statistics.fmean(e.reward for e in demo_eps):.3f}")
        demos = sft.samples(demo_eps, "sft")
        for step in range(args.sft_steps):
            m = sft.train(demos, sft=True)
            if step % 10 == 0 or step == args.sft_steps - 1:
                print(f"sft {step}: nll {m.get('sft/nll_per_token', 0):.3f}")
        model = args.save_sft or Path(tempfile.mkdtemp(prefix="learn-ref-sft-"))
        sft.backend.save_checkpoint(model)
    t1 = time.perf_counter()
    # The RL phase starts from the warm-started weights with a fresh optimizer, as the real path.
    run = {"learning_rate": args.rl_lr, "seed": args.seed, "temperature": args.temperature, **json.loads(args.run)}
    ref = Reference(model, args.settings, run)
    before = evaluate(ref, test, args.eval_k, limits, args.show)
    print(f"eval before: reward {before:.3f}")
    t2 = time.perf_counter()
    rng = random.Random(args.seed)
    for step in range(args.rl_steps):
        ts = time.perf_counter()
        groups = step_groups(
            ref, train, rng, {"groups_per_step": args.groups, "group_size": args.group_size, **run}, limits
        )
        tg = time.perf_counter() - ts
        m = ref.train([s for j, g in enumerate(groups) for s in ref.samples(g, f"step{step}/{j}")], sft=False)
        eps = [e for g in groups for e in g]
        print(f"rl {step}: reward {statistics.fmean(e.reward for e in eps):.3f} rollouts {tg:.1f}s "
              f"train {time.perf_counter() - ts - tg:.1f}s entropy {m.get('entropy', 0):.3f}")  # fmt: skip
    t3 = time.perf_counter()
    after = evaluate(ref, test, args.eval_k, limits, args.show)
    print(f"eval after: reward {after:.3f}")
    print(f"before {before:.3f} after {after:.3f} delta {after - before:+.3f}; "
          f"sft {t1 - t0:.0f}s rl {t3 - t2:.0f}s total {time.perf_counter() - t0:.0f}s")  # fmt: skip
    return 0


RUN_ID = "learn-bench"


def run_real(config: Path, state: Path, steps: int | None) -> dict[str, Any]:
    """Runs the demo config (run id ``learn-bench``, no evaluation) with ``openforge train``.

    Returns:
        The config run (paths made absolute).
    """
    cfg: dict[str, Any] = yaml.safe_load(config.read_text())
    cfg["run_id"] = RUN_ID
    cfg["eval"] = None
    if steps is not None:
        cfg["run"]["steps"] = steps
    if "harness_config" in cfg:
        cfg["harness_config"] = str((ROOT / cfg["harness_config"]).resolve())
    cfg["stack"]["tasks_root"] = str((ROOT / cfg["stack"]["tasks_root"]).resolve())
    cfg["model"]["path"] = str((ROOT / cfg["model"]["path"]).resolve())
    path = state.parent / "learn-bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [str(Path(sys.executable).parent / "openforge"), "train", str(path), "--state-dir", str(state), "--fresh"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return cfg


def step_metrics(state: Path, run_id: str) -> list[dict[str, Any]]:
    """The RL run's ``metrics.jsonl``: one ``{"step", "time", "metrics"}`` per step."""
    lines = (state / "checkpoints" / run_id / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def rollout_split(store: str, run_id: str) -> dict[str, list[float]]:
    """Per rollout of the RL run with calls: harness start, generation, the rest, seconds."""
    from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
    from openforge_core.rpc.client import open_channel

    channel = open_channel(store)
    stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
    out: dict[str, list[float]] = {"harness_start_s": [], "generation_s": [], "other_s": [], "rollout_s": []}
    token = ""
    try:
        while True:
            page = await stub.ListRollouts(
                trajectory_pb2.ListRolloutsRequest(run_id=run_id, page_size=1000, page_token=token)
            )
            for r in page.rollouts:
                calls = (await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=r.rollout_id))).calls
                if not calls or not r.HasField("end_time"):
                    continue
                start, end = r.start_time.ToDatetime(), r.end_time.ToDatetime()
                first = min(c.receive_time.ToDatetime() for c in calls)
                gen = sum(c.total_time.ToTimedelta().total_seconds() for c in calls)
                total = (end - start).total_seconds()
                head = (first - start).total_seconds()
                out["harness_start_s"].append(head)
                out["generation_s"].append(gen)
                out["other_s"].append(total - head - gen)
                out["rollout_s"].append(total)
            token = page.next_page_token
            if not token:
                return out
    finally:
        await channel.close()


def run_reference(model: Path, cfg: dict[str, Any], tasks_root: Path, settings: Path) -> list[dict[str, float]]:
    """The RL phase in this process with the config's settings; one row per step."""
    run = cfg["run"]
    limits = {"max_turns": run["max_turns"], "max_tokens": run["max_tokens"], "temperature": run["temperature"]}
    ref = Reference(
        model,
        settings,
        {"learning_rate": run["learning_rate"], "seed": run.get("seed", 0), "temperature": run["temperature"]},
    )
    train = load_split(tasks_root, cfg.get("split", "train"))
    rng = random.Random(run.get("seed", 0))
    rows = []
    start = time.perf_counter()
    for step in range(int(run["steps"])):
        t0 = time.perf_counter()
        groups = step_groups(ref, train, rng, run, limits)
        t1 = time.perf_counter()
        ref.train([s for j, g in enumerate(groups) for s in ref.samples(g, f"step{step}/{j}")], sft=False)
        t2 = time.perf_counter()
        reward = statistics.fmean(e.reward for g in groups for e in g)
        rows.append({"reward": reward, "rollouts_s": t1 - t0, "train_s": t2 - t1, "wall_s": t2 - start})
    return rows


def step_groups(
    ref: Reference, train: list[Task], rng: random.Random, run: dict[str, Any], limits: dict[str, Any]
) -> list[list[Episode]]:
    """One step's groups, collected as the trainer's loop does: ``groups_per_step`` groups of
    ``group_size``; with ``drop_zero_variance_groups`` a group whose rollouts all earned one
    reward is set aside and another is drawn in its place, until more than
    ``max_zero_variance_refills`` were set aside (then the step trains on what it has, or on the
    last ones set aside when it has none)."""
    want, size = int(run["groups_per_step"]), int(run["group_size"])
    dynamic = bool(run.get("drop_zero_variance_groups", False))
    refills = int(run.get("max_zero_variance_refills", 8))
    kept: list[list[Episode]] = []
    aside: list[list[Episode]] = []
    while len(kept) < want and len(aside) <= refills:
        tasks = rng.sample(train, want - len(kept))
        eps = ref.rollouts(tasks, size, limits)
        for i in range(len(tasks)):
            group = eps[i * size : (i + 1) * size]
            if dynamic and len({e.reward for e in group}) == 1:
                aside.append(group)
            else:
                kept.append(group)
        if not dynamic:
            break
    return kept[:want] or aside[-want:]


def report(steps: list[dict[str, Any]], split: dict[str, list[float]], ref_rows: list[dict[str, float]]) -> None:
    """Prints the curves, the time split and the ratio."""
    first = steps[0]["time"] - steps[0]["metrics"]["time/step_s"]
    print("\nreward against wall-clock, RL phase (real path | in-process reference)")
    print(f"{'step':>4} {'real reward':>11} {'real wall s':>11} | {'ref reward':>10} {'ref wall s':>10}")
    for s, r in zip(steps, ref_rows, strict=False):
        m = s["metrics"]
        print(f"{s['step']:>4} {m.get('reward/mean', 0):>11.3f} {s['time'] - first:>11.1f} | "
              f"{r['reward']:>10.3f} {r['wall_s']:>10.1f}")  # fmt: skip
    keys = ["time/wait_rollouts_s", "time/train_s", "time/checkpoint_s", "time/weight_sync_s", "time/step_s"]
    print("\nreal path, per RL step (mean over steps, s):")
    for k in keys:
        print(f"  {k:<24} {statistics.fmean(s['metrics'].get(k, 0.0) for s in steps):8.2f}")
    print("real path, per rollout (mean, s):")
    for k, v in split.items():
        if v:
            print(f"  {k:<24} {statistics.fmean(v):8.2f}   (n={len(v)})")
    print("reference, per RL step (mean, s):")
    for k in ("rollouts_s", "train_s"):
        print(f"  {k:<24} {statistics.fmean(r[k] for r in ref_rows):8.2f}")
    real_step = statistics.fmean(s["metrics"]["time/step_s"] for s in steps)
    ref_step = statistics.fmean(r["rollouts_s"] + r["train_s"] for r in ref_rows)
    print(f"\nwall-clock per RL step: real {real_step:.1f} s, reference {ref_step:.1f} s, "
          f"ratio {real_step / ref_step:.1f}x")  # fmt: skip


def main(argv: list[str]) -> int:
    """The benchmark (see the module docstring); ``reference ...`` runs :func:`reference_main`."""
    if argv[:1] == ["reference"]:
        return reference_main(argv[1:])
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "demo" / "demo.yaml")
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's)")
    ap.add_argument("--state-dir", type=Path, default=None, help="state folder (default: a temporary one)")
    ap.add_argument("--from-state", type=Path, default=None, help="read this finished run instead of running one")
    args = ap.parse_args(argv)
    if args.from_state is not None:
        state = args.from_state.resolve()
        cfg: dict[str, Any] = yaml.safe_load(args.config.read_text())
        run_id = str(cfg["run_id"])
        cfg["stack"]["tasks_root"] = str((ROOT / cfg["stack"]["tasks_root"]).resolve())
    else:
        state = (args.state_dir or Path(tempfile.mkdtemp(prefix="learn-bench-")) / "state").resolve()
        state.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        cfg = run_real(args.config, state, args.steps)
        run_id = RUN_ID
        print(f"real path, whole run (warm start + RL, services started twice): {time.perf_counter() - t0:.0f} s")
    steps = step_metrics(state, run_id)

    from openforge_cli.dash.local_store import run_store

    with run_store(state) as store:
        split = asyncio.run(rollout_split(store, run_id))
    settings = Path(cfg.get("harness_config") or "examples/demo/mini-swe-agent.yaml")
    model = state / "models" / "warm-start"
    ref_rows = run_reference(model, cfg, Path(cfg["stack"]["tasks_root"]), ROOT / settings)
    report(steps, split, ref_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
