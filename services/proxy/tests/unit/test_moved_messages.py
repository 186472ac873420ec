"""The model's view compared with a request's history: the fast path for a history sent again
unchanged gives what the step-by-step comparison gives."""

from __future__ import annotations

import random

from openforge_proxy.domain.conversation import Message
from openforge_proxy.domain.splice import _moved_step_by_step, _moved_user_messages


def test_moved_messages_equal_the_step_by_step_comparison() -> None:
    rng = random.Random(3)
    fast = 0
    for _ in range(3000):
        n = rng.randint(0, 8)
        seen = [Message(role=rng.choice(["user", "assistant"]), content=f"m{rng.randint(0, 3)}") for _ in range(n)]
        seen_turns = [f"t{i}" if m.role == "assistant" and rng.random() < 0.8 else None for i, m in enumerate(seen)]
        sent, sent_turns = [], []
        for msg, turn in zip(seen, seen_turns, strict=True):
            op = rng.random()
            if op < 0.1:
                continue  # dropped
            if op < 0.7:
                sent.append(msg)  # the same object
            else:  # another object, equal or not
                sent.append(Message(role=msg.role, content=msg.content if rng.random() < 0.7 else "other"))
            sent_turns.append(turn if rng.random() < 0.9 else rng.choice([None, "t99"]))
        kept = frozenset(i for i in range(n) if rng.random() < 0.1)
        want = _moved_step_by_step(seen, seen_turns, sent, sent_turns, kept)
        assert _moved_user_messages(seen, seen_turns, sent, sent_turns, kept) == want
        fast += want == [] and len(sent) == len(seen)
    assert fast > 100


def test_messages_nested_deeper_than_python_compares_are_taken_for_different() -> None:
    import orjson

    from openforge_proxy.domain.conversation import ToolCall
    from openforge_proxy.domain.splice import _same

    deep = b"[" * 1000 + b"]" * 1000

    def message() -> Message:
        return Message(
            role="assistant", content="", tool_calls=[ToolCall(id="c", name="f", arguments=orjson.loads(deep))]
        )

    a, b = message(), message()
    assert _same(a, a)
    assert not _same(a, b)  # equal, but too deep to compare: rendered again rather than failing
