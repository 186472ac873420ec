"""The train config of ``openforge train`` (and ``openforge eval``): its schema and the checks
run before anything starts, each failure one line naming the field (see :mod:`openforge_cli.train`
for the config's shape)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import Field, TypeAdapter, ValidationError

from openforge_cli.eval import RolloutSpec, split_tasks
from openforge_core.engine_names import ENGINE_NAMES
from openforge_core.run_config import RunConfig
from openforge_core.seeds import EVAL_SEED_KEY, request_seed
from openforge_core.settings import SettingsSection

#: The evaluations around the RL run: (key, label); recorded under :func:`eval_run_id`.
EVAL_PHASES = (("before", "before RL"), ("after", "after RL"))
#: Harnesses that take a ``harness_config`` (the orchestrator's ``harness.config_files``).
HARNESS_CONFIG_FILES = ("mini-swe-agent",)


class ModelSpec(SettingsSection):
    """The model the run starts from.

    Attributes:
        path: HF model directory (safetensors, config.json, tokenizer.json, chat template).
        init_tiny: Build a random-init tiny model of this size at ``path`` when it is missing
            (``openforge model init-tiny``; nothing is downloaded).
        seed: Seed of the tiny model.
    """

    path: Path
    init_tiny: Literal["1m", "10m", "50m", "300m"] | None = None
    seed: int = 0


class StackSpec(SettingsSection):
    """The local services.

    Attributes:
        engine: Inference engine of the policy (``vllm``; ``transformers`` is the reference).
        fallback_engine: Engine to use when ``engine`` does not start ("" = none).
        tasks_root: Folder of task sets (Harbor task folders per split).
        harness_dir: Where ``openforge harness install`` put the harnesses.
        max_concurrent: Rollouts running at once.
        serving_timeout_s: How long to wait for all services to report SERVING, seconds.
        env: More ``OPENFORGE_*`` settings for every service (see docs/configuration.md).
    """

    engine: str = "vllm"
    fallback_engine: str = "transformers"
    tasks_root: Path = Path("examples/tasks")
    harness_dir: Path = Path(".openforge/harnesses")
    max_concurrent: int = Field(default=2, ge=1)
    serving_timeout_s: float = Field(default=300.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class WarmStartSpec(SettingsSection):
    """SFT on demonstrations recorded through the real path before RL.

    Attributes:
        engine: The engine that produces the demonstrations (``scripted-oracle``).
        error_rate: The ``scripted-oracle`` demonstrator's error rate: the fraction of the
            demonstrations of each command that it gets wrong (within one; which ones is drawn
            with ``run.seed``); 0 = always right.
        error_kind: That error: ``plan`` (a demonstration follows another task's plan) or
            ``unwritten`` (a command that should write its output into a file only prints it).
        run: Run-config fields of the SFT run (``mode: sft`` is set), over ``run``'s.
    """

    engine: str = "scripted-oracle"
    error_rate: float = Field(default=0.0, ge=0, le=1)
    error_kind: Literal["plan", "unwritten"] = "plan"
    run: dict[str, Any] = Field(default_factory=dict)


class EvalSpec(SettingsSection):
    """Evaluation before and after RL on a held-out split.

    Attributes:
        split: Task split evaluated.
        tasks: Task ids (empty: the whole split).
        k: Rollouts per task; pass@1..k and pass^1..k are reported.
        pass_threshold: A rollout passes when its reward is >= this.
    """

    split: str = "test"
    tasks: list[str] = Field(default_factory=list)
    k: int = Field(default=1, ge=1)
    pass_threshold: float = 1.0


class TrainConfig(SettingsSection):
    """A train config (see the module docstring).

    Attributes:
        run_id: Run id of the RL run (the SFT run is ``<run_id>-sft``; evaluations
            ``<run_id>-eval-before`` / ``-after``).
        model: The starting model.
        harness: Harness of every rollout.
        harness_config: A settings file layered over the harness's own defaults (mini-swe-agent:
            ``-c mini.yaml -c FILE``), e.g. a shorter system prompt; None: the defaults.
        split: Task set trained on.
        tasks: Task ids of ``split`` (empty: all of it).
        stack: The local services.
        warm_start: SFT before RL (None: none).
        run: Trainer run-config fields of the RL run (``openforge_core.run_config.RunConfig``);
            ``model``, ``mode``, ``harness``, ``task_split`` and ``tasks`` are filled in.
        eval: Evaluation before and after RL (None: none).
    """

    run_id: str = Field(default="run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=96)
    model: ModelSpec
    harness: str = "mini-swe-agent"
    harness_config: Path | None = None
    split: str = "train"
    tasks: list[str] = Field(default_factory=list)
    stack: StackSpec = StackSpec()
    warm_start: WarmStartSpec | None = None
    run: dict[str, Any] = Field(default_factory=dict)
    eval: EvalSpec | None = EvalSpec()

    @property
    def tasks_root_path(self) -> Path:
        """Absolute task root."""
        return self.stack.tasks_root.resolve()

    def train_tasks(self) -> list[str]:
        """The task ids trained on."""
        return list(self.tasks) or split_tasks(self.tasks_root_path, self.split)

    def eval_tasks(self) -> list[str]:
        """The task ids evaluated (empty without ``eval``)."""
        if self.eval is None:
            return []
        return list(self.eval.tasks) or split_tasks(self.tasks_root_path, self.eval.split)

    def rollout_spec(self) -> RolloutSpec:
        """Harness, sampling and limits of the RL run, for evaluation rollouts: seeded as the
        trainer seeds its own evaluations (``run.seed``, unless ``run.seeded_sampling`` is false),
        so the evaluations before and after RL sample each task with the same seeds."""
        r = self.run
        seeded = TypeAdapter(bool).validate_python(r.get("seeded_sampling", True))  # as RunConfig reads it
        return RolloutSpec(
            harness=self.harness,
            model_name=str(r.get("model_name", "policy")),
            temperature=float(r.get("temperature", 1.0)),
            max_tokens=int(r.get("max_tokens", 0)),
            max_turns=int(r.get("max_turns", 0)),
            max_total_tokens=int(r.get("max_total_tokens", 0)),
            timeout_s=float(r.get("rollout_timeout_s", 0.0)),
            seed=request_seed(int(r.get("seed", 0)), EVAL_SEED_KEY) if seeded else None,
        )

    def rl_run_config(self, model: Path) -> dict[str, Any]:
        """The RL run's trainer config."""
        return {
            **self.run,
            "model": str(model),
            "mode": "rl",
            "harness": self.harness,
            "task_split": self.split,
            "tasks": self.train_tasks(),
        }

    def sft_run_config(self, model: Path) -> dict[str, Any]:
        """The warm start's trainer config (SFT on the demonstrations that pass)."""
        assert self.warm_start is not None
        return {**self.rl_run_config(model), **self.warm_start.run, "mode": "sft"}


