"""Generated model output for the differential parser tests (``test_<family>_parser_vs_vllm.py``):
seeded JSON arguments, prose with look-alikes of markers, and the proxy's streaming parse of a
completion fed whole and in random chunks."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge_proxy.domain.families import StreamParser

UNICODE = "héllo wörld ñandú 日本語 テスト 中文 Ωμέγα ✓ 🚀 😀 ü ß"
KEY_CHARS = string.ascii_letters + "_"
#: Characters of generated strings: JSON's specials, brackets of every kind, unicode.
STR_CHARS = string.ascii_letters + string.digits + " .,:;!?-_/'\"\\\n\t{}[]<>" + UNICODE
WORDS = "the file is read and then we run tests in the repo; check output: ok, done".split() + UNICODE.split()
TOOLS = ("Bash", "read_file", "write", "search.web", "exec", "get_weather", "ツール", "edit-file")


@dataclass
class Parsed:
    """What one parse found: reasoning, text and calls as (name, arguments)."""

    reasoning: str = ""
    text: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)


def random_string(rng: random.Random, n: int = 12, chars: str = STR_CHARS) -> str:
    """Up to ``n`` characters of ``chars``."""
    return "".join(rng.choice(chars) for _ in range(rng.randint(0, n)))


def json_value(rng: random.Random, depth: int, chars: str = STR_CHARS) -> Any:
    """A JSON value: a string, number, boolean, null, list or object (nested to depth 3)."""
    kind = rng.choice(("str", "int", "float", "bool", "null", "list", "dict") if depth < 3 else ("str", "int"))
    if kind == "str":
        return random_string(rng, chars=chars)
    if kind == "int":
        return rng.randint(-(10**12), 10**12)
    if kind == "float":
        return round(rng.uniform(-1e6, 1e6), rng.randint(1, 6)) + 0.5
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [json_value(rng, depth + 1, chars) for _ in range(rng.randint(0, 4))]
    return {key(rng): json_value(rng, depth + 1, chars) for _ in range(rng.randint(0, 3))}


def key(rng: random.Random) -> str:
    """An argument name."""
    return "".join(rng.choice(KEY_CHARS) for _ in range(rng.randint(1, 10)))


def arguments(rng: random.Random, chars: str = STR_CHARS) -> dict[str, Any]:
    """A call's arguments (none about one time in seven)."""
    return {key(rng): json_value(rng, 0, chars) for _ in range(0 if rng.random() < 0.15 else rng.randint(1, 4))}


def prose(rng: random.Random, lookalikes: Sequence[str], n: int = 12) -> str:
    """Up to ``n`` words, sometimes with one of ``lookalikes`` (text that starts like a marker)."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, n))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(lookalikes))
    text = ""
    for w in words:
        text += w + rng.choice((" ", " ", " ", "\n", ", ", ". "))
    return text.strip()


def parse(parser: StreamParser, text: str, rng: random.Random | None) -> Parsed:
    """Feeds ``text`` to ``parser`` whole (``rng`` None) or in random chunks; what it found (each
    call's ``arguments_json`` checked to parse to its arguments)."""
    events = []
    if rng is None:
        events.extend(parser.feed(text))
    else:
        i = 0
        while i < len(text):
            k = rng.choice((1, 1, 2, 3, 5, 8, 13, 40))
            events.extend(parser.feed(text[i : i + k]))
            i += k
    events.extend(parser.finish())
    out = Parsed()
    for ev in events:
        if ev.kind == "reasoning":
            out.reasoning += ev.text
        elif ev.kind == "text":
            out.text += ev.text
        else:
            assert ev.call is not None
            assert json.loads(ev.call.arguments_json) == ev.call.arguments
            out.calls.append((ev.call.name, ev.call.arguments))
    return out


def parse_twice(new_parser: Callable[[], StreamParser], text: str, seed: int) -> Parsed:
    """:func:`parse` whole and in chunks cut by ``seed``; the two must agree."""
    whole = parse(new_parser(), text, None)
    chunked = parse(new_parser(), text, random.Random(seed))
    assert chunked == whole, "the result depends on how the completion is cut"
    return whole
