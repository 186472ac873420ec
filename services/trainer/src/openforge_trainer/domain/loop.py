"""The training loop of one run (ARCHITECTURE.md, "The RL loop").

Per step: request rollout groups from the orchestrator (ahead of time, up to ``max_staleness``
steps) → take completed groups from the store in completion order → drop samples older than the
staleness bound (counted; more groups are requested to replace them) → optionally drop groups
whose rollouts all earned the same reward (DAPO dynamic sampling, bounded; replaced the same way)
→ train (RL or SFT) on the backend → checkpoint (weights, optimizer, trainer state) →
``UpdateWeights`` on inference → metrics.

Only rollouts with a verifier reward reach the backend: a group's rollouts without one
(:attr:`~openforge_trainer.domain.samples.CompletedGroup.excluded`) are counted per step by reason
(``rollouts/excluded/<reason>``) over every group the step consumed, so over a run each is
counted once.

Rollouts in flight are never aborted during a run: a weight update only changes the version that
samples their next tokens, and their samples are judged by the staleness bound when they arrive.
Once the run completes, the groups it requested but never consumed (refills and groups of the last
steps still running, which no step will train on) are cancelled on the orchestrator
(:data:`UNNEEDED_REASON`), so they hold no sandbox and no engine time after the run, and a
stopping orchestrator has none to wait for. A run that stops early keeps them for its resume.

Resume: every step ends with a checkpoint holding the store cursor of the last group it consumed
and the ids of groups requested but not consumed. A restarted loop loads the newest checkpoint,
pushes its weights to inference again (idempotent per version), and reads groups after the
cursor, so no step is repeated or skipped and no consumed group is trained on twice.

Stalls: while the loop waits for groups, every ``LoopDeps.stall_check_s`` without one it checks
the services it depends on (:meth:`TrainingLoop._recover`): inference serving an older policy
version than the trainer's (it restarted) gets the latest checkpoint again, and every request
with groups still pending is sent again under its key — the orchestrator answers a request it
holds with the same groups, and one it lost (it restarted) with new groups, which replace them
(``groups/resubmitted``). So no pending group outlives a restart of the orchestrator or inference.
A mid-run evaluation waits the same way; its lost groups are asked again for their own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog

from openforge_core.errors import FailedPrecondition
from openforge_core.run_config import RunConfig
from openforge_core.seeds import EVAL_SEED_KEY, request_seed
from openforge_trainer.domain.ports import (
    Checkpoint,
    CheckpointStore,
    GroupSource,
    MetricsSink,
    RolloutRequest,
    RolloutSubmitter,
    WeightSync,
)
from openforge_trainer.domain.samples import (
    EXCLUSION_REASONS,
    ROLES,
    CompletedGroup,
    ExcludedRollout,
    TrainBatch,
    TrainSample,
    filter_stale,
    group_metrics,
    is_zero_variance,
    role_metrics,
    select_for_sft,
    shuffle_rewards,
)
from openforge_trainer.domain.state import TrainerState

if TYPE_CHECKING:
    from openforge_trainer.backends.base import TrainerBackend

log = structlog.get_logger(__name__)

#: Consecutive completed groups without a single sample after which a run fails instead of asking
#: for more: every rollout ended before its first model call, which retrying cannot fix (a harness
#: that crashes at start, a sandbox that cannot start, a proxy the harness cannot reach).
MAX_EMPTY_GROUPS_IN_A_ROW = 16

#: Cancel reason of the rollouts of a group the run requested but no longer needs (it completed).
UNNEEDED_REASON = "the run completed before the rollout's group was needed"

BackendFactory = Callable[[RunConfig], "TrainerBackend"]


class StopRequested(Exception):
    """The run was asked to stop while waiting; the step in progress is abandoned uncommitted."""


class GroupPlace(NamedTuple):
    """A group's place in the run, independent of when it completed; tuples sort a step's
    requests before its refills, then by kind and number (``step/3``), then by position in the
    request; a group of no known request sorts last, by id.

    Attributes:
        rank: 0 for a step's request, 1 for any other (a refill), 2 for no known request.
        kind: The request key's kind (``step``, ``refill``).
        number: The request key's number.
        position: The group's position in its request.
        group_id: Only for a group of no known request ("" otherwise).
    """

    rank: int
    kind: str
    number: int
    position: int
    group_id: str = ""

    @property
    def label(self) -> str:
        """``step/3#1`` (the group id for a group of no known request)."""
        return f"{self.kind}/{self.number}#{self.position}{self.group_id}"


