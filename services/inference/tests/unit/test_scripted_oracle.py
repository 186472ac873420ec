"""The ``scripted-oracle`` engine (a scripted engine, not a model): it recognises the task in a
rendered prompt, answers with the task's oracle ``solve.sh`` as a Hermes tool call, then the
submit command, tokenized with the served model's tokenizer; weight updates are validated."""

from __future__ import annotations

import asyncio
import json
import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from openforge_core.engine_names import ENGINE_NAMES
from openforge_inference.engines import create_engine
from openforge_inference.engines.base import (
    CheckpointError,
    Engine,
    EngineConfig,
    EngineUnavailable,
    FinishReason,
    GenerateDelta,
    GenerateRequest,
    PolicyVersionTooOld,
    SamplingOptions,
)
from openforge_inference.engines.scripted_oracle import (
    ONE_CALL_PER_LINE,
    SUBMIT_COMMAND,
    ErrorDraws,
    OraclePlans,
    oracle_completion,
    oracle_steps,
)
from openforge_inference.model_files import checkpoint_checksum
from openforge_testing.captures import CAPTURES

ROOT = Path(__file__).resolve().parents[4]
TASKS = ROOT / "examples" / "tasks"


def _instruction(split: str, task: str) -> str:
    return (TASKS / split / task / "instruction.md").read_text().strip()


def _command(split: str, task: str) -> str:
    return "bash -c " + shlex.quote((TASKS / split / task / "solution" / "solve.sh").read_text())


def _call(text: str) -> dict[str, object]:
    body = text.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0]
    parsed: dict[str, object] = json.loads(body)
    return parsed


def test_plans_cover_every_shipped_task_and_replay_solve_then_submit_then_stop() -> None:
    plans = OraclePlans(TASKS)
    assert len(plans.commands) == len(list(TASKS.glob("*/*/solution/solve.sh")))
    prompt = f"<|im_start|>user\n{_instruction('train', 'count-lines')}<|im_end|>\n<|im_start|>assistant\n"
    first = oracle_completion(plans, prompt)
    assert _call(first) == {"name": "bash", "arguments": {"command": _command("train", "count-lines")}}
    second = oracle_completion(plans, prompt + first + "<tool_response>\n3\n</tool_response>")
    assert _call(second) == {"name": "bash", "arguments": {"command": SUBMIT_COMMAND}}
    third = oracle_completion(plans, prompt + "<tool_response>a</tool_response><tool_response>b</tool_response>")
    assert "<tool_call>" not in third
    assert "<tool_call>" not in oracle_completion(plans, "a prompt about something else")


def test_plans_refuse_a_folder_without_oracles(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match="no task"):
        OraclePlans(tmp_path)
    with pytest.raises(EngineUnavailable, match="not a folder"):
        OraclePlans(tmp_path / "missing")


def _generate(engine: Engine, prompt: list[int], max_tokens: int, rid: str = "r1", version: int = 0) -> GenerateDelta:
    async def go() -> GenerateDelta:
        request = GenerateRequest(rid, prompt, SamplingOptions(max_tokens=max_tokens), min_policy_version=version)
        deltas = [d async for d in engine.generate(request)]
        assert len(deltas) == 1
        return deltas[0]

    return asyncio.run(go())


def test_engine_serves_the_oracle_tokens_with_the_models_tokenizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert "scripted-oracle" in ENGINE_NAMES
    with pytest.raises(EngineUnavailable, match="tasks root"):
        asyncio.run(create_engine("scripted-oracle", EngineConfig(model_path=tiny_model_dir)).start())
    engine = create_engine("scripted-oracle", EngineConfig(model_path=tiny_model_dir, tasks_root=TASKS))
    asyncio.run(engine.start())
    info = asyncio.run(engine.model_info())
    assert info.engine == "scripted-oracle" and info.policy_version == 0
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    prompt = tok.encode(f"user: {_instruction('test', 'celsius-convert')}\nassistant:", add_special_tokens=False).ids

    delta = _generate(engine, prompt, 4096)
    assert delta.finish_reason is FinishReason.STOP
    assert delta.token_ids[-1] in info.eos_token_ids
    assert set(delta.logprobs) == {0.0} and set(delta.policy_versions) == {0}
    text = tok.decode(list(delta.token_ids[:-1]), skip_special_tokens=False)
    assert _call(text)["arguments"] == {"command": _command("test", "celsius-convert")}
    assert delta.usage is not None and delta.usage.prompt_tokens == len(prompt)

    short = _generate(engine, prompt, 5, rid="r2")
    assert short.finish_reason is FinishReason.LENGTH and len(short.token_ids) == 5

    # weight updates are validated like a model engine's, then only advance the version
    with pytest.raises(CheckpointError):
        asyncio.run(engine.update_weights(str(tmp_path / "nowhere"), 1, ""))
    asyncio.run(engine.update_weights(str(tiny_model_dir), 1, checkpoint_checksum(tiny_model_dir)))
    assert asyncio.run(engine.model_info()).policy_version == 1
    assert set(_generate(engine, prompt, 4096, rid="r3", version=1).policy_versions) == {1}
    with pytest.raises(PolicyVersionTooOld):
        _generate(engine, prompt, 4096, rid="r4", version=2)
    asyncio.run(engine.close())
    assert not asyncio.run(engine.healthy())