def eval_run_id(run_id: str, key: str) -> str:
    """Run id of the evaluation ``key`` (``before``/``after``) of RL run ``run_id``."""
    return f"{run_id}-eval-{key}"


def load_train_config(path: Path) -> TrainConfig:
    """Reads and validates a train config (``.yaml``/``.yml`` or JSON).

    Raises:
        click.ClickException: Unreadable, not a mapping, or invalid (every bad field named).
    """
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise click.ClickException(f"cannot parse {path}: {where}{exc.problem or exc.context}") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise click.ClickException(f"{path} must hold a mapping of config fields")
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise click.ClickException(f"{path} does not validate: {lines}") from None


def check_split(
    cfg: TrainConfig, split: str, tasks: list[str], *, fields: tuple[str, str] = ("split", "tasks")
) -> None:
    """Checks that ``split`` is a folder of the task root holding every task of ``tasks`` (or,
    with none given, at least one task).

    Raises:
        click.ClickException: One line naming the field (``fields``: the split's, the tasks').
    """
    root = cfg.tasks_root_path
    if not root.is_dir():
        raise click.ClickException(f"stack.tasks_root: no folder {root}")
    folder = root / split
    if not folder.is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise click.ClickException(f"{fields[0]}: no task split {split!r} in {root} (splits: {known})")
    for task in tasks:
        if not (folder / task / "task.toml").is_file():
            raise click.ClickException(f"{fields[1]}: no task {task!r} in split {split!r} ({folder / task}/task.toml)")
    if not tasks:
        split_tasks(root, split)


