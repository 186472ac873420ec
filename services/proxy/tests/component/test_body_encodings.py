"""Compressed request bodies: every gzip member and zstd frame is decoded, trailing or
truncated data is refused with a 400 in the protocol's shape, and a small body that
expands past the limit is refused without its expansion being held in memory."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard

from openforge_testing.fakes import ScriptedInferenceServer

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


def _raw() -> bytes:
    body = {"model": "m", "stream": False, "messages": [{"role": "user", "content": "hello " * 50}]}
    return json.dumps(body).encode()


def _halves(raw: bytes) -> tuple[bytes, bytes]:
    return raw[: len(raw) // 2], raw[len(raw) // 2 :]


def _assert_openai_400(reply: Any, *words: str) -> None:
    assert reply.status == 400, reply.body
    err = reply.json()["error"]
    assert err["type"] == "invalid_request_error"
    for word in words:
        assert word in err["message"], err["message"]


async def _proxy(model_dir: Path, start_proxy: Any, limit: int | None = None) -> tuple[Any, str]:
    proxy = await start_proxy(ScriptedInferenceServer(model_dir, default=lambda prompt: "hi there"))
    if limit is not None:
        proxy.http._limit = limit
    return proxy, proxy.session()


def _multi_gzip(raw: bytes) -> bytes:
    a, b = _halves(raw)
    return gzip.compress(a) + gzip.compress(b)


def _multi_zstd(raw: bytes) -> bytes:
    a, b = _halves(raw)
    z = zstandard.ZstdCompressor()
    return z.compress(a) + z.compress(b)


@pytest.mark.parametrize(("encoding", "make"), [("gzip", _multi_gzip), ("zstd", _multi_zstd)])
async def test_every_member_or_frame_is_decoded(model_dir: Path, start_proxy: Any, encoding: str, make: Any) -> None:
    proxy, key = await _proxy(model_dir, start_proxy)
    reply = await proxy.post(CHAT, make(_raw()), key=key, bearer=True, headers={"Content-Encoding": encoding})
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == "hi there"
    assert proxy.fake.seen


@pytest.mark.parametrize(("encoding", "make"), [("gzip", _multi_gzip), ("zstd", _multi_zstd)])
async def test_the_limit_applies_to_all_members_together(
    model_dir: Path, start_proxy: Any, encoding: str, make: Any
) -> None:
    raw = _raw()
    proxy, key = await _proxy(model_dir, start_proxy, limit=len(raw) - 1)
    reply = await proxy.post(CHAT, make(raw), key=key, bearer=True, headers={"Content-Encoding": encoding})
    assert reply.status == 413, reply.body
    assert reply.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("encoding", "data", "words"),
    [
        ("gzip", gzip.compress(_raw()) + b"garbage!", ("gzip", "after gzip member 1")),
        ("gzip", _multi_gzip(_raw()) + b"\x00\x00", ("gzip", "after gzip member 2")),
        ("gzip", gzip.compress(_raw())[:-6], ("gzip", "truncated")),
        ("deflate", zlib.compress(_raw()) + b"x", ("deflate", "after the end")),
        ("deflate", zlib.compress(_raw())[:-3], ("deflate", "truncated")),
        ("zstd", zstandard.ZstdCompressor().compress(_raw()) + b"garbage!", ("zstd", "Unknown frame descriptor")),
    ],
)
async def test_data_after_the_last_member_or_a_cut_stream_is_refused(
    model_dir: Path, start_proxy: Any, encoding: str, data: bytes, words: tuple[str, ...]
) -> None:
    proxy, key = await _proxy(model_dir, start_proxy)
    reply = await proxy.post(CHAT, data, key=key, bearer=True, headers={"Content-Encoding": encoding})
    _assert_openai_400(reply, *words)
    assert proxy.fake.seen == []


async def test_stacked_encodings_are_refused_in_the_protocols_shape(model_dir: Path, start_proxy: Any) -> None:
    proxy, key = await _proxy(model_dir, start_proxy)
    data = gzip.compress(gzip.compress(_raw()))
    reply = await proxy.post(CHAT, data, key=key, bearer=True, headers={"Content-Encoding": "gzip, gzip"})
    _assert_openai_400(reply, "Content-Encoding", "gzip, gzip")
    anthropic = await proxy.post(MESSAGES, data, key=key, headers={"Content-Encoding": "gzip, gzip"})
    assert anthropic.status == 400, anthropic.body
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "invalid_request_error"


async def test_a_zstd_bomb_is_refused_without_holding_its_expansion(model_dir: Path, start_proxy: Any) -> None:
    proxy, key = await _proxy(model_dir, start_proxy, limit=1 << 20)
    z = zstandard.ZstdCompressor(level=3).compressobj()
    block = b" " * (1 << 20)
    bomb = b"".join(z.compress(block) for _ in range(128)) + z.flush()
    assert len(bomb) < 64 << 10  # one read of the body
    tracemalloc.start()
    try:
        reply = await proxy.post(CHAT, bomb, key=key, bearer=True, headers={"Content-Encoding": "zstd"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reply.status == 413, reply.body
    assert peak < 16 << 20, f"peak {peak >> 20} MiB while refusing a 128 MiB expansion"
