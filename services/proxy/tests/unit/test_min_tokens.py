"""The token lower bound that refuses an oversized prompt before it is tokenized is a lower bound."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, normalizers
from tokenizers.models import WordLevel

from openforge_proxy.domain.tokens import TokenizerCodec
from openforge_testing.fakes import build_fake_tokenizer


def _texts() -> list[str]:
    rng = random.Random(7)
    alphabet = "abcdefghij klmnop\n\t  {}\"':,.-_=" + "éüß中文字😀\u0301"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3000))) for _ in range(60)]
    return [*texts, " " * 5000, "=" * 4000, "\n" * 3000, "lorem ipsum " * 500, "<|im_start|>user\nhi<|im_end|>"]


def test_the_bound_never_exceeds_the_real_count() -> None:
    codec = TokenizerCodec(build_fake_tokenizer(1024), "<|im_start|>")
    bounds = []
    for text in _texts():
        bound = codec.min_tokens(text)
        assert 1 <= bound <= len(codec.encode(text)), text[:40]
        bounds.append(bound)
    assert max(bounds) >= 250  # it bounds, not only says 1
    # a normalizer that shortens the text is accounted for
    tok = build_fake_tokenizer(1024)
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("aaaa", "a")])
    shrinking = TokenizerCodec(tok, "<|im_start|>")
    for text in ["aaaa" * 2000, "ﬁ" * 1000 + "a" * 100]:
        assert 1 <= shrinking.min_tokens(text) <= len(shrinking.encode(text))


def test_short_texts_and_unbounded_vocabularies_give_zero() -> None:
    codec = TokenizerCodec(build_fake_tokenizer(1024), "<|im_start|>")
    text = "lorem ipsum " * 500
    assert codec.min_tokens(text, above=len(text)) == 0  # its length alone shows it fits
    assert codec.min_tokens("") == 0
    # a vocabulary whose unknown token stands for any word has no bound
    unk = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert TokenizerCodec(unk).min_tokens(text) == 0
