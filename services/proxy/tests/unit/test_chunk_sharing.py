"""Sessions share the ids of large chunks they all send; the ids are exactly those of a plain encode."""

from __future__ import annotations

from openforge_proxy.domain.tokens import ChunkCache, IdsBuilder, TokenizerCodec
from openforge_testing.fakes import build_fake_tokenizer

SYSTEM = "<|im_start|>system\n" + " ".join(f"rule {i}: keep the tests green." for i in range(400)) + "<|im_end|>\n"


def _encode(codec: TokenizerCodec, text: str, cache: ChunkCache) -> list[int]:
    out = IdsBuilder()
    codec.encode_into(text, cache, out)
    built = out.build()
    assert built.packed == codec.pack(built.ids.tolist())
    return built.ids.tolist()


def test_large_chunks_are_shared_from_the_second_session_on() -> None:
    codec = TokenizerCodec(build_fake_tokenizer(1024), "<|im_start|>")
    shared = codec.shared
    assert len(SYSTEM) >= shared.min_chars
    texts = [SYSTEM + f"<|im_start|>user\nsession {i} <|im_start|>x<|im_end|>\n" for i in range(4)]
    for i, text in enumerate(texts):
        assert _encode(codec, text, ChunkCache()) == codec.encode(text)
        # kept once a second session encoded it; the small per-session chunks never are
        assert len(shared) == (0 if i == 0 else 1)
    assert shared.get(SYSTEM) is not None
    assert shared.get(texts[0][len(SYSTEM) :]) is None


def test_shared_store_is_bounded() -> None:
    codec = TokenizerCodec(build_fake_tokenizer(1024), "<|im_start|>")
    codec.shared = type(codec.shared)(max_chars=3 * len(SYSTEM), min_chars=16, max_seen=8)
    for i in range(20):
        text = SYSTEM.replace("rule", f"r{i}")
        for _ in range(2):
            assert _encode(codec, text, ChunkCache()) == codec.encode(text)
    assert 1 <= len(codec.shared) <= 3
