"""Request bodies parsed as the one top-level value that changed since a kept body (BodyMemo).

Whatever is reused, the parse must equal ``orjson.loads`` of the whole body, compared as
serialized JSON (``==`` takes 1, 1.0 and true for one another).
"""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from openforge_proxy.domain.protocols.memo import BodyMemo


def _check(memo: BodyMemo, body: bytes) -> Any:
    got = memo.loads(body)
    assert orjson.dumps(got) == orjson.dumps(orjson.loads(body))
    return got


def _body(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "system": "s" * 500, "tools": [{"name": "Bash"}], **extra}


def test_a_growing_conversation_parses_only_its_messages() -> None:
    memo = BodyMemo()
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    first = _check(memo, orjson.dumps(_body(messages)))
    for i in range(5):
        messages = [*messages, {"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
        got = _check(memo, orjson.dumps(_body(messages)))
        # the unchanged values are the first parse's objects
        assert got["system"] is first["system"] and got["tools"] is first["tools"]
    assert memo.reused == 5


def test_values_changed_on_both_sides_of_unchanged_ones_leave_those_as_they_were() -> None:
    # new messages and a flag after the system prompt and tools (a caller that alternates
    # streaming): the values between are the kept objects, the changed ones parsed alone
    memo = BodyMemo()
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    first = _check(memo, orjson.dumps(_body(messages, stream=False)))
    for i in range(6):
        messages = [*messages, {"role": "user", "content": f"u{i} " + "x" * 100}]
        got = _check(memo, orjson.dumps(_body(messages, stream=i % 2 == 0)))
        assert got["system"] is first["system"] and got["tools"] is first["tools"]
    assert memo.reused == 6
    # a changed value that holds the next key and the start of its value (a nested object
    # with the same key and value): where they are found first, the changed value does not
    # end, so the body is parsed whole
    messages = [*messages, {"role": "user", "content": "c", "system": "s" * 500}]
    body = orjson.dumps(_body(messages, stream=True))
    assert body.index(b',"system":"sss') < body.index(b"]")
    _check(memo, body)
    assert memo.reused == 6


@pytest.mark.parametrize(
    ("change", "reused"),
    [
        (lambda b: {**b, "stream": True}, False),  # a new key
        (lambda b: {("toolz" if k == "tools" else k): v for k, v in b.items()}, False),  # a key, next to a value
        (lambda b: {**b, "system": "other"}, True),  # one other value
        (lambda b: {**b, "system": "other", "tools": []}, True),  # two values side by side
        (lambda b: {**b, "model": "n", "max_tokens": 2}, True),  # two values apart
        (lambda b: {k: b[k] for k in reversed(b)}, False),  # other order
        (lambda b: {**b, "max_tokens": 12}, True),  # a number, longer
        (lambda b: {**b, "max_tokens": 1.0}, True),  # equal to Python, not the same JSON
        (lambda b: b, True),  # the same body (a retry)
    ],
)
def test_changes_outside_one_value_are_parsed_whole(change: Any, reused: bool) -> None:
    memo = BodyMemo()
    base = {**_body([{"role": "user", "content": "hi"}]), "max_tokens": 1}
    _check(memo, orjson.dumps(base))
    _check(memo, orjson.dumps(change(base)))
    assert memo.reused == int(reused)


def test_a_grown_list_parses_only_its_new_elements() -> None:
    memo = BodyMemo()
    messages: list[Any] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [1.5, None]}]
    first = _check(memo, orjson.dumps(_body(messages)))
    for i in range(4):
        messages = [*messages, {"role": "user", "content": f"u{i}"}]
        got = _check(memo, orjson.dumps(_body(messages)))
        # the earlier elements are the first parse's objects
        assert all(x is y for x, y in zip(got["messages"], first["messages"], strict=False))
    # an edit in the middle keeps the elements before it; a truncation keeps what is left
    messages[3] = {"role": "user", "content": "edited"}
    got = _check(memo, orjson.dumps(_body(messages)))
    assert got["messages"][1] is first["messages"][1]
    got = _check(memo, orjson.dumps(_body(messages[:2])))
    assert got["messages"][0] is first["messages"][0]
    _check(memo, orjson.dumps(_body([])))
    _check(memo, orjson.dumps(_body(messages)))
    assert memo.reused == 8


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b'{"m":[1,2],"s":1}', b'{"m":[1,2,],"s":1}'),  # a trailing comma: not JSON
        (b'{"m":[1,2],"s":1}', b'{"m":[1,2 ,3],"s":1}'),
        (b'{"m":[12],"s":1}', b'{"m":[123],"s":1}'),  # an element that grew, not a new one
        (b'{"m":[1,2],"s":1}', b'{"m":[1,2]3],"s":1}'),
        (b'{"m":[[1],2],"s":1}', b'{"m":[[1]],2],"s":1}'),
        (b'{"m":[1,2],"s":1}', b'{"m":[1,2, ],"s":1}'),  # a trailing comma, whitespace after it
        (b'{"m":[1,2],"s":1}', b'{"m":[1,2,\n\t\r]}'),
    ],
)
def test_list_tails_that_are_not_json_are_refused_or_parsed_whole(before: bytes, after: bytes) -> None:
    memo = BodyMemo()
    _check(memo, before)
    try:
        want = orjson.loads(after)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            memo.loads(after)
    else:
        assert orjson.dumps(memo.loads(after)) == orjson.dumps(want)


