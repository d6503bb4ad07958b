"""bertkit.pipeline.corpus: the vocabulary's normalisation chosen for the corpus's script."""

from __future__ import annotations

from bertkit.pipeline.corpus import choose_normalisation
from bertkit.tokenizers import WordPieceTokenizer


KOREAN = ("비행기가 이륙하고 있다. 한 남자가 큰 플루트를 연주하고 있다. 남자가 피자에 치즈를 뿌리고 있다. "
          "세 남자가 체스를 하고 있다. 한 여성이 양파를 자르고 있다.")


def test_normalisation_keeps_hangul_syllables_whole():
    assert choose_normalisation(["The café serves crème brûlée.", "Plain English text."])[:2] == (True, True)
    lowercase, strip, why = choose_normalisation([KOREAN] * 3)
    assert (lowercase, strip) == (True, False) and "Hangul" in why
    # A little Korean inside English text (a name, under 0.1% of the letters) does not turn stripping off.
    assert choose_normalisation(["English words " * 400 + "한"])[1] is True
    tokenizer = WordPieceTokenizer.train([KOREAN] * 20, vocab_size=200, lowercase=lowercase, strip_accents=strip,
                                         show_progress=False)
    pieces = tokenizer.tokenize(KOREAN)
    hangul = [c for p in pieces for c in p.lstrip("#")]
    assert hangul and all(0xAC00 <= ord(c) <= 0xD7A3 or not c.isalpha() for c in hangul)  # syllables, no jamo
    assert tokenizer.decode(tokenizer.encode("비행기가 이륙하고 있다.").input_ids, skip_special_tokens=True) \
        .replace(" ", "") == "비행기가이륙하고있다."