def test_a_one_call_per_line_solution_is_replayed_a_command_per_turn_then_submitted() -> None:
    demo = ROOT / "examples" / "demo" / "tasks"
    plans = OraclePlans(demo)
    task = demo / "train" / "check-1"
    prompt = f"<|im_start|>user\n{(task / 'instruction.md').read_text().strip()}<|im_end|>\n"
    answers = [oracle_completion(plans, prompt + "<tool_response>x</tool_response>" * turn) for turn in range(4)]
    assert [_call(a)["arguments"] for a in answers[:3]] == [
        {"command": "bash check.sh"},
        {"command": "echo failed > answer.txt"},
        {"command": SUBMIT_COMMAND},
    ]
    assert "<tool_call>" not in answers[3]


def test_oracle_steps_keep_whole_scripts_whole() -> None:
    script = "#!/usr/bin/env bash\nset -e\ncd /app\necho a > b\n"
    assert oracle_steps(script) == ("bash -c " + shlex.quote(script),)
    marked = f"#!/usr/bin/env bash\n{ONE_CALL_PER_LINE}\nset -eu\ncd /app\n\n# note\nls\ncd sub && make\ncat x\n"
    assert oracle_steps(marked) == ("ls", "cd sub && make", "cat x")
    with pytest.raises(ValueError, match="no command"):
        oracle_steps(f"#!/bin/sh\n{ONE_CALL_PER_LINE}\nset -e\n")
    from openforge_cli import task_family

    assert task_family.ONE_CALL_PER_LINE == ONE_CALL_PER_LINE  # the generator writes what the engine reads


def test_an_imperfect_demonstrator_follows_another_tasks_plan_at_its_error_rate_to_the_end() -> None:
    demo = ROOT / "examples" / "demo" / "tasks"
    plans = OraclePlans(demo)
    task = demo / "train" / "count-0"
    prompt = f"<|im_start|>user\n{(task / 'instruction.md').read_text().strip()}<|im_end|>\n"
    right = "wc -l < data.txt > answer.txt"
    errors = ErrorDraws(0.5, seed=0)
    firsts = [_call(oracle_completion(plans, prompt, errors=errors))["arguments"] for _ in range(400)]
    wrong = [c for f in firsts if isinstance(f, dict) and (c := f["command"]) != right]
    assert len(wrong) == 200  # half, each from another task's plan
    assert set(wrong) == {"sort data.txt > answer.txt", "head -n 1 data.txt > answer.txt",
                          "tail -n 1 data.txt > answer.txt", "bash check.sh"}  # fmt: skip
    assert all(oracle_completion(plans, prompt).count(right) for _ in range(20))

    # later calls continue the plan the first call followed (read back from the conversation)
    first = '<tool_call>\n{"name": "bash", "arguments": {"command": "bash check.sh"}}\n</tool_call>'
    second = oracle_completion(plans, prompt + first + "<tool_response>x</tool_response>", errors=errors)
    verdicts = ({"command": "echo passed > answer.txt"}, {"command": "echo failed > answer.txt"})
    assert _call(second)["arguments"] in verdicts
    ok = '<tool_call>\n{"name": "bash", "arguments": {"command": "wc -l < data.txt > answer.txt"}}\n</tool_call>'
    then = oracle_completion(plans, prompt + ok + "<tool_response>3</tool_response>", errors=ErrorDraws(1.0, 0))
    assert _call(then)["arguments"] == {"command": SUBMIT_COMMAND}