def test_list_elements_not_in_orjson_form_are_never_taken_for_others() -> None:
    # new elements written otherwise than orjson writes them, as long in all ("\u00fc" is 4
    # bytes longer than "ü", 1E2 2 bytes shorter than 100.0): whatever comes next, each
    # parse equals a whole parse
    grown = b'{"m":[1,2,"\\u00fc",1E2,1E2],"s":1}'
    assert len(orjson.dumps(orjson.loads(grown))) == len(grown)
    items = ["1", "2", '"\\u00fc"', "1E2", "1E2"]
    nexts = [b'{"m":[' + ",".join(items[:k] + tail).encode() + b'],"s":1}' for k in range(6) for tail in ([], ["7"])]
    nexts += [b'{"m":[' + ",".join([*items[:k], "9", *items[k + 1 :]]).encode() + b'],"s":1}' for k in range(5)]
    for after in nexts:
        memo = BodyMemo()
        _check(memo, b'{"m":[1,2],"s":1}')
        _check(memo, grown)
        _check(memo, after)


def test_bodies_not_in_orjson_form_are_parsed_whole_every_time() -> None:
    memo = BodyMemo()
    messages: list[Any] = []
    for i in range(4):
        messages = [*messages, {"role": "user", "content": f"ü{i}"}]
        for text in (
            json.dumps(_body(messages)),  # spaces after separators, non-ASCII escaped
            json.dumps(_body(messages), separators=(",", ":")),  # non-ASCII escaped
            " " + orjson.dumps(_body(messages)).decode(),  # leading space
            '{"a":1,"a":2}',  # a duplicate key
            '{"n":' + str(2**70) + "}",  # an integer orjson parses but does not write
        ):
            _check(memo, text.encode())
    assert memo.reused == 0


def test_replacements_that_break_the_document_are_refused_as_a_whole_parse_would_be() -> None:
    memo = BodyMemo()
    _check(memo, b'{"messages":[1,2],"stream":true}')
    for bad in (b'{"messages":[1,2,],"stream":true}', b'{"messages":[1,2]],"stream":true}', b'{"messages":[1,2'):
        with pytest.raises(orjson.JSONDecodeError):
            memo.loads(bad)
    # the kept body is still the last good one
    assert _check(memo, b'{"messages":[1,2,3],"stream":true}')["messages"] == [1, 2, 3]
    # a change at a value's edge that reads as more than one value
    _check(memo, b'{"messages":[1,2,3],"x":[4],"stream":true}')
    assert memo.reused == 1


def test_two_threads_of_a_session_each_reuse_their_own_body() -> None:
    memo = BodyMemo()
    a: list[Any] = [{"role": "user", "content": "main"}]
    b: list[Any] = [{"role": "user", "content": "sub-agent"}]
    for i in range(4):
        a = [*a, {"role": "user", "content": f"a{i}"}]
        b = [*b, {"role": "user", "content": f"b{i}"}]
        _check(memo, orjson.dumps(_body(a, system="main " * 100)))
        _check(memo, orjson.dumps(_body(b, system="sub " * 100)))
    # all but the first body: the sub-agent's first one keeps the main thread's tools
    assert memo.reused == 7


def test_random_edits_parse_as_a_whole_parse() -> None:
    """Appends, edits, truncations and changes of other values, in random order."""
    rng = random.Random(3)
    memo = BodyMemo()
    values: list[Any] = ["x", 1, 2.5, None, True, {"k": [1, {"z": "ü"}]}, [], 'a\\"b\n']
    for _ in range(60):
        body: dict[str, Any] = _body([])
        for _ in range(25):
            op = rng.random()
            msgs = body["messages"]
            if op < 0.5:
                body["messages"] = [*msgs, *(rng.choice(values) for _ in range(rng.randint(1, 3)))]
            elif op < 0.65 and msgs:
                k = rng.randrange(len(msgs))
                body["messages"] = [*msgs[:k], rng.choice(values), *msgs[k + 1 :]]
            elif op < 0.75:
                body["messages"] = msgs[: rng.randint(0, len(msgs))]
            elif op < 0.9:
                body[rng.choice(["system", "tools", "stream"])] = rng.choice(values)
            else:
                body = {k: body[k] for k in rng.sample(list(body), len(body))}
            _check(memo, orjson.dumps(body))
    assert memo.reused > 800


def test_many_changed_values_are_parsed_whole() -> None:
    # each changed value may cost a search to the end of the body: past a few, parse whole
    memo = BodyMemo()
    keys = [f"k{i}" for i in range(12)]
    _check(memo, orjson.dumps(dict.fromkeys(keys, 1)))
    _check(memo, orjson.dumps(dict.fromkeys(keys, 2)))  # all twelve changed
    _check(memo, orjson.dumps({**dict.fromkeys(keys, 2), "k3": 3, "k9": 3}))  # two changed
    assert memo.reused == 1


def test_a_session_that_keeps_missing_tries_one_body_in_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[int] = []
    replace = BodyMemo._replace

    def counted(kept: Any, body: bytes) -> Any:
        tries.append(1)
        return replace(kept, body)

    monkeypatch.setattr(BodyMemo, "_replace", staticmethod(counted))
    memo = BodyMemo()
    # bodies with keys of their own: never one of the kept bodies
    for i in range(40):
        _check(memo, orjson.dumps({f"key{i}": i, "messages": [i]}))
    assert memo.reused == 0
    assert len(tries) <= 2 * (4 + 40 // 8)  # not two tries for every body
    # a growing conversation is found again at the next try, and then every body is reused
    messages: list[Any] = []
    for i in range(20):
        messages = [*messages, {"role": "user", "content": f"m{i}"}]
        _check(memo, orjson.dumps({"messages": messages, "system": "s"}))
    assert memo.reused >= 10