@dataclass
class _Collected:
    """What one step took from the store.

    Attributes:
        cursor: Store cursor of the last group consumed.
        pending: Group ids requested and still not consumed.
        groups: Groups trained on.
        kept: Their samples within the staleness bound (the batch), grouped by group.
        staleness: Staleness of each kept sample (policy versions).
        dropped: Samples dropped as stale.
        excluded: Rollouts without a reward of every group consumed.
        candidates: Groups consumed with at least one usable sample holding a sampled token.
        zero_variance: Of the candidates, groups whose rollouts all have the same reward (RL).
        zero_variance_dropped: Zero-variance groups consumed and not trained on.
        resubmitted: Groups requested again because the orchestrator had lost them.
        skipped_roles: Samples left out by the run's role policy (``RunConfig.roles``), by role.
    """

    cursor: str
    pending: set[str]
    groups: list[CompletedGroup] = field(default_factory=list)
    kept: list[TrainSample] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    dropped: list[TrainSample] = field(default_factory=list)
    excluded: list[ExcludedRollout] = field(default_factory=list)
    candidates: int = 0
    zero_variance: int = 0
    zero_variance_dropped: int = 0
    resubmitted: int = 0
    skipped_roles: dict[str, int] = field(default_factory=dict)

    def take(self, group: CompletedGroup, usable: list[TrainSample], ages: list[int]) -> None:
        """Trains on ``group``: its usable samples and their staleness."""
        self.groups.append(group)
        self.kept.extend(usable)
        self.staleness.extend(ages)

    def metrics(self, rl: bool) -> dict[str, float]:
        """``rollouts/trained``, ``rollouts/excluded(/<reason>)``, ``groups/resubmitted`` and, in RL,
        ``groups/zero_variance_fraction`` and ``groups/zero_variance_dropped``."""
        out = {
            "rollouts/trained": float(len({s.rollout_id for s in self.kept})),
            "rollouts/excluded": float(len(self.excluded)),
            "groups/resubmitted": float(self.resubmitted),
        }
        for reason in EXCLUSION_REASONS:
            out[f"rollouts/excluded/{reason}"] = float(sum(1 for x in self.excluded if x.reason == reason))
        if rl:
            out["groups/zero_variance_fraction"] = self.zero_variance / self.candidates if self.candidates else 0.0
            out["groups/zero_variance_dropped"] = float(self.zero_variance_dropped)
        return out


@dataclass
class LoopDeps:
    """The loop's collaborators (built by the composition root).

    Attributes:
        backend_factory: Builds the run's backend.
        submitter: The orchestrator.
        groups: The store's completed groups.
        weights: The inference service.
        checkpoints: Checkpoint storage.
        sinks: Where step metrics go.
        stall_check_s: Seconds without a completed group after which the loop checks that
            inference serves its policy version and the orchestrator holds its pending groups
            (0 = never).
    """

    backend_factory: BackendFactory
    submitter: RolloutSubmitter
    groups: GroupSource
    weights: WeightSync
    checkpoints: CheckpointStore
    sinks: list[MetricsSink] = field(default_factory=list)
    stall_check_s: float = 30.0


def eval_run_id(run_id: str) -> str:
    """Run id under which a run's evaluation rollouts are recorded."""
    return f"{run_id}-eval"


def pick_tasks(tasks: list[str], n: int, seed: int, key: str) -> tuple[str, ...]:
    """``n`` task ids drawn deterministically from (seed, key): a shuffled pass over ``tasks``,
    repeated when ``n`` exceeds their number (the same key always gives the same tasks)."""
    rng = random.Random(f"{seed}:{key}")
    out: list[str] = []
    while len(out) < n:
        order = list(tasks)
        rng.shuffle(order)
        out.extend(order[: n - len(out)])
    return tuple(out)


