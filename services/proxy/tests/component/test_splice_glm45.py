"""Token-exact splice with GLM-4.5 framing (the ``glm45`` family), end to end through the proxy.

GLM-4.5's template writes no end-of-turn token: the model ends its turn with the token that
opens the next message (``<|observation|>`` after calls, ``<|user|>`` after an answer), and the
splice lets that sampled token stand in for the template's. The fake engine samples GLM-format
completions as exact token ids: reasoning and text ended with ``<|user|>``, a call ended with
``<|observation|>``, text and two calls (one with an integer argument), a final answer. Parts
of them are spelled in ids the tokenizer would not produce (one token per character: the same
text, other ids), so a prompt re-tokenised from text would show. The harness replays the
history as its wire API gives it back (Chat Completions, streamed or not, arguments
re-serialized; Anthropic Messages; Responses). Checks:

* every call's prompt extends the previous call's prompt + completion (no break reported), so
  the rollout assembles, as the trajectory store does, into exactly one sample whose
  loss-mask-1 tokens are exactly the sampled ids, in order, each sampled end token once;
* the calls' arguments are typed by the tools' schemas (a string stays a string, an integer
  parameter's ``30`` is ``30``);
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
def glm45_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with a GLM-4.5-style template and GLM-4.5's special tokens."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model-glm45"), template="glm45")


def completions(fake: ScriptedInferenceServer) -> list[list[int]]:
    """The four scripted completions as token ids, some spelled oddly."""
    enc = fake.encode

    def tok(text: str) -> int:
        return token(fake, text)

    def odd(text: str) -> list[int]:
        return odd_spelling(fake, text)

    think, unthink, call, uncall = tok("<think>"), tok("</think>"), tok("<tool_call>"), tok("</tool_call>")
    key, unkey, value, unvalue = tok("<arg_key>"), tok("</arg_key>"), tok("<arg_value>"), tok("</arg_value>")
    user, observation = tok("<|user|>"), tok("<|observation|>")

    def arg(k: str, v: list[int]) -> list[int]:
        return [*enc("\n"), key, *enc(k), unkey, *enc("\n"), value, *v, unvalue]

    return [
        # reasoning, then text with a word spelled oddly; the user speaks next
        [*enc("\n"), think, *enc("The user wants a file."), unthink, *enc("\nLet me look at the "), *odd("directory"),
         *enc(" first."), user],
        # one call, its command spelled oddly; its result comes next
        [*enc("\n"), think, *enc("Run it."), unthink, *enc("\n"), call, *enc("exec"), *arg("command", odd(COMMAND)),
         *enc("\n"), uncall, observation],
        # empty reasoning, text, then two calls (an integer argument)
        [*enc("\n"), think, unthink, *enc("\nChecking both.\n"), call, *odd("read_file"),
         *arg("path", enc("hello.txt")), *enc("\n"), uncall, *enc("\n"), call, *enc("exec"),
         *arg("command", enc("cat hello.txt")), *arg("timeout", enc("30")), *enc("\n"), uncall, observation],
        # the final answer
        [*enc("\n"), think, *enc("Done."), unthink, *enc("\n"), *odd("Done"),
         *enc(": hello.txt now contains hello-from-harness."), user],
    ]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed-reserialized"])
async def test_chat_rollout_with_glm_framing_is_one_sample(
    glm45_model_dir: Path, start_proxy: Any, stream: bool
) -> None:
    proxy, fake, scripted = await scripted_proxy(glm45_model_dir, start_proxy, completions)
    said, _ = await chat_rollout(proxy, stream)
    assert said == EXPECTED
    check_one_sample(proxy, fake, scripted)


async def test_anthropic_rollout_with_glm_framing_is_one_sample(glm45_model_dir: Path, start_proxy: Any) -> None:
    proxy, fake, scripted = await scripted_proxy(glm45_model_dir, start_proxy, completions)
    kinds, stops = await anthropic_rollout(proxy, thinking=True)
    assert kinds == [
        ["thinking", "text"],
        ["thinking", "tool_use"],
        ["text", "tool_use", "tool_use"],
        ["thinking", "text"],
    ]
    assert stops == ["end_turn", "tool_use", "tool_use", "end_turn"]
    check_one_sample(proxy, fake, scripted)


async def test_responses_rollout_with_glm_framing_is_one_sample(glm45_model_dir: Path, start_proxy: Any) -> None:
    proxy, fake, scripted = await scripted_proxy(glm45_model_dir, start_proxy, completions)
    assert await responses_rollout(proxy) == EXPECTED
    check_one_sample(proxy, fake, scripted)
