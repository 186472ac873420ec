"""``scripted-oracle``: a scripted engine that replays each task's oracle solution (not a model).

It records demonstrations through the very same path a policy's rollouts take (harness →
proxy → inference → store → samples), for a warm start by SFT: the harness talks to the proxy,
the proxy renders the prompt with the served model's chat template and asks this engine, and
this engine answers with the *scripted* completion of the task it recognises in the prompt:

1. the task is the one whose ``instruction.md`` text (stripped) appears in the decoded prompt,
   searched in every task folder under ``tasks_root`` (``<root>/<task_set>/<task_id>/``,
   Harbor's layout, with the oracle in ``solution/solve.sh``);
2. the turn is the number of tool results the prompt already holds (``<tool_response>`` in the
   Hermes/Qwen templates the tiny model and the proxy use);
3. turn 0 answers with one tool call running the whole ``solve.sh`` (``bash -c '<script>'``),
   then, for mini-swe-agent, its submit command (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``),
   then a short final text (which ends a Claude Code, Codex or OpenClaw run). A ``solve.sh``
   whose second line is :data:`ONE_CALL_PER_LINE` is replayed one command line per turn instead
   (its ``set`` and ``cd`` lines excepted: the harness already runs in the working folder): a
   multi-turn demonstration whose later calls follow the tool results before them.

The tool call goes to the harness's own shell tool, the first of :data:`SHELL_TOOLS` the
prompt's ``<tools>`` block offers (mini-swe-agent's ``bash`` when none is): e.g.
``{"name": "bash", "arguments": {"command": ...}}`` in Hermes ``<tool_call>`` tags. The
completion is tokenized with the served model's ``tokenizer.json`` and ends with the first EOS
id, so the samples train the model to emit exactly this text. Every token reports
logprob 0.0 (the scripted policy is deterministic: probability 1) and the serving policy version.

Weight updates are validated like the real engines do (URI, tensor names and shapes, checksum)
and then only advance the policy version: the scripted answers never change. A prompt in which
no task is recognised gets a short apology text (the rollout then earns what its verifier says).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import math
import random
import re
import shlex
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final, get_args

import structlog

from openforge_inference.engines._common import StaticModel, WeightState, describe_model
from openforge_inference.engines.base import (
    DuplicateRequest,
    EngineConfig,
    EngineUnavailable,
    FinishReason,
    GenerateDelta,
    GenerateRequest,
    ModelInfo,
    PolicyVersionTooOld,
    ScriptedErrorKind,
    TokenUsage,
    validate_request,
)
from openforge_inference.model_files import resolve_checkpoint_uri, validate_checkpoint

__all__ = [
    "ERROR_KINDS",
    "ONE_CALL_PER_LINE",
    "SHELL_TOOLS",
    "SUBMIT_COMMAND",
    "ErrorDraws",
    "OraclePlans",
    "ScriptedOracleEngine",
    "ShellTool",
    "oracle_completion",
    "oracle_steps",
    "shell_tool",
]

_log = structlog.get_logger()

_ENGINE_NAME: Final = "scripted-oracle"
#: mini-swe-agent ends a run when a command prints this.
SUBMIT_COMMAND: Final = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: Second line of a ``solve.sh`` replayed one command line per model call (written by
#: ``openforge tasks lines``, ``openforge_cli.task_family``).
ONE_CALL_PER_LINE: Final = "# oracle: one model call per line"
_TOOL_RESULT: Final = "<tool_response>"
_UNKNOWN: Final = "I do not recognise this task."
_DONE: Final = "Done."
_CALL_BLOCK: Final = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_TOOLS_BLOCK: Final = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
#: A command's trailing redirection of its output into a file (``... > answer.txt``).
_REDIRECT: Final = re.compile(r"\s*>\s*[^\s>|;&]+\s*$")
#: The imperfect demonstrator's kinds of error (``error_kind`` of :func:`oracle_completion`).
ERROR_KINDS: Final[tuple[ScriptedErrorKind, ...]] = get_args(ScriptedErrorKind)


def unwritten(command: str) -> str:
    """``command`` without its trailing redirection into a file (``wc -l < f > answer.txt`` ->
    ``wc -l < f``: the answer is printed, not written); unchanged when it has none."""
    return _REDIRECT.sub("", command)


class ErrorDraws:
    """The imperfect demonstrator's draws, stratified per key (the command that may be wrong).

    Of the first ``n`` draws of one key, ``floor(n * rate + u)`` are errors, with ``u`` uniform
    in [0, 1) per key (seeded): every command is demonstrated wrongly at the error rate, within
    one demonstration, where independent draws add binomial noise that decides what the warm
    start leaves to learn (six demonstrations of a command at rate 0.5 are all right or all
    wrong 3% of the time, five or six of one sort 22%; a command never demonstrated right is
    never sampled right, and its GRPO groups have no reward variance). Systematic sampling,
    Cochran, "Sampling Techniques" (1977), ch. 8.

    Args:
        rate: Probability of an error, in [0, 1].
        seed: Seeds the per-key offsets and :meth:`choice`.

    Raises:
        ValueError: ``rate`` outside [0, 1].
    """

    def __init__(self, rate: float, seed: int | str) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"error rate {rate} is not in [0, 1]")
        self.rate = rate
        self._seed = seed
        self._counts: dict[str, int] = {}
        self._offsets: dict[str, float] = {}
        self._rng = random.Random(f"scripted-oracle:{seed}")

    def draw(self, key: str) -> bool:
        """Whether the next use of ``key`` is an error."""
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        u = self._offsets.get(key)
        if u is None:
            u = self._offsets[key] = random.Random(f"scripted-oracle:{self._seed}:{key}").random()
        return math.floor((n + 1) * self.rate + u) > math.floor(n * self.rate + u)

    def choice(self, options: list[tuple[str, ...]]) -> tuple[str, ...]:
        """One of ``options``, uniformly (seeded)."""
        return self._rng.choice(options)


@dataclasses.dataclass(frozen=True)
class ShellTool:
    """A harness's tool that runs a shell command.

    Attributes:
        name: The tool's name as the harness offers it.
        argument: The argument holding the command.
        submit: A command that ends the harness's run (mini-swe-agent's), issued after the
            task's commands; None where a text answer ends it.
        extra: Further arguments every call carries.
    """

    name: str
    argument: str = "command"
    submit: str | None = None
    extra: tuple[tuple[str, str], ...] = ()

    def call(self, command: str, step: int) -> str:
        """A Hermes completion calling this tool with ``command`` (``step``: 1-based turn)."""
        body = json.dumps({"name": self.name, "arguments": {self.argument: command, **dict(self.extra)}})
        return f"Step {step}.\n<tool_call>\n{body}\n</tool_call>"


#: The shell tools of the supported harnesses, in order of preference (names and arguments as the
#: pinned CLIs offer them, ``shared/reference/harness-protocols.md`` and the captures): the first
#: one a prompt offers is used, the first (mini-swe-agent 2.4.6's) when the prompt offers none.
SHELL_TOOLS: Final = (
    ShellTool("bash", submit=SUBMIT_COMMAND),  # mini-swe-agent 2.4.6
    ShellTool("Bash", extra=(("description", "Run the step"),)),  # Claude Code 2.1.332
    ShellTool("exec_command", argument="cmd"),  # Codex 0.171.0 (its code mode off)
    ShellTool("exec"),  # OpenClaw 2026.9.6
)


def offered_tools(prompt_text: str) -> list[str]:
    """The tool names in a decoded prompt's ``<tools>`` block (the Hermes/Qwen templates render
    one JSON tool per line, ``{"type": "function", "function": {"name": ...}}``), in order."""
    names: list[str] = []
    for block in _TOOLS_BLOCK.finditer(prompt_text):
        for line in block.group(1).splitlines():
            try:
                tool = json.loads(line)
            except ValueError:
                continue
            spec = tool.get("function", tool) if isinstance(tool, dict) else None
            name = spec.get("name") if isinstance(spec, dict) else None
            if isinstance(name, str):
                names.append(name)
    return names


def shell_tool(prompt_text: str) -> ShellTool:
    """The first of :data:`SHELL_TOOLS` the prompt offers; :data:`SHELL_TOOLS` [0] when none is."""
    offered = set(offered_tools(prompt_text))
    return next((t for t in SHELL_TOOLS if t.name in offered), SHELL_TOOLS[0])


def oracle_steps(script: str) -> tuple[str, ...]:
    """The commands of a ``solve.sh``, one per model call: the whole script as one
    ``bash -c`` command, or each command line when its second line is :data:`ONE_CALL_PER_LINE`
    (blank and comment lines skipped, and the ``set``/``cd`` lines before the first command:
    the harness already runs in the working folder).

    Raises:
        ValueError: A marked script with no command line.
    """
    lines = script.splitlines()
    if len(lines) < 2 or lines[1].strip() != ONE_CALL_PER_LINE:
        return ("bash -c " + shlex.quote(script),)
    commands = [s for line in lines if (s := line.strip()) and not s.startswith("#")]
    while commands and commands[0].startswith(("set ", "cd ")):
        commands.pop(0)
    if not commands:
        raise ValueError("a one-call-per-line solve.sh holds no command")
    return tuple(commands)


class OraclePlans:
    """Per task instruction, the commands that solve it (the oracle ``solve.sh``).

    Args:
        tasks_root: Folder of task sets (``<root>/<set>/<id>/instruction.md`` and
            ``solution/solve.sh``); tasks without a ``solve.sh`` are skipped.

    Raises:
        EngineUnavailable: ``tasks_root`` is not a folder or holds no task with an oracle.
    """

    def __init__(self, tasks_root: Path) -> None:
        if not tasks_root.is_dir():
            raise EngineUnavailable(f"scripted-oracle: tasks root {tasks_root} is not a folder")
        self.commands: dict[str, tuple[str, ...]] = {}
        for instruction in sorted(tasks_root.glob("*/*/instruction.md")):
            solve = instruction.parent / "solution" / "solve.sh"
            text = instruction.read_text(encoding="utf-8").strip()
            if solve.is_file() and text:
                try:
                    self.commands[text] = oracle_steps(solve.read_text(encoding="utf-8"))
                except ValueError as exc:
                    raise EngineUnavailable(f"scripted-oracle: {solve}: {exc}") from exc
        if not self.commands:
            raise EngineUnavailable(f"scripted-oracle: no task with solution/solve.sh under {tasks_root}")
        # Longest first, so an instruction that contains another one wins.
        self._order = sorted(self.commands, key=len, reverse=True)

    def other_plans(self, commands: tuple[str, ...]) -> list[tuple[str, ...]]:
        """One plan per first command other than ``commands[0]`` (the first task's in
        instruction order), sorted by that command."""
        firsts: dict[str, tuple[str, ...]] = {}
        for text in sorted(self.commands):
            plan = self.commands[text]
            if plan[0] != commands[0]:
                firsts.setdefault(plan[0], plan)
        return [firsts[c] for c in sorted(firsts)]

    def plan_starting(self, command: str) -> tuple[str, ...] | None:
        """The first plan (in instruction order) whose first command is ``command``, or None."""
        return next((self.commands[t] for t in sorted(self.commands) if self.commands[t][0] == command), None)

    def find(self, prompt_text: str) -> tuple[str, ...] | None:
        """The oracle commands of the task whose instruction appears in ``prompt_text``, or None."""
        for instruction in self._order:
            if instruction in prompt_text:
                return self.commands[instruction]
        return None


def issued_commands(prompt_text: str, argument: str = "command") -> list[str]:
    """The ``argument`` arguments (the command) of the Hermes ``<tool_call>`` blocks in a decoded
    prompt, in order (blocks that are not JSON with one, such as a template's format example,
    skipped)."""
    out: list[str] = []
    for match in _CALL_BLOCK.finditer(prompt_text):
        try:
            command = json.loads(match.group(1))["arguments"][argument]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(command, str):
            out.append(command)
    return out


def oracle_completion(
    plans: OraclePlans,
    prompt_text: str,
    *,
    errors: ErrorDraws | None = None,
    error_kind: str = "plan",
) -> str:
    """The scripted completion for a decoded prompt (see the module docstring for the rules).

    Args:
        plans: The oracle commands by instruction.
        prompt_text: The rendered prompt, decoded with special tokens kept.
        errors: The imperfect demonstrator's error draws (None: always right), keyed by the
            task's first command (``plan``) or by the command that may be issued wrongly
            (``unwritten``).
        error_kind: Which error (:data:`ERROR_KINDS`). ``plan``: a conversation's first call
            follows another task's plan (one whose first command differs, drawn uniformly among
            those first commands) and later calls continue the plan the first one followed.
            ``unwritten``: a command that ends by redirecting its output into a file is issued
            without that redirection (:func:`unwritten`: the answer is printed, never saved),
            drawn per such command; the plan stays the task's own.

    Returns:
        Hermes-format text: one ``<tool_call>`` of the harness's shell tool (one per oracle step,
        then mini-swe-agent's submit) or plain text.

    Raises:
        ValueError: An unknown ``error_kind``.
    """
    if error_kind not in ERROR_KINDS:
        raise ValueError(f"unknown error kind {error_kind!r} (one of {', '.join(ERROR_KINDS)})")
    commands = plans.find(prompt_text)
    if commands is None:
        return _UNKNOWN
    turn = prompt_text.count(_TOOL_RESULT)
    tool = shell_tool(prompt_text)
    if error_kind == "plan" and turn == 0 and errors is not None:
        others = plans.other_plans(commands)
        if others and errors.draw(commands[0]):
            commands = errors.choice(others)
    elif error_kind == "plan" and turn > 0:
        issued = issued_commands(prompt_text, tool.argument)
        if issued and issued[0] != commands[0]:
            commands = plans.plan_starting(issued[0]) or commands
    steps = [*commands, tool.submit] if tool.submit else list(commands)
    if turn >= len(steps):
        return _DONE
    command = steps[turn]
    if error_kind == "unwritten" and errors is not None and unwritten(command) != command and errors.draw(command):
        command = unwritten(command)
    return tool.call(command, turn + 1)


class ScriptedOracleEngine:
    """A scripted :class:`~openforge_inference.engines.base.Engine`; see the module docstring.

    Args:
        config: Model path (tokenizer, chat template, tensor shapes) and ``tasks_root``.

    Raises:
        EngineUnavailable: From :meth:`start`, when ``config.tasks_root`` is unset or holds no
            oracle, or the model directory is malformed.
    """

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._static: StaticModel | None = None
        self._tokenizer: Any = None
        self._plans: OraclePlans | None = None
        self._errors = ErrorDraws(config.scripted_error_rate, config.seed) if config.scripted_error_rate > 0 else None
        self._weights = WeightState(uri=str(config.model_path))
        self._in_flight: dict[str, asyncio.Event] = {}
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._started = False
        self._closed = False

    @property
    def name(self) -> str:
        """``"scripted-oracle"``."""
        return _ENGINE_NAME

    async def start(self) -> None:
        """Reads the model directory's tokenizer and metadata and the task oracles."""
        if self._started:
            return
        if self._config.tasks_root is None:
            raise EngineUnavailable("scripted-oracle needs a tasks root (OPENFORGE_SCRIPTED_TASKS_ROOT)")
        from tokenizers import Tokenizer

        self._static = describe_model(self._config, _ENGINE_NAME)
        try:
            self._tokenizer = Tokenizer.from_file(str(Path(self._config.model_path) / "tokenizer.json"))
        except Exception as exc:
            raise EngineUnavailable(f"cannot read the tokenizer of {self._config.model_path}: {exc}") from exc
        self._plans = OraclePlans(Path(self._config.tasks_root))
        self._started = True
        _log.info("engine.started", engine=_ENGINE_NAME, tasks=len(self._plans.commands))

    async def close(self) -> None:
        """Ends every stream with ABORT. Idempotent."""
        self._closed = True
        for event in self._in_flight.values():
            event.set()
        self._resumed.set()

    async def healthy(self) -> bool:
        """Started and not closed."""
        return self._started and not self._closed

    async def model_info(self) -> ModelInfo:
        """The model directory's description, with the serving policy version."""
        static = self._require_started()
        return dataclasses.replace(static.info, policy_version=self._weights.version)

    def _require_started(self) -> StaticModel:
        if not self._started or self._closed or self._static is None:
            raise EngineUnavailable("the scripted-oracle engine is not started")
        return self._static

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Streams the scripted completion; see :meth:`Engine.generate`."""
        static = self._require_started()
        validate_request(request, static.info.vocab_size, static.info.context_length)
        if request.request_id in self._in_flight:
            raise DuplicateRequest(f"request {request.request_id} is already in flight")
        if request.min_policy_version > self._weights.version:
            raise PolicyVersionTooOld(
                f"serving policy version {self._weights.version}, request needs >= {request.min_policy_version}",
                metadata={"serving_version": str(self._weights.version)},
            )
        assert self._plans is not None
        aborted = asyncio.Event()
        self._in_flight[request.request_id] = aborted
        try:
            await self._resumed.wait()
            prompt = [int(t) for t in request.prompt_token_ids]
            text = oracle_completion(
                self._plans,
                self._tokenizer.decode(prompt, skip_special_tokens=False),
                errors=self._errors,
                error_kind=self._config.scripted_error_kind,
            )
            ids = [int(t) for t in self._tokenizer.encode(text, add_special_tokens=False).ids]
            eos = static.info.eos_token_ids
            if eos:
                ids.append(int(eos[0]))
            room = min(request.sampling.max_tokens, static.info.context_length - len(prompt))
            reason = FinishReason.STOP if len(ids) <= room else FinishReason.LENGTH
            ids = ids[: max(room, 0)]
            if aborted.is_set() or self._closed:
                reason, ids = FinishReason.ABORT, []
            version = self._weights.version
            yield GenerateDelta(
                token_ids=tuple(ids),
                logprobs=(0.0,) * len(ids),
                policy_versions=(version,) * len(ids),
                finish_reason=reason,
                usage=TokenUsage(len(prompt), len(ids)),
            )
        finally:
            self._in_flight.pop(request.request_id, None)

    async def abort(self, request_id: str) -> bool:
        """Marks an in-flight request aborted; False if unknown."""
        event = self._in_flight.get(request_id)
        if event is None:
            return False
        event.set()
        return True

    async def pause(self) -> int:
        """New completions wait until :meth:`resume`; returns the in-flight count."""
        self._require_started()
        self._resumed.clear()
        return len(self._in_flight)

    async def resume(self) -> None:
        """Lets completions go on. Idempotent."""
        self._require_started()
        self._resumed.set()

    async def update_weights(self, uri: str, version: int, checksum: str) -> datetime.timedelta:
        """Validates the checkpoint as the real engines do, then serves ``version`` (the scripted
        answers do not change); see :meth:`Engine.update_weights`."""
        static = self._require_started()
        if self._weights.is_noop(uri, version, checksum):
            return datetime.timedelta(0)
        started = time.perf_counter()
        directory = resolve_checkpoint_uri(uri)
        await asyncio.to_thread(validate_checkpoint, directory, static.reference_shapes, checksum)
        self._weights = WeightState(version, uri, checksum)
        return datetime.timedelta(seconds=time.perf_counter() - started)