class _Feed:
    """Pulls completed groups one at a time, abandoning the wait when the run stops."""

    def __init__(self, stream: AsyncIterator[CompletedGroup], stop: asyncio.Event) -> None:
        self._stream = stream
        self._stop = stop
        self._next: asyncio.Future[CompletedGroup] | None = None

    async def next(self) -> CompletedGroup:
        """The next completed group.

        Raises:
            StopRequested: The run was asked to stop.
        """
        group = await self.next_within(None)
        assert group is not None  # without a timeout the wait ends with a group or a stop
        return group

    async def next_within(self, timeout_s: float | None) -> CompletedGroup | None:
        """The next completed group; None when ``timeout_s`` passed first (the wait goes on at
        the next call: the stream is not interrupted).

        Raises:
            StopRequested: The run was asked to stop.
        """
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self._stream))
        nxt = self._next
        stopper = asyncio.ensure_future(self._stop.wait())
        waiters: set[asyncio.Future[Any]] = {nxt, stopper}
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if nxt in done:
            self._next = None
            return nxt.result()
        if not done:
            return None
        await self._cancel_next()
        raise StopRequested

    async def _cancel_next(self) -> None:
        nxt, self._next = self._next, None
        if nxt is None:
            return
        nxt.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await nxt  # let the generator leave its await before it is closed

    async def close(self) -> None:
        await self._cancel_next()
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


