"""The trainer's run config (``StartRunRequest.config``): the schema of what a run trains.

The contract between the trainer, which trains what it says, and whoever writes one (``openforge
train`` checks its runs against it before anything starts). A run config is given inline
(``StartRunRequest.config``) or as a file (``config_path``: JSON or YAML), or both (inline fields
override the file's); the trainer reads and validates it. Field names follow veRL's where one
exists (``clip_ratio_low``, ``loss_agg_mode``, ``kl_loss_type``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from openforge_core.settings import SettingsSection

Algorithm = Literal["grpo", "rloo", "reinforce++"]
PolicyLoss = Literal["ppo-clip", "gspo"]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KlType = Literal["k1", "k2", "k3", "kl", "abs", "mse", "low_var_kl", "k3+", "low_var_kl+"]


class SftConfig(SettingsSection):
    """Rejection-sampling fine-tuning: train only on rollouts whose reward passes a bar.

    Attributes:
        min_reward: Keep a rollout's samples when its reward is >= this.
        source_run_id: Fine-tune on the completed groups of this recorded run (read from the
            store; no rollouts are submitted). Empty: submit rollouts like an RL run and keep
            those that pass (online rejection sampling).
        lr_decay: The learning rate over an SFT step's ``ppo_epochs`` passes: ``constant``, or
            ``linear`` from ``learning_rate`` at the first pass to ``learning_rate / passes`` at
            the last (the usual fine-tuning schedule, as Hugging Face's
            ``get_linear_schedule_with_warmup`` without warmup), so that many passes end near a
            minimum instead of wherever the last full-size step lands. ``torch`` backend only.
    """

    min_reward: float = 1.0
    source_run_id: str = ""
    lr_decay: Literal["constant", "linear"] = "constant"


class VerlConfig(SettingsSection):
    """Settings only the ``verl`` backend reads (mapping: ``services/trainer/VERL.md``).

    Attributes:
        distributed: Train with veRL's Ray worker group (one FSDP ``TrainingWorker`` per CUDA
            GPU) instead of one worker in the trainer's process; needs ``device: cuda``.
        n_gpus_per_node: GPUs per node of the worker group (veRL ``trainer.n_gpus_per_node``).
        nnodes: Nodes of the worker group (veRL ``trainer.nnodes``; > 1 joins the running Ray
            cluster).
        strategy: veRL's FSDP engine (``fsdp2``: ``fully_shard``; ``fsdp``: FSDP1).
    """

    distributed: bool = False
    n_gpus_per_node: int = Field(default=1, ge=1)
    nnodes: int = Field(default=1, ge=1)
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"


RolePolicy = Literal["train", "skip"]


class RolesConfig(SettingsSection):
    """What the trainer does with the samples of each call role (``Sample.role``, decided by the
    proxy from each request: main agent, sub-agent, compaction, side call).

    ``train``: the role's samples enter the batch (each sample holds one lineage's calls, or one
    compaction call; the rollout's reward and its group's statistics count the rollout once,
    whatever its number of samples). ``skip``: left out and counted
    (``samples/skipped_role/<role>``).

    Attributes:
        main: The agent acting on the task.
        sub_agent: Sub-agent conversations in the same session (Claude Code's Task tool), each
            its own sample.
        compaction: Summarising calls whose answer replaces the history, each its own sample.
        side: Title generation, quota and token-count probes: not the policy acting on the task.
    """

    main: RolePolicy = "train"
    sub_agent: RolePolicy = "train"
    compaction: RolePolicy = "train"
    side: RolePolicy = "skip"

    def trains(self, role: str) -> bool:
        """Whether samples of ``role`` (``main``, ``sub_agent``, ``compaction``, ``side``) are trained."""
        policy: str = getattr(self, role, "train")
        return policy == "train"


class RunConfig(SettingsSection):
    """One training run.

    Attributes:
        model: HF model directory (safetensors) the run starts from.
        mode: ``rl`` (policy gradient) or ``sft`` (rejection-sampling fine-tuning).
        task_split: Task set (a folder of Harbor task folders or a named split) to train on.
        tasks: Task ids of ``task_split``; each step draws ``groups_per_step`` of them.
        eval_split: Task set for evaluation (default: ``task_split``).
        eval_tasks: Task ids evaluated every ``eval_interval`` steps (empty: no evaluation).
        harness: Harness name (claude-code, codex, openclaw, mini-swe-agent, command).
        command: Argv template of the ``command`` harness (``SubmitRolloutsRequest.command``,
            placeholders ``{instruction}``, ``{openai_base_url}``, ``{api_key}``, ``{model}``...);
            empty = the orchestrator's configured template. Ignored by the other harnesses.
        model_name: Model name written into the harness's config.
        group_size: Rollouts per task (the GRPO/RLOO group size n).
        groups_per_step: Completed groups per optimizer step.
        algorithm: Advantage estimator (veRL ``core_algos``: grpo, rloo, reinforce_plus_plus).
        loss: Policy loss (veRL ``vanilla`` PPO-clip or ``gspo``).
        loss_agg_mode: veRL ``agg_loss`` mode.
        learning_rate: AdamW learning rate (0: the weights never change, a negative control).
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient clipping by global norm (0 = off).
        kl_coef: Coefficient of the KL penalty to the initial policy (0 = no reference model).
        kl_loss_type: veRL ``kl_penalty`` estimator.
        entropy_coeff: Entropy bonus coefficient (0 = off).
        clip_ratio_low: PPO clip ε below 1 (ratio >= 1 - ε).
        clip_ratio_high: PPO clip ε above 1 (ratio <= 1 + ε; DAPO's clip-higher when > low).
        clip_ratio_c: Dual-clip PPO bound for negative advantages (> 1).
        max_staleness: Samples whose oldest sampled token is more than this many policy
            versions behind the trainer are dropped (and counted).
        is_cap: Truncated importance sampling: token weights min(π_old/π_behaviour, is_cap).
        ppo_epochs: Passes over each batch (RL; SFT on the ``torch`` backend, e.g. several
            epochs over recorded demonstrations).
        mini_batches: Optimizer steps per pass (the batch is split into this many parts).
        micro_batch_tokens: Padded tokens per forward/backward (gradient accumulation).
        temperature: Sampling temperature of the rollouts, sent with every ``SubmitRollouts``
            (``sampling.temperature``) so the proxy enforces it on each model call whatever the
            harness asks for; the trainer divides logits by it before taking logprobs, as the
            engine reports behaviour logprobs after temperature. (No top-p/top-k: the trainer's
            logprobs are over the full vocabulary, as the behaviour logprobs then are.)
        max_tokens: Most tokens sampled per model call, enforced by the proxy
            (``sampling.max_tokens``; 0 = what the harness asks for, capped by the proxy).
        max_turns: Most model calls per rollout, enforced by the proxy session (0 = no limit).
        max_total_tokens: Most prompt + sampled tokens over a rollout's calls, enforced by the
            proxy session (0 = no limit).
        gamma: Discount of REINFORCE++ returns.
        norm_adv_by_std: GRPO divides by the group's reward std (False: Dr. GRPO).
        drop_zero_variance_groups: Dynamic sampling (DAPO, Yu et al. 2025, arXiv:2503.14476,
            §3.2; veRL ``algorithm.filter_groups``): in RL, a group whose trained rollouts all
            earned the same reward (GRPO/RLOO advantage 0 everywhere) is not trained on and
            another group is requested in its place (``groups/zero_variance_dropped``).
        shuffle_rewards: A negative control: before advantages, the rewards of each group's
            rollouts are permuted among them (seeded by ``seed`` and the group's request and position); a run that
            still improves under it improves for some other reason than its rewards. Metrics
            keep the true rewards.
        max_zero_variance_refills: Most zero-variance groups replaced per step when
            ``drop_zero_variance_groups`` is on (veRL's ``max_num_gen_batches`` counted in
            groups); the next one ends the step's collection: it trains on the groups it has,
            or on the zero-variance groups when it has none.
        steps: Optimizer steps of the run.
        eval_interval: Evaluate every this many steps (0 = never).
        pass_threshold: A rollout passes when its reward is >= this (pass@k, pass^k).
        pass_k: The k values of pass@k and pass^k (each <= group_size).
        seed: Seed of task order, of torch and, with ``seeded_sampling``, of sampling.
        seeded_sampling: Every model call samples with a seed derived from ``seed``
            (:func:`openforge_core.seeds.derive_seed`: the submission's key, the task's position,
            the rollout's index in its group, the call), so a run sampled again on the same
            engine samples the same tokens (up to the engine's numerics across batch shapes), the
            rollouts of a group still differ, and the evaluations before and after training
            sample each task's rollouts with the same seeds (a paired comparison). False: the
            engines' own random seeds.
        rollout_timeout_s: Overrides the task timeout (0 = the task's own).
        backend: Trainer backend name (``torch``).
        device: Torch device of the backend (``cpu``, ``cuda``, ``cuda:1``).
        precision: ``fp32``, or ``bf16`` mixed precision: fp32 master weights, optimizer state
            and gradients, forward and backward under bf16 autocast, the log-softmax on the logits cast to fp32 (PyTorch
            AMP practice; veRL's FSDP ``mixed_precision`` param_dtype bf16, reduce and buffers
            fp32). ``auto`` is bf16 on a CUDA device that supports it, fp32 elsewhere.
        gradient_checkpointing: Recompute activations in the backward pass instead of keeping
            them (transformers' ``gradient_checkpointing_enable``, non-reentrant; veRL's
            ``model.enable_gradient_checkpointing``): less memory, about a third more compute.
            None keeps the backend's own default (torch: off; verl: veRL's, on).
        sft: Rejection-sampling fine-tuning settings (mode ``sft``).
        verl: Settings of the ``verl`` backend (worker group size, FSDP engine).
        roles: Which call roles' samples are trained (default: main, sub-agent and compaction
            samples; side calls are not).
    """

    model: str
    mode: Literal["rl", "sft"] = "rl"
    task_split: str = ""
    tasks: list[str] = Field(default_factory=list)
    eval_split: str = ""
    eval_tasks: list[str] = Field(default_factory=list)
    harness: str = "command"
    command: list[str] = Field(default_factory=list)
    model_name: str = "policy"
    group_size: int = Field(default=4, ge=1)
    groups_per_step: int = Field(default=1, ge=1)
    algorithm: Algorithm = "grpo"
    loss: PolicyLoss = "ppo-clip"
    loss_agg_mode: LossAggMode = "token-mean"
    learning_rate: float = Field(default=1e-6, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, ge=0)
    kl_coef: float = Field(default=0.0, ge=0)
    kl_loss_type: KlType = "low_var_kl"
    entropy_coeff: float = Field(default=0.0, ge=0)
    clip_ratio_low: float = Field(default=0.2, gt=0, lt=1)
    clip_ratio_high: float = Field(default=0.28, gt=0)
    clip_ratio_c: float = Field(default=3.0, gt=1)
    max_staleness: int = Field(default=1, ge=0)
    is_cap: float = Field(default=2.0, gt=0)
    ppo_epochs: int = Field(default=1, ge=1)
    mini_batches: int = Field(default=1, ge=1)
    micro_batch_tokens: int = Field(default=16384, ge=1)
    temperature: float = Field(default=1.0, gt=0, le=2)
    max_tokens: int = Field(default=0, ge=0)
    max_turns: int = Field(default=0, ge=0)
    max_total_tokens: int = Field(default=0, ge=0)
    gamma: float = Field(default=1.0, gt=0, le=1)
    norm_adv_by_std: bool = True
    drop_zero_variance_groups: bool = False
    max_zero_variance_refills: int = Field(default=8, ge=0)
    shuffle_rewards: bool = False
    steps: int = Field(default=1, ge=1)
    eval_interval: int = Field(default=0, ge=0)
    pass_threshold: float = 1.0
    pass_k: list[int] = Field(default_factory=lambda: [1])
    seed: int = 0
    seeded_sampling: bool = True
    rollout_timeout_s: float = Field(default=0.0, ge=0)
    backend: str = "torch"
    device: str = "cpu"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    gradient_checkpointing: bool | None = None
    sft: SftConfig = SftConfig()
    verl: VerlConfig = VerlConfig()
    roles: RolesConfig = RolesConfig()

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.mode == "rl" or not self.sft.source_run_id:
            if not self.tasks:
                raise ValueError("tasks: at least one task id is needed to request rollouts")
        if any(k < 1 or k > self.group_size for k in self.pass_k):
            raise ValueError("pass_k: every k must be in [1, group_size]")
        if self.mini_batches > self.groups_per_step * self.group_size:
            raise ValueError("mini_batches: more mini-batches than rollouts per step")
        return self

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per step (``ppo_epochs * mini_batches``)."""
        return self.ppo_epochs * self.mini_batches
