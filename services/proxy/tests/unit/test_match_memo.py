"""Matching a request's assistant messages to generated turns, reusing the previous build's
matches for the unchanged leading messages, gives what matching every message again gives."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from openforge_proxy.domain.conversation import Message, ToolCall
from openforge_proxy.domain.engine import ModelInfo
from openforge_proxy.domain.output import AssistantOutput, ToolCallOut
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.splice import Splicer
from openforge_testing.fakes import build_fake_model_dir


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> ModelRuntime:
    model = build_fake_model_dir(tmp_path_factory.mktemp("model"))
    config = json.loads((model / "config.json").read_text())
    info = ModelInfo(
        model_path=str(model),
        model_name="m",
        chat_template=(Path(model) / "chat_template.jinja").read_text(),
        chat_template_hash="",
        tokenizer_hash="",
        eos_token_ids=(config["eos_token_id"],),
        context_length=1 << 20,
    )
    return ModelRuntime.load(info)


def _splicer(runtime: ModelRuntime) -> Splicer:
    return Splicer(
        runtime.template,
        runtime.family,
        runtime.codec,
        runtime.generation_prompt,
        sorted(runtime.eos_ids),
        max_heads=3,
    )


def _echo(out: AssistantOutput, rng: random.Random) -> Message:
    """The harness's copy of a generated turn: its references kept, dropped or rewritten."""
    calls = [ToolCall(id=tc.id, name=tc.name, arguments=tc.arguments) for tc in out.tool_calls]
    refs = [r for r in out.refs() if rng.random() < 0.8]
    if rng.random() < 0.1:
        refs = ["-" + r.upper() + "-" for r in refs]  # rewritten, the same once normalized
    if rng.random() < 0.05:
        refs = ["---"]  # normalizes to nothing
    return Message(role="assistant", content=out.text, tool_calls=calls, refs=refs)


def test_reused_matches_equal_matching_again(runtime: ModelRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    full = Splicer._match_all
    compared = reused = 0

    def checked(self: Splicer, messages: list[Message]) -> list[str | None]:
        nonlocal compared, reused
        memo = self._matching
        got = full(self, messages)
        kept = self._matching
        self._matching = None  # from scratch
        want = full(self, messages)
        self._matching = kept
        assert got == want
        compared += 1
        reused += memo is not None and kept is not None and memo.by_ref is kept.by_ref
        return got

    monkeypatch.setattr(Splicer, "_match_all", checked)
    rng = random.Random(11)
    texts = ["OK.", "Sure.", "Done."]
    for _ in range(40):
        splicer = _splicer(runtime)
        threads: list[list[Message]] = [[Message(role="system", content="S"), Message(role="user", content="go")]]
        calls = 0
        pending: list[tuple[int, list[Message], Any]] = []
        for _ in range(25):
            t = rng.randrange(len(threads))
            messages = threads[t]
            op = rng.random()
            if op < 0.1 and len(messages) > 3:  # an edit: another object saying the same, or not
                k = rng.randrange(1, len(messages))
                old = messages[k]
                text = old.content if rng.random() < 0.5 else rng.choice(texts)
                copy_ = Message(role=old.role, content=text, tool_calls=list(old.tool_calls), refs=list(old.refs))
                messages = [*messages[:k], copy_, *messages[k + 1 :]]
            elif op < 0.15:  # a sub-agent, or a compacted history
                messages = [messages[0], Message(role="user", content=f"task {rng.randrange(3)}")]
                threads.append(messages)
                t = len(threads) - 1
            elif op < 0.3 and len(messages) > 4:  # an earlier request sent again: a turn after an old one
                cut = rng.randrange(2, len(messages) - 1)
                if messages[cut - 1].role == "user":
                    messages = messages[:cut]
                    threads.append(messages)
                    t = len(threads) - 1
            plan = splicer.build(messages, [])
            if rng.random() < 0.15:
                continue  # not answered (an error, a retry comes)
            pending.append((t, messages, plan))
            if rng.random() < 0.4:
                continue  # answered later: calls of several threads in flight
            t, messages, plan = pending.pop(rng.randrange(len(pending)))
            calls += 1
            ref = f"msg{rng.randrange(6)}" if rng.random() < 0.95 else "-"  # "-" normalizes to nothing
            out = AssistantOutput(text=rng.choice(texts), ids={"message": ref})
            if rng.random() < 0.4:
                name = rng.choice(["Bash", "Read"])
                cid = f"toolu{rng.randrange(8)}"  # ids repeat: references of several turns collide
                out.tool_calls.append(ToolCallOut(id=cid, name=name, arguments={"n": 1}, arguments_json='{"n": 1}'))
            splicer.commit(plan, call_id=f"call{calls}", attempt=1, output=out, sampled=[5, 6])
            if rng.random() < 0.2:  # a retry of the same request: another turn saying the same
                calls += 1
                splicer.commit(plan, call_id=f"call{calls}", attempt=1, output=out, sampled=[5, 6])
            grown = [*messages, _echo(out, rng), Message(role="user", content=f"result {calls}")]
            threads[t] = grown
    assert compared > 500 and reused > 200


def test_a_list_grown_in_place_between_two_builds_is_matched_whole(runtime: ModelRuntime) -> None:
    splicer = _splicer(runtime)
    messages = [Message(role="system", content="S"), Message(role="user", content="go")]
    plan = splicer.build(messages, [])
    splicer.commit(plan, call_id="c1", attempt=1, output=AssistantOutput(text="OK.", ids={"m": "msg1"}), sampled=[5])
    messages.append(Message(role="assistant", content="OK.", refs=["msg1"]))  # the same list object, grown
    messages.append(Message(role="user", content="next"))
    assert splicer._match_all(messages) == [None, None, "c1/1", None]
