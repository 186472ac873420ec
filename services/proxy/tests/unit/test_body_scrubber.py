"""BodyScrubber: the scrub of a session's successive bodies, scanning only what changed, equals
the scrub of each whole body."""

from __future__ import annotations

import random

import pytest

from openforge_proxy.domain import scrub
from openforge_proxy.domain.scrub import BodyScrubber, scrub_json_bytes

# pieces that make and unmake occurrences when an edit lands next to or inside them
_PIECES = [
    b'"device_id":"abc"',
    b'\\"device_id\\":\\"abc\\"',
    b'"deviceId" : "d2"',
    b'"installation_id":"q-1"',
    b'"x-codex-installation-id":"i9"',
    b"host=box1",
    b"host=",
    b"ghost=x",
    b'"',
    b"\\",
    b":",
    b" ",
    b"_",
    b"a",
    b"device",
    b"_id",
    b'"account_uu',
    b'id":"u"',
    b"lorem ipsum dolor sit amet, ",
]


def _text(rng: random.Random, n: int) -> bytes:
    return b"".join(rng.choice(_PIECES) for _ in range(n))


def _edit(rng: random.Random, body: bytes) -> bytes:
    """One of the edits a harness makes between calls (append, flip a flag, change or drop a
    stretch), at a random place, or a random small edit anywhere."""
    at = rng.randrange(len(body) + 1)
    kind = rng.randrange(6)
    if kind == 0:
        return body + _text(rng, rng.randrange(1, 30))
    if kind == 1:
        return body[:at] + _text(rng, rng.randrange(1, 4)) + body[at:]
    if kind == 2:
        return body[:at] + body[at + rng.randrange(1, 40) :]
    if kind == 3:
        return body[:at] + _text(rng, rng.randrange(1, 4)) + body[at + rng.randrange(1, 6) :]
    if kind == 4:  # two changes far apart (the conversation grows, a flag flips)
        at2 = rng.randrange(len(body) + 1)
        lo, hi = sorted((at, at2))
        return body[:lo] + _text(rng, 1) + body[lo:hi] + _text(rng, 1) + body[hi:]
    # several changes: the shared stretches between them are runs of the previous body
    cuts = sorted(rng.randrange(len(body) + 1) for _ in range(rng.randrange(3, 7)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return _text(rng, 1).join(parts)


@pytest.mark.parametrize("seed", range(40))
def test_successive_bodies_scrub_as_whole_bodies(seed: int) -> None:
    rng = random.Random(seed)
    scrubber = BodyScrubber(min_bytes=0)
    body = _text(rng, rng.randrange(200, 800))
    for _ in range(30):
        assert scrubber.scrub(body) == scrub_json_bytes(body)
        body = _edit(rng, body) if rng.random() < 0.9 else _text(rng, rng.randrange(0, 400))


def test_edits_at_every_offset_of_an_occurrence() -> None:
    # an edit on each byte of an occurrence's window (and the byte before host=) must be seen
    head, tail = b"x" * 600, b"y" * 600
    middles = (
        b" ahost=box1 host=box2 ",
        b'{"device_id":"abc"}',
        b'\\"installation_id\\":\\"q\\"',
        b'"x-codex-installation-id":"i"',
    )
    for middle in middles:
        base = head + middle + tail
        for i in range(len(head) - 2, len(head) + len(middle) + 2):
            for byte in (b"_", b" ", b'"', b"q"):
                changed = base[:i] + byte + base[i + 1 :]
                for before, after in ((base, changed), (changed, base)):
                    scrubber = BodyScrubber(min_bytes=0)
                    assert scrubber.scrub(before) == scrub_json_bytes(before)
                    assert scrubber.scrub(after) == scrub_json_bytes(after), (before, after)


def test_a_grown_body_is_scanned_only_where_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    system = _text(rng, 3000)
    messages = [_text(rng, 40) for _ in range(20)]
    scanned: list[int] = []
    key_starts = scrub._key_starts

    def counting(raw: bytes, start: int, stop: int) -> list[int]:
        scanned.append(max(0, stop - start))
        return key_starts(raw, start, stop)

    monkeypatch.setattr(scrub, "_key_starts", counting)
    scrubber = BodyScrubber(min_bytes=0)
    for turn in range(6):
        body = b'{"messages":[' + b",".join(messages) + b'],"system":"' + system + b'","stream":'
        body += b"true}" if turn % 2 else b"false}"
        expected = scrub_json_bytes(body)
        scanned.clear()
        assert scrubber.scrub(body) == expected
        if turn == 0:
            assert sum(scanned) == len(body)
        else:  # the new message and the flag, with a window's margin around each edit
            assert sum(scanned) < len(messages[-1]) + 8 * scrub._WINDOW, (turn, sum(scanned), len(body))
        messages.append(_text(rng, 40))


def test_host_is_an_identifier_only_after_a_non_word_byte() -> None:
    raw = b'{"x":"ahost=box9 host=box1","y":"host=box2"}'
    expected = b'{"x":"ahost=box9 host=<scrubbed>","y":"host=<scrubbed>"}'
    assert scrub_json_bytes(raw) == expected
    scrubber = BodyScrubber(min_bytes=0)
    assert scrubber.scrub(raw) == expected
    assert scrubber.scrub(raw + b" ") == expected + b" "
