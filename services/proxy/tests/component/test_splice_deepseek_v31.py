"""Token-exact splice with DeepSeek-V3.1 framing (the ``deepseek_v31`` family), end to end through the proxy.

DeepSeek-V3.1's template opens an assistant turn with ``<｜Assistant｜></think>`` right after a
user message and with nothing after tool results (the model writes right after
``<｜tool▁output▁end｜>``), and ends each with ``<｜end▁of▁sentence｜>``, which the template writes
after each assistant message, so the splicer puts a turn's sampled ids exactly where the template
writes the message's text, its sampled end token standing in for the template's. The fake engine
samples DeepSeek-format completions as exact token ids: text, a call block with one call
``<｜tool▁call▁begin｜>exec<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, text and a block of two calls
(one with an integer argument), a final answer, each ended with ``<｜end▁of▁sentence｜>``; the
first answer is followed by a user message, so both openings occur. Parts of them are spelled in
ids the tokenizer would not produce (one token per character: the same text, other ids), so a
prompt re-tokenised from text would show. The harness replays the history as its wire API gives
it back (Chat Completions, streamed or not, arguments re-serialized; Anthropic Messages;
Responses). Checks:

* every call's prompt extends the previous call's prompt + completion (no break reported), so
  the rollout assembles, as the trajectory store does, into exactly one sample whose
  loss-mask-1 tokens are exactly the sampled ids, in order, each sampled end token once;
* re-tokenising what the model saw gives other ids: the splice, not the template, keeps the
  sample whole.

With ``thinking`` the generation prompt is ``<｜Assistant｜><think>`` and the turns after a user
message start with reasoning, which the template never renders in history (a history turn is
``</think>`` and its text): the splice keeps each such turn as ``<think>`` and its sampled ids, so
the rollout is still one sample; turns after tool results carry no reasoning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from family_splice import (
    COMMAND,
    EXPECTED,
    anthropic_rollout,
    chat_rollout,
    check_one_sample,
    odd_spelling,
    responses_rollout,
    scripted_proxy,
    token,
)

from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir

#: The turns sampled right after a user message (the others follow tool results).
AFTER_USER = (0, 1)


@pytest.fixture(scope="module")
def deepseek_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with a DeepSeek-V3.1-style template and DeepSeek-V3.1's special tokens."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model-deepseek_v31"), template="deepseek_v31")


def completions(fake: ScriptedInferenceServer) -> list[list[int]]:
    """The four scripted completions as token ids, some spelled oddly."""
    enc = fake.encode

    def tok(text: str) -> int:
        return token(fake, text)

    def odd(text: str) -> list[int]:
        return odd_spelling(fake, text)

    end = tok("<｜end▁of▁sentence｜>")
    block, close = tok("<｜tool▁calls▁begin｜>"), tok("<｜tool▁calls▁end｜>")
    call, sep, done = tok("<｜tool▁call▁begin｜>"), tok("<｜tool▁sep｜>"), tok("<｜tool▁call▁end｜>")

    return [
        # text with a word spelled oddly
        [*enc("Let me look at the "), *odd("directory"), *enc(" first."), end],
        # one call, its command spelled oddly
        [block, call, *enc("exec"), sep, *enc('{"command": "'), *odd(COMMAND), *enc('"}'), done, close, end],
        # text, then two calls (an integer argument)
        [*enc("Checking both."), block, call, *odd("read_file"), sep, *enc('{"path": "hello.txt"}'), done,
         call, *enc("exec"), sep, *enc('{"command": "cat hello.txt", "timeout": 30}'), done, close, end],
        # the final answer
        [*odd("Done"), *enc(": hello.txt now contains hello-from-harness."), end],
    ]  # fmt: skip


def _opening(fake: ScriptedInferenceServer, opened_by: str = "</think>") -> Any:
    """A turn sampled after a user message keeps the token it followed (``</think>``, or
    ``<think>`` with thinking); one after tool results nothing."""
    return lambda k: [token(fake, opened_by)] if k in AFTER_USER else []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed-reserialized"])
async def test_chat_rollout_with_deepseek_v31_framing_is_one_sample(
    deepseek_model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    proxy, fake, scripted = await scripted_proxy(deepseek_model_dir, start_proxy, completions)
    said, _ = await chat_rollout(proxy, stream)
    assert said == EXPECTED
    check_one_sample(proxy, fake, scripted, opening=_opening(fake))


async def test_anthropic_rollout_with_deepseek_v31_framing_is_one_sample(
    deepseek_model_dir: Path, start_proxy: Any
) -> None:
    proxy, fake, scripted = await scripted_proxy(deepseek_model_dir, start_proxy, completions)
    kinds, stops = await anthropic_rollout(proxy)
    assert kinds == [["text"], ["tool_use"], ["text", "tool_use", "tool_use"], ["text"]]
    assert stops == ["end_turn", "tool_use", "tool_use", "end_turn"]
    check_one_sample(proxy, fake, scripted, opening=_opening(fake))


async def test_responses_rollout_with_deepseek_v31_framing_is_one_sample(
    deepseek_model_dir: Path, start_proxy: Any
) -> None:
    proxy, fake, scripted = await scripted_proxy(deepseek_model_dir, start_proxy, completions)
    assert await responses_rollout(proxy) == EXPECTED
    check_one_sample(proxy, fake, scripted, opening=_opening(fake))


async def test_thinking_turns_are_spliced_with_the_think_they_followed(
    deepseek_model_dir: Path, start_proxy: Any
) -> None:
    fake = ScriptedInferenceServer(deepseek_model_dir)
    plain = completions(fake)
    think = fake.encode("</think>")
    reasoned = [
        [*fake.encode("I should look first."), *think, *plain[0]],
        [*fake.encode("Now the file."), *think, *plain[1]],
    ]
    scripted = [*reasoned, plain[2], plain[3]]
    fake.script(*scripted)
    proxy = await start_proxy(fake, template_kwargs={"thinking": True})
    said, reasoning = await chat_rollout(proxy, False, reasoning_back=True)
    assert reasoning == ["I should look first.", "Now the file.", None, None]
    assert said == EXPECTED
    assert fake.seen[0].prompt_ids[-1] == token(fake, "<think>")
    check_one_sample(proxy, fake, scripted, opening=_opening(fake, "<think>"))