def test_an_unwritten_error_prints_the_answer_instead_of_writing_it_and_keeps_the_plan() -> None:
    demo = ROOT / "examples" / "demo" / "tasks"
    plans = OraclePlans(demo)
    errors = ErrorDraws(0.5, seed=0)

    def command(prompt: str, draws: ErrorDraws | None) -> object:
        args = _call(oracle_completion(plans, prompt, errors=draws, error_kind="unwritten"))["arguments"]
        return args["command"] if isinstance(args, dict) else None

    def prompt(task: str, *results: str) -> str:
        text = (demo / "train" / task / "instruction.md").read_text().strip()
        return f"<|im_start|>user\n{text}<|im_end|>\n" + "".join(results)

    firsts = [command(prompt("count-0"), errors) for _ in range(400)]
    assert set(firsts) == {"wc -l < data.txt > answer.txt", "wc -l < data.txt"}  # never another plan
    assert firsts.count("wc -l < data.txt") == 200  # half
    assert all(command(prompt("count-0"), None) == "wc -l < data.txt > answer.txt" for _ in range(20))
    # a command that writes no file is never changed: only the check task's second call can err
    always = ErrorDraws(1.0, seed=0)
    assert all(command(prompt("check-0"), always) == "bash check.sh" for _ in range(20))
    assert command(prompt("check-0", "<tool_response>passed</tool_response>"), always) == "echo passed"
    with pytest.raises(ValueError, match="error kind"):
        oracle_completion(plans, prompt("check-0"), errors=errors, error_kind="typo")


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5, 0.7])
def test_error_draws_are_stratified_per_command_where_independent_draws_are_not(rate: float) -> None:
    import random

    # Of the first n draws of each key, floor or ceil of n * rate are errors, whatever the seed
    # and however the keys interleave; independent draws of six often miss by two or more.
    for seed in range(20):
        draws = ErrorDraws(rate, seed)
        keys = [k for k in ("count", "first", "last", "sort") for _ in range(6)]
        random.Random(seed).shuffle(keys)
        errs: dict[str, list[bool]] = {}
        for k in keys:
            errs.setdefault(k, []).append(draws.draw(k))
            n = len(errs[k])
            assert math.floor(n * rate) <= sum(errs[k]) <= math.ceil(n * rate)
    binomial = [sum(random.Random(s).random() < 0.5 for _ in range(6)) for s in range(1000)]
    assert sum(abs(b - 3) >= 2 for b in binomial) > 150  # ~22% of kinds would be 5:1 or worse
    # the seed picks which demonstrations err, not how many
    runs = {tuple(map(ErrorDraws(0.5, s).draw, ["k"] * 6)) for s in range(20)}
    assert len(runs) == 2 and all(sum(r) == 3 for r in runs)
    with pytest.raises(ValueError, match="rate"):
        ErrorDraws(1.5, 0)


@pytest.mark.parametrize(
    ("command", "printed"),
    [
        ("wc -l < data.txt > answer.txt", "wc -l < data.txt"),
        ("echo failed >answer.txt", "echo failed"),
        ("sort data.txt > out/answer.txt  ", "sort data.txt"),
        ("bash check.sh", "bash check.sh"),
        ("cat a > b | tee c", "cat a > b | tee c"),  # not a trailing redirection
    ],
)
def test_unwritten_drops_only_a_trailing_redirection_into_a_file(command: str, printed: str) -> None:
    from openforge_inference.engines.scripted_oracle import unwritten

    assert unwritten(command) == printed


def _as_function(tool: dict[str, Any]) -> dict[str, Any] | None:
    """A captured tool (Anthropic, Responses or Chat Completions shape) as a Chat Completions
    function tool, the shape the proxy renders; None for a tool that is not a function."""
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        return tool
    if "input_schema" in tool:
        return {"type": "function", "function": {"name": tool["name"], "parameters": tool["input_schema"]}}
    if tool.get("type") == "function":
        return {"type": "function", "function": {"name": tool["name"], "parameters": tool.get("parameters", {})}}
    return None


@pytest.mark.parametrize(
    ("capture", "call"),
    [
        ("mini-swe-agent/chat-toolcall", ("bash", "command", {})),
        ("claude-code/normal", ("Bash", "command", {"description": "Run the step"})),
        ("codex/custom-model", ("exec_command", "cmd", {})),
        ("openclaw/chat-completions", ("exec", "command", {})),
    ],
)
def test_the_oracle_calls_the_shell_tool_each_harness_offers_and_submits_as_it_does(
    tiny_model_dir: Path, capture: str, call: tuple[str, str, dict[str, str]]
) -> None:
    """The tool set of each CLI's first captured request, rendered by the served model's chat
    template as the proxy renders it: the oracle calls that CLI's shell tool, then ends the run
    the CLI's way (mini-swe-agent: its submit command; the others: a text answer)."""
    from transformers import AutoTokenizer

    body = json.loads(sorted((CAPTURES / capture).glob("0001_*.json"))[0].read_text())["body"]
    tools: list[dict[Any, Any] | Callable[..., Any]] = [f for t in body["tools"] if (f := _as_function(t)) is not None]
    assert any(isinstance(f, dict) and f["function"]["name"] == call[0] for f in tools)
    name, argument, extra = call
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": _instruction("train", "count-lines")}],
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert isinstance(prompt, str)
    plans = OraclePlans(TASKS)
    first = oracle_completion(plans, prompt)
    assert _call(first) == {"name": name, "arguments": {argument: _command("train", "count-lines"), **extra}}
    second = oracle_completion(plans, prompt + first + "<tool_response>\n3\n</tool_response>")
    if name == "bash":
        assert _call(second) == {"name": "bash", "arguments": {"command": SUBMIT_COMMAND}}
    else:
        assert "<tool_call>" not in second and second.strip()
