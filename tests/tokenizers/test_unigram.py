"""The Unigram kind (T5's scheme): trained in-process from iterables, T5's ids and framing, sentinels counted
down from the last id, saved so that transformers' AutoTokenizer gives the same ids, read back by load_tokenizer."""

import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertkit.tokenizers import UnigramTokenizer, load_tokenizer
from bertkit.tokenizers.unigram import SPECIAL_TOKENS, canonical_order

from tokenizer_dirs import TEXTS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def t5() -> UnigramTokenizer:
    return UnigramTokenizer.train(TEXTS, vocab_size=260, show_progress=False)  # the default 100 extra ids


@pytest.fixture(scope="module")
def t5_dir(t5, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("t5")
    t5.save(path)
    return path


@pytest.fixture(scope="module")
def auto(t5_dir):
    return transformers.AutoTokenizer.from_pretrained(str(t5_dir))


def test_t5_layout_specials_first_and_sentinels_counted_down_at_the_end(t5):
    assert [t5.id_to_token(i) for i in range(3)] == list(SPECIAL_TOKENS)
    assert (t5.pad_id, t5.sep_id, t5.unk_id, t5.cls_id, t5.mask_id) == (0, 1, 2, None, None)
    assert t5.extra_ids == 100 and t5.vocab_size <= 260
    last = t5.vocab_size - 1
    assert t5.token_to_id("<extra_id_0>") == last and t5.token_to_id("<extra_id_99>") == last - 99
    assert t5.sentinel_ids == [last - n for n in range(100)]
    assert not t5.id_to_token(last - 100).startswith("<extra_id_")  # the learned pieces stop right before
    assert set(t5.sentinel_ids) <= t5.special_ids and {0, 1, 2} <= t5.special_ids
    assert len(t5.get_vocab()) == t5.vocab_size


def test_framing_is_t5s(t5):
    a, b = t5.tokenize("the quick fox"), t5.tokenize("a dog")
    enc = t5.encode("the quick fox", "a dog")
    assert enc.tokens == [*a, "</s>", *b, "</s>"] and set(enc.token_type_ids) == {0}
    assert enc.sequence_ids == [*[0] * len(a), None, *[1] * len(b), None]
    assert t5.encode("the quick fox").tokens == [*a, "</s>"]
    assert (t5.pair_separators, t5.pair_type_id, t5.num_special_tokens(), t5.num_special_tokens(True)) == (1, 0, 1, 2)
    assert t5.encode("").input_ids == [1]
    assert a[0].startswith("▁")  # SentencePiece's space mark, put before the text


def test_sentinels_in_text_are_single_tokens_like_transformers(t5, auto):
    text = "The quick <extra_id_0> over the <extra_id_1> dog <extra_id_99>"
    enc = t5.encode(text)
    assert [t5.sentinel_ids[0], t5.sentinel_ids[1], t5.sentinel_ids[99]] == [
        i for i in enc.input_ids if i in set(t5.sentinel_ids)]
    assert enc.input_ids == auto(text)["input_ids"]
    assert auto.convert_tokens_to_ids("<extra_id_0>") == t5.vocab_size - 1
    assert t5.decode(enc.input_ids) == auto.decode(enc.input_ids, skip_special_tokens=True)
    assert "<extra_id_0>" in t5.decode(enc.input_ids, skip_special_tokens=False)


def test_saved_files_and_transformers_reads_them_the_same(t5, t5_dir, auto):
    assert sorted(p.name for p in t5_dir.iterdir()) == ["special_tokens_map.json", "tokenizer.json",
                                                        "tokenizer_config.json"]
    config = json.loads((t5_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["eos_token"] == "</s>"
    assert config["additional_special_tokens"][:2] == ["<extra_id_0>", "<extra_id_1>"]
    assert set(auto.all_special_ids) == set(t5.special_ids)
    again = load_tokenizer(t5_dir)
    assert isinstance(again, UnigramTokenizer) and again.kind == "unigram"
    assert again.vocab_hash() == t5.vocab_hash() and again.get_vocab() == t5.get_vocab()
    for text, pair in [(TEXTS[0], None), (TEXTS[-4], TEXTS[-3]), ("ﬁ①  Ⅻ\ttabs", "x")]:
        assert again.encode(text, pair).input_ids == t5.encode(text, pair).input_ids
        assert auto(text, pair)["input_ids"] == t5.encode(text, pair).input_ids


def test_normalisation_is_nfkc_with_whitespace_runs_as_one_space(t5):
    assert t5.tokenize("ﬁ ① \u00a0 x") == t5.tokenize("fi 1 x")
    assert t5.tokenize("  a\t\n b  ") == t5.tokenize("a b")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_decode_gives_the_normalised_text_back(t5, data):
    """With only characters the vocabulary has (no unknown piece), decoding gives the text with its whitespace
    runs collapsed and stripped: nothing else of it is lost."""
    letters = sorted({c for c in "".join(TEXTS) if not c.isspace() and t5.token_to_id(c) is not None
                      and c == unicodedata.normalize("NFKC", c) and c not in "<>"})
    text = data.draw(st.text(alphabet=st.sampled_from(letters + [" ", "\t", "\n", "\u3000"]), max_size=50))
    ids = t5.encode(text).input_ids
    assert t5.unk_id not in ids
    assert t5.decode(ids) == " ".join(text.split())


def test_extra_ids_option_and_word_starts():
    plain = UnigramTokenizer.train(iter(TEXTS), vocab_size=120, extra_ids=0, show_progress=False)
    assert plain.extra_ids == 0 and plain.sentinel_ids == [] and plain.vocab_size <= 120
    three = UnigramTokenizer.train(iter(TEXTS), vocab_size=120, extra_ids=3, show_progress=False)
    assert [three.id_to_token(three.vocab_size - 1 - n) for n in range(3)] == [
        "<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]
    assert three.vocab_hash() != plain.vocab_hash()
    flags = three.word_start_flags()
    for token, index in three.get_vocab().items():
        assert flags[index] == (token.startswith("▁") or index in three.special_ids), token


def test_training_takes_iterables_and_refuses_what_is_not_text(tmp_path):
    def lines():
        yield from TEXTS

    assert UnigramTokenizer.train(texts=lines(), vocab_size=120, extra_ids=2, show_progress=False).extra_ids == 2
    with pytest.raises(TypeError, match=r"texts\[0\] is PosixPath, not str.*iter_lines"):
        UnigramTokenizer.train([tmp_path / "corpus.txt"], vocab_size=120, show_progress=False)
    with pytest.raises(TypeError, match="not one string"):
        UnigramTokenizer.train("one string", vocab_size=120, show_progress=False)
    with pytest.raises(ValueError, match="no text to train on"):
        UnigramTokenizer.train(["", "  \n"], vocab_size=120, extra_ids=0, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size 50 is too small"):
        UnigramTokenizer.train(TEXTS, vocab_size=50, show_progress=False)
    with pytest.raises(ValueError, match=r"vocab_size 110 is too small for this text: 10 pieces \(after 100 extra"):
        UnigramTokenizer.train(TEXTS, vocab_size=110, show_progress=False)
    with pytest.raises(ValueError, match="extra_ids must be >= 0"):
        UnigramTokenizer.train(TEXTS, vocab_size=200, extra_ids=-1, show_progress=False)


def test_training_gives_the_same_file_every_time():
    first = UnigramTokenizer.train(TEXTS * 3, vocab_size=160, extra_ids=5, show_progress=False).backend.to_str()
    for _ in range(3):  # the bare trainer's order of equal and last-bit-different scores changes nearly every run
        again = UnigramTokenizer.train(TEXTS * 3, vocab_size=160, extra_ids=5, show_progress=False)
        assert again.backend.to_str() == first


def test_canonical_order_redeals_the_kept_characters_rounds_and_sorts_ties():
    # The trainer gave back the characters q, c, z (pruned, but needed) the scores min, min + 1e-4, min + 2e-4 in
    # its hash set's order; "xy" holds the lowest score it learned; a and b tie; one score has last-bit noise.
    pieces = [("▁the", -2.0 + 3e-15), ("b", -5.0), ("a", -5.0), ("xy", -9.0), ("z", -9.0 + 2e-4),
              ("q", -9.0), ("c", -9.0 + 1e-4)]
    assert canonical_order(pieces) == [("▁the", -2.0), ("a", -5.0), ("b", -5.0), ("z", -8.9998),
                                       ("q", -8.9999), ("c", -9.0), ("xy", -9.0)]
    assert canonical_order(list(reversed(pieces))) == canonical_order(pieces)
    assert canonical_order([]) == []


def test_prepare_shards_with_a_unigram_and_a_tokenizer_json_directory(t5, t5_dir, tmp_path):
    """`bertkit prepare` takes the new kinds: shards hold the engine's ids, word starts are the "▁" pieces, the
    manifest records the kind and the special ids (None where T5 has none), and the tokenizer comes back."""
    from bertkit import cli
    from bertkit.data.manifest import Manifest
    from bertkit.data.shards import ShardedCorpus

    docs = [TEXTS[i:i + 3] for i in range(0, 12, 3)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    json_dir = tmp_path / "json"
    json_dir.mkdir()
    (json_dir / "tokenizer.json").write_bytes((t5_dir / "tokenizer.json").read_bytes())
    for source, kind in ((t5_dir, "unigram"), (json_dir, "json")):  # the file alone, read as a generic one
        out = tmp_path / f"out-{kind}"
        assert cli.main(["prepare", "--corpus", str(corpus), "--tokenizer", str(source), "--tokenizer-kind", kind,
                         "--out", str(out), "--quiet"]) == 0
        manifest = Manifest.load(out)
        entry = manifest.data["tokenizer"]
        assert manifest.tokenizer_kind == kind and entry["special_ids"] == {
            "cls": None, "sep": 1, "pad": 0, "mask": None, "unk": 2}
        tok = manifest.load_tokenizer()
        assert tok.kind == kind and tok.vocab_hash() == entry["vocab_hash"]
        data = ShardedCorpus(out)
        for (ids, starts), lines in zip(data.documents_in_order(), docs):
            assert [s.tolist() for s in ids] == t5.encode_plain(lines)
            for s_ids, s_starts in zip(ids, starts):
                pieces = t5.convert_ids_to_tokens(s_ids)
                assert s_starts.tolist() == [k == 0 or p.startswith("▁") for k, p in enumerate(pieces)]
