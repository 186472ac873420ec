"""Token-exact splice with Mistral v11 framing (the ``mistral`` family), end to end through the proxy.

Mistral's template writes no generation prompt: the model writes right after ``[/INST]`` or
``[/TOOL_RESULTS]``, and ends its turn with ``</s>``, which the template writes after each
assistant message, so the splicer puts a turn's sampled ids exactly where the template writes
the message, its sampled ``</s>`` standing in for the template's. The fake engine samples
Mistral-format completions as exact token ids: text, a call ``[TOOL_CALLS]exec[ARGS]{...}``,
text and two calls (one with an integer argument), a final answer, each ended with ``</s>``.
Parts of them are spelled in ids the tokenizer would not produce (one token per character: the
same text, other ids), so a prompt re-tokenised from text would show. The harness replays the
history as its wire API gives it back (Chat Completions, streamed or not, arguments
re-serialized; Anthropic Messages; Responses). Checks:

* every call's prompt extends the previous call's prompt + completion (no break reported), so
  the rollout assembles, as the trajectory store does, into exactly one sample whose
  loss-mask-1 tokens are exactly the sampled ids, in order, each sampled ``</s>`` once;
* re-tokenising what the model saw gives other ids: the splice, not the template, keeps the
  sample whole.
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


@pytest.fixture(scope="module")
def mistral_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with a Mistral v11-style template and Mistral's control tokens."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model-mistral"), template="mistral")


def completions(fake: ScriptedInferenceServer) -> list[list[int]]:
    """The four scripted completions as token ids, some spelled oddly."""
    enc = fake.encode

    def tok(text: str) -> int:
        return token(fake, text)

    def odd(text: str) -> list[int]:
        return odd_spelling(fake, text)

    calls, args, end = tok("[TOOL_CALLS]"), tok("[ARGS]"), tok("</s>")

    return [
        # text with a word spelled oddly
        [*enc("Let me look at the "), *odd("directory"), *enc(" first."), end],
        # one call, its command spelled oddly
        [calls, *enc("exec"), args, *enc('{"command": "'), *odd(COMMAND), *enc('"}'), end],
        # text, then two calls (an integer argument)
        [*enc("Checking both."), calls, *odd("read_file"), args, *enc('{"path": "hello.txt"}'), calls,
         *enc("exec"), args, *enc('{"command": "cat hello.txt", "timeout": 30}'), end],
        # the final answer
        [*odd("Done"), *enc(": hello.txt now contains hello-from-harness."), end],
    ]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed-reserialized"])
async def test_chat_rollout_with_mistral_framing_is_one_sample(
    mistral_model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    proxy, fake, scripted = await scripted_proxy(mistral_model_dir, start_proxy, completions)
    said, _ = await chat_rollout(proxy, stream)
    assert said == EXPECTED
    check_one_sample(proxy, fake, scripted)


async def test_anthropic_rollout_with_mistral_framing_is_one_sample(mistral_model_dir: Path, start_proxy: Any) -> None:
    proxy, fake, scripted = await scripted_proxy(mistral_model_dir, start_proxy, completions)
    kinds, stops = await anthropic_rollout(proxy)
    assert kinds == [["text"], ["tool_use"], ["text", "tool_use", "tool_use"], ["text"]]
    assert stops == ["end_turn", "tool_use", "tool_use", "end_turn"]
    check_one_sample(proxy, fake, scripted)


async def test_responses_rollout_with_mistral_framing_is_one_sample(mistral_model_dir: Path, start_proxy: Any) -> None:
    proxy, fake, scripted = await scripted_proxy(mistral_model_dir, start_proxy, completions)
    assert await responses_rollout(proxy) == EXPECTED
    check_one_sample(proxy, fake, scripted)