def check_run_config(field: str, data: dict[str, Any]) -> None:
    """Validates a trainer run config against the trainer's ``RunConfig``
    (:mod:`openforge_core.run_config`).

    Raises:
        click.ClickException: One line, every bad field named as ``<field>.<name>``.
    """
    try:
        RunConfig.model_validate(data)
    except ValidationError as exc:
        lines = "; ".join(".".join([field, *(str(p) for p in e["loc"])]) + f": {e['msg']}" for e in exc.errors())
        raise click.ClickException(lines) from None


def check_config(cfg: TrainConfig) -> None:
    """Checks what the schema cannot before anything starts: the harness and engine names, the
    task root, splits and task ids, the model (or ``init_tiny``), and the trainer run configs of
    the RL run and the warm start (against the trainer's ``RunConfig``).

    Raises:
        click.ClickException: The first problem, one line naming the field and value.
    """
    check_names(cfg)
    check_split(cfg, cfg.split, cfg.tasks)
    if cfg.eval is not None:
        check_split(cfg, cfg.eval.split, cfg.eval.tasks, fields=("eval.split", "eval.tasks"))
    model = cfg.model.path.resolve()
    if not (model / "config.json").is_file() and cfg.model.init_tiny is None:
        raise click.ClickException(
            f"model.path: no model at {model} (config.json missing); set model.init_tiny to build one"
        )
    check_run_config("run", cfg.rl_run_config(model))
    if cfg.warm_start is not None:
        check_run_config("warm_start.run", cfg.sft_run_config(model))


def check_names(cfg: TrainConfig) -> None:
    """Checks the harness name and the engine names (:data:`openforge_core.engine_names.ENGINE_NAMES`).

    Raises:
        click.ClickException: One line naming the field and the unknown name.
    """
    from openforge_cli.harness import PINS, WORKSPACE_HARNESSES

    harnesses = sorted([*PINS, *WORKSPACE_HARNESSES, "command"])
    if cfg.harness not in harnesses:
        raise click.ClickException(f"harness: unknown harness {cfg.harness!r} (one of {harnesses})")
    engines = [
        ("stack.engine", cfg.stack.engine),
        ("stack.fallback_engine", cfg.stack.fallback_engine),
        ("warm_start.engine", cfg.warm_start.engine if cfg.warm_start else ""),
    ]
    for field, name in engines:
        if name and name not in ENGINE_NAMES:
            raise click.ClickException(f"{field}: unknown engine {name!r} (one of {list(ENGINE_NAMES)})")
    if cfg.harness_config is not None:
        if cfg.harness not in HARNESS_CONFIG_FILES:
            raise click.ClickException(
                f"harness_config: {cfg.harness} takes no settings file (only {', '.join(HARNESS_CONFIG_FILES)})"
            )
        if not cfg.harness_config.is_file():
            raise click.ClickException(f"harness_config: {cfg.harness_config} is not a file")


def check_installed(cfg: TrainConfig) -> None:
    """Checks that the config's harness is installed where the local orchestrator looks for it.

    Raises:
        click.ClickException: Not installed; the message gives the install command.
    """
    from openforge_cli.harness import MANIFEST

    if cfg.harness != "command" and not (cfg.stack.harness_dir / cfg.harness / MANIFEST).is_file():
        raise click.ClickException(
            f"harness: {cfg.harness} is not installed in {cfg.stack.harness_dir}: "
            f"run `openforge harness install {cfg.harness}`"
        )