class TrainingLoop:
    """Runs one run to its step count, or until ``stop`` is set.

    Args:
        run_id: The run.
        config: Its validated config.
        deps: Collaborators.
        on_progress: Called after every step with (step, policy_version, checkpoint path).
        on_metrics: Called with (step, metrics, time) after every step (for WatchMetrics).
    """

    def __init__(
        self,
        run_id: str,
        config: RunConfig,
        deps: LoopDeps,
        *,
        on_progress: Callable[[int, int, str], None] | None = None,
        on_metrics: Callable[[int, dict[str, float], float], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.config = config
        self.deps = deps
        self._on_progress = on_progress or (lambda step, version, uri: None)
        self._on_metrics = on_metrics or (lambda step, metrics, t: None)
        self.state = TrainerState()
        self._backend: TrainerBackend | None = None
        self._empty_groups_in_a_row = 0

    @property
    def _sft_offline(self) -> bool:
        return self.config.mode == "sft" and bool(self.config.sft.source_run_id)

    async def run(self, stop: asyncio.Event) -> bool:
        """Trains until the step count is reached (returns True) or ``stop`` is set (False).

        Raises:
            Exception: Whatever a collaborator raised; the last checkpoint stays resumable.
        """
        cfg = self.config
        latest = await asyncio.to_thread(self.deps.checkpoints.latest, self.run_id)
        if latest is not None:
            self.state = latest.state
        backend = await asyncio.to_thread(self.deps.backend_factory, cfg)
        self._backend = backend
        try:
            await asyncio.to_thread(backend.load, Path(cfg.model), latest.path if latest else None)
            if latest is not None:
                log.info("run.resumed", run_id=self.run_id, step=self.state.step, cursor=self.state.cursor)
                await self._sync_weights(latest)
            source = cfg.sft.source_run_id if self._sft_offline else self.run_id
            feed = _Feed(self.deps.groups.watch(source, self.state.cursor), stop)
            try:
                while self.state.step < cfg.steps:
                    if stop.is_set():
                        return False
                    try:
                        await self._step(feed, stop)
                    except StopRequested:
                        return False
            finally:
                await feed.close()
            await self._cancel_unneeded()
            return True
        finally:
            await asyncio.to_thread(backend.close)
            self._backend = None

    async def _step(self, feed: _Feed, stop: asyncio.Event) -> None:
        cfg, st = self.config, self.state
        assert self._backend is not None
        t0 = time.perf_counter()
        await self._submit_ahead()
        got = await self._collect(feed)
        groups, kept, dropped, staleness = got.groups, got.kept, got.dropped, got.staleness
        t1 = time.perf_counter()
        batch = TrainBatch(tuple(kept), st.policy_version)
        train = self._backend.train_sft if cfg.mode == "sft" else self._backend.train_rl
        metrics = await asyncio.to_thread(train, batch)
        t2 = time.perf_counter()
        new_state = TrainerState(
            step=st.step + 1,
            policy_version=st.policy_version + 1,
            cursor=got.cursor,
            submitted_steps=st.submitted_steps,
            refills=st.refills,
            pending_groups=sorted(got.pending),
            requests={key: ids for key, ids in st.requests.items() if got.pending.intersection(ids)},
            samples_dropped_total=st.samples_dropped_total + len(dropped),
            tokens_total=st.tokens_total + batch.num_tokens,
            eval_cursor=st.eval_cursor,
        )
        save = self._backend.save_checkpoint
        ckpt = await asyncio.to_thread(self.deps.checkpoints.write, self.run_id, new_state, save)
        self.state = new_state
        t3 = time.perf_counter()
        await self._sync_weights(ckpt)
        t4 = time.perf_counter()
        metrics.update(group_metrics(groups, pass_threshold=cfg.pass_threshold, pass_k=cfg.pass_k))
        metrics.update(got.metrics(rl=cfg.mode == "rl"))
        metrics.update(role_metrics(kept))
        metrics.update({f"samples/skipped_role/{r}": float(got.skipped_roles.get(r, 0)) for r in ROLES})
        metrics.update(
            {
                "policy_version": float(new_state.policy_version),
                "samples/trained": float(len(kept)),
                "samples/dropped": float(len(dropped)),
                "samples/dropped_total": float(new_state.samples_dropped_total),
                "groups/trained": float(len(groups)),
                "staleness/mean": statistics.fmean(staleness) if staleness else 0.0,
                "staleness/max": float(max(staleness, default=0)),
                "time/wait_rollouts_s": t1 - t0,
                "time/train_s": t2 - t1,
                "time/checkpoint_s": t3 - t2,
                "time/weight_sync_s": t4 - t3,
                "time/step_s": t4 - t0,
                "tokens/per_s_step": batch.num_tokens / (t4 - t0) if t4 > t0 else 0.0,
            }
        )
        if cfg.eval_interval and cfg.eval_tasks and new_state.step % cfg.eval_interval == 0:
            te = time.perf_counter()
            metrics.update(await self._evaluate(feed_stop=stop))
            metrics["time/eval_s"] = time.perf_counter() - te
        await self._emit(new_state.step, metrics)
        self._on_progress(new_state.step, new_state.policy_version, str(ckpt.path))
        log.info(
            "run.step_completed",
            run_id=self.run_id,
            step=new_state.step,
            version=new_state.policy_version,
            reward_mean=metrics.get("reward/mean"),
            dropped=len(dropped),
            excluded=len(got.excluded),
        )

    async def _emit(self, step: int, metrics: dict[str, float]) -> None:
        """Writes a step's metrics to the sinks (the store's event among them), then tells the
        watchers: a step a client saw is recorded."""
        now = time.time()
        for sink in self.deps.sinks:
            await sink.write(self.run_id, step, metrics, now)
        self._on_metrics(step, metrics, now)

    async def _sync_weights(self, ckpt: Checkpoint) -> None:
        version = ckpt.state.policy_version
        if version == 0:
            return
        serving = await self.deps.weights.update_weights(
            f"{self.run_id}/weights/{version}", str(ckpt.path), version, ckpt.checksum
        )
        log.info("run.weights_synced", run_id=self.run_id, version=version, serving=serving)

    # ---- rollouts ----

    def _request(
        self,
        key: str,
        n: int,
        *,
        run_id: str = "",
        task_set: str = "",
        tasks: list[str] | None = None,
        seed_key: str = "",
    ) -> RolloutRequest:
        """The submission of ``n`` groups under ``key``; its sampling seed is derived from the run
        seed and ``seed_key`` (default ``key``), so a key requested again samples the same."""
        cfg = self.config
        return RolloutRequest(
            request_id=f"{self.run_id}/{key}",
            run_id=run_id or self.run_id,
            task_set=task_set or cfg.task_split,
            task_ids=pick_tasks(tasks or cfg.tasks, n, cfg.seed, key),
            group_size=cfg.group_size,
            harness=cfg.harness,
            model_name=cfg.model_name,
            min_policy_version=self.state.policy_version,
            timeout_s=cfg.rollout_timeout_s,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            max_turns=cfg.max_turns,
            max_total_tokens=cfg.max_total_tokens,
            command=tuple(cfg.command),
            seed=request_seed(cfg.seed, seed_key or key) if cfg.seeded_sampling else None,
        )

    async def _submit_ahead(self) -> None:
        """Requests the groups of every step up to ``step + 1 + max_staleness`` not yet requested."""
        if self._sft_offline:
            return
        st, cfg = self.state, self.config
        horizon = min(cfg.steps, st.step + 1 + cfg.max_staleness)
        while st.submitted_steps < horizon:
            nxt = st.submitted_steps + 1
            key = f"step/{nxt}"
            ids = await self.deps.submitter.submit(self._request(key, cfg.groups_per_step))
            st.pending_groups = sorted(set(st.pending_groups) | set(ids))
            st.requests[key] = ids
            st.submitted_steps = nxt

    async def _refill(self, missing: int) -> None:
        st = self.state
        st.refills += 1
        key = f"refill/{st.refills}"
        ids = await self.deps.submitter.submit(self._request(key, missing))
        st.pending_groups = sorted(set(st.pending_groups) | set(ids))
        st.requests[key] = ids
        log.info("run.groups_refilled", run_id=self.run_id, groups=missing, refill=st.refills)

    async def _cancel_unneeded(self) -> None:
        """Cancels the groups still pending once the run completed (see the module docstring).
        Never raises: a group left running only costs the orchestrator time."""
        leftover = list(self.state.pending_groups)
        if not leftover:
            return
        results = await asyncio.gather(
            *(self.deps.submitter.cancel_group(g, UNNEEDED_REASON) for g in leftover), return_exceptions=True
        )
        failed = {g: repr(r) for g, r in zip(leftover, results, strict=True) if isinstance(r, BaseException)}
        log.info("run.unneeded_groups_cancelled", run_id=self.run_id, groups=len(leftover) - len(failed))
        if failed:
            log.warning("run.unneeded_groups_not_cancelled", run_id=self.run_id, errors=failed)

    async def _check_serving(self) -> None:
        """Pushes the latest checkpoint again when inference serves an older policy version (it
        restarted). Never raises: a service still restarting is checked again next time."""
        st = self.state
        try:
            serving = await self.deps.weights.serving_version()
            if serving < st.policy_version:
                latest = await asyncio.to_thread(self.deps.checkpoints.latest, self.run_id)
                if latest is not None:
                    log.warning(
                        "run.weights_pushed_again", run_id=self.run_id, serving=serving, version=st.policy_version
                    )
                    await self._sync_weights(latest)
        except Exception as exc:
            log.warning("run.stall_check_failed", run_id=self.run_id, service="inference", error=repr(exc))

    async def _recover(self, pending: set[str]) -> int:
        """Checks, after a stall, that inference and the orchestrator still hold what the run
        waits for (see the module docstring); updates ``pending`` in place.

        Returns:
            Groups requested again because the orchestrator had lost them.
        """
        st = self.state
        await self._check_serving()
        replaced = 0
        for key, ids in list(st.requests.items()):
            still = sorted(pending.intersection(ids))
            if not still:
                del st.requests[key]  # every group of it was consumed
                continue
            # as many groups as are still pending: an orchestrator holding the request answers
            # with all of its groups whatever the count; one that lost it makes only these anew
            try:
                # a seed of its own: the groups made anew must not repeat ones already trained on
                again = await self.deps.submitter.submit(
                    self._request(key, len(still), seed_key=f"{key}/again/{still[0]}")
                )
            except Exception as exc:
                log.warning("run.stall_check_failed", run_id=self.run_id, service="orchestrator", error=repr(exc))
                break
            if set(again) == set(ids):
                continue
            pending.difference_update(ids)
            pending.update(again)
            st.requests[key] = again
            replaced += len(again)
            log.warning("run.groups_resubmitted", run_id=self.run_id, request=key, lost=still, groups=again)
        st.pending_groups = sorted(pending)
        return replaced

    async def _collect(self, feed: _Feed) -> _Collected:
        """Completed groups until ``groups_per_step`` have trainable samples.

        A group is trainable when one of its samples within the staleness bound holds a sampled
        token. In RL, a trainable group whose rollouts all earned the same reward
        (:func:`~openforge_trainer.domain.samples.is_zero_variance`) is counted; with
        ``drop_zero_variance_groups`` it is set aside instead of trained on, and the refill asks
        for another group in its place. After ``max_zero_variance_refills`` groups were set
        aside in this step, the next zero-variance group ends the collection: the step trains on
        the groups it has, or, when it has none, on the latest of the zero-variance groups set
        aside (at most ``groups_per_step``; all their GRPO/RLOO advantages are 0), so a step never waits for more than
        ``groups_per_step + max_zero_variance_refills`` trainable groups.
        """
        cfg, st = self.config, self.state
        got = _Collected(cursor=st.cursor, pending=set(st.pending_groups))
        pending = got.pending
        set_aside: list[tuple[CompletedGroup, list[TrainSample], list[int]]] = []
        taken: list[tuple[GroupPlace, CompletedGroup, list[TrainSample], list[int]]] = []
        while len(taken) < cfg.groups_per_step:
            missing = cfg.groups_per_step - len(taken)
            if not self._sft_offline and len(pending) < missing:
                st.pending_groups = sorted(pending)
                await self._refill(missing - len(pending))
                pending |= set(st.pending_groups)
            group = await feed.next_within(self.deps.stall_check_s or None)
            if group is None:  # no group for a while: are the groups waited for still coming?
                if not self._sft_offline:
                    got.resubmitted += await self._recover(pending)
                continue
            got.cursor = group.cursor
            pending.discard(group.group_id)
            self._check_not_all_empty(group)
            got.excluded.extend(group.excluded)
            candidates: list[TrainSample] = [s for s in group.samples if cfg.roles.trains(s.role)]
            for s in group.samples:
                if not cfg.roles.trains(s.role):
                    got.skipped_roles[s.role] = got.skipped_roles.get(s.role, 0) + 1
            if cfg.mode == "sft":
                candidates = select_for_sft(candidates, cfg.sft.min_reward)
            if self._sft_offline:
                usable, old, ages = candidates, [], [0] * len(candidates)
            else:
                report = filter_stale(candidates, st.policy_version, cfg.max_staleness)
                usable, old, ages = report.kept, report.dropped, report.staleness
            got.dropped.extend(old)
            if old:
                log.info("run.samples_dropped", run_id=self.run_id, group_id=group.group_id, samples=len(old))
            if not any(s.sampled_tokens for s in usable):
                continue
            got.candidates += 1
            if cfg.mode == "rl" and is_zero_variance(usable):
                got.zero_variance += 1
                if cfg.drop_zero_variance_groups:
                    set_aside.append((group, usable, ages))
                    if len(set_aside) > cfg.max_zero_variance_refills:
                        break
                    log.info("run.zero_variance_group_dropped", run_id=self.run_id, group_id=group.group_id)
                    continue
            place = self._group_place(group.group_id)
            if cfg.mode == "rl" and cfg.shuffle_rewards:
                usable = shuffle_rewards(usable, random.Random(f"{cfg.seed}:{place.label}"))
            taken.append((place, group, usable, ages))
        fallback = not taken
        if fallback:
            taken = [(self._group_place(g.group_id), g, u, a) for g, u, a in set_aside[-cfg.groups_per_step :]]
        # the batch in request order, not completion order: the same groups train the same
        for _, group, usable, ages in sorted(taken, key=lambda t: t[0]):
            got.take(group, usable, ages)
        got.zero_variance_dropped = len(set_aside) - (len(taken) if fallback else 0)
        st.pending_groups = sorted(pending)
        return got

    def _group_place(self, group_id: str) -> GroupPlace:
        """A group's :class:`GroupPlace`, from the request that asked for it."""
        for key, ids in self.state.requests.items():
            if group_id in ids:
                kind, _, number = key.partition("/")
                rank = 0 if kind == "step" else 1
                return GroupPlace(rank, kind, int(number) if number.isdigit() else 0, ids.index(group_id))
        return GroupPlace(2, "", 0, 0, group_id)

    def _check_not_all_empty(self, group: CompletedGroup) -> None:
        """Counts groups that ended without a trainable sample (no sample at all, or only samples
        of rollouts without a verifier reward); fails the run after too many in a row.

        Raises:
            FailedPrecondition: ``MAX_EMPTY_GROUPS_IN_A_ROW`` groups in a row had no trainable
                sample (reason ``ROLLOUTS_PRODUCE_NO_SAMPLES``); the message gives the last
                group's exclusion reasons; each rollout's failure reason is in the
                orchestrator's GetRollout / the store.
        """
        if group.samples:
            self._empty_groups_in_a_row = 0
            return
        self._empty_groups_in_a_row += 1
        log.warning("run.group_without_samples", run_id=self.run_id, group_id=group.group_id, task_id=group.task_id)
        if self._empty_groups_in_a_row >= MAX_EMPTY_GROUPS_IN_A_ROW:
            why = (
                "the rollouts fail before their first model call"
                if not group.has_samples
                else "no rollout earns a verifier reward (excluded: "
                + ", ".join(sorted({e.reason for e in group.excluded}))
                + ")"
            )
            raise FailedPrecondition(
                f"{self._empty_groups_in_a_row} groups in a row ended without a trainable sample (last: "
                f"{group.group_id}, task {group.task_id}): {why}; "
                "see their failure_reason (orchestrator GetRollout, or the dashboard)",
                reason="ROLLOUTS_PRODUCE_NO_SAMPLES",
            )

    # ---- evaluation ----

    async def _evaluate(self, feed_stop: asyncio.Event) -> dict[str, float]:
        """Runs one group per eval task at the current policy and waits for all of them (with the
        stall checks of the training groups: :meth:`_check_serving`, :meth:`_eval_again`)."""
        cfg, st = self.config, self.state
        run = eval_run_id(self.run_id)
        # one seed for every evaluation: each task's rollouts sample with the same seeds at every
        # step, so the evaluations compare policies, not draws
        request = self._request(
            f"eval/{st.step}",
            len(cfg.eval_tasks),
            run_id=run,
            task_set=cfg.eval_split,
            tasks=cfg.eval_tasks,
            seed_key=EVAL_SEED_KEY,
        )
        request = replace(request, task_ids=tuple(cfg.eval_tasks))
        ids = await self.deps.submitter.submit(request)
        task_of = dict(zip(ids, request.task_ids, strict=True))
        waiting = set(ids)
        feed = _Feed(self.deps.groups.watch(run, st.eval_cursor), feed_stop)
        groups: list[CompletedGroup] = []
        try:
            while waiting:
                group = await feed.next_within(self.deps.stall_check_s or None)
                if group is None:  # no group for a while: is the evaluation still running?
                    await self._check_serving()
                    waiting = await self._eval_again(request, waiting, task_of)
                    continue
                st.eval_cursor = group.cursor
                if group.group_id in waiting:
                    waiting.discard(group.group_id)
                    groups.append(group)
        finally:
            await feed.close()
        return group_metrics(groups, pass_threshold=cfg.pass_threshold, pass_k=cfg.pass_k, prefix="eval/")

    async def _eval_again(self, request: RolloutRequest, waiting: set[str], task_of: dict[str, str]) -> set[str]:
        """The evaluation groups to wait for after asking the orchestrator again for the tasks of
        ``waiting`` under the evaluation's request id: one that holds the request answers with its
        groups (unchanged), one that lost it (it restarted) makes new groups for just those tasks.
        ``task_of`` gains the new groups' tasks. Never raises (checked again next time)."""
        tasks = tuple(task_of[g] for g in sorted(waiting))
        try:
            again = await self.deps.submitter.submit(replace(request, task_ids=tasks))
        except Exception as exc:
            log.warning("run.stall_check_failed", run_id=self.run_id, service="orchestrator", error=repr(exc))
            return waiting
        if waiting <= set(again):
            return waiting
        task_of.update(zip(again, tasks, strict=True))
        log.warning("run.eval_groups_resubmitted", run_id=self.run_id, lost=sorted(waiting), groups=again)
        return set(again)
