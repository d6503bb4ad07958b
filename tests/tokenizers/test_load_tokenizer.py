"""load_tokenizer: which kind a directory or file holds, forcing a kind, and the one-line errors; every kind
implements the whole interface of bertkit.tokenizers.base; training takes iterables of text on every kind."""

import json
import shutil

import pytest

from bertkit.tokenizers import (TOKENIZER_KINDS, ByteLevelBPETokenizer, JsonTokenizer, PieceTokenizer,
                                UnigramTokenizer, WordPieceTokenizer, detect_tokenizer_kind, load_tokenizer)
from bertkit.tokenizers.base import INTERFACE

from tokenizer_dirs import NAMES, TEXTS, write_all

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("tokenizers"))


def test_kinds_and_classes(dirs):
    assert TOKENIZER_KINDS == ("wordpiece", "bpe", "unigram", "json", "word")
    expected = {"wordpiece-bertkit": WordPieceTokenizer, "bpe-bertkit": ByteLevelBPETokenizer,
                "unigram-bertkit": UnigramTokenizer, "unigram-transformers": UnigramTokenizer}
    for name, cls in expected.items():
        tok = load_tokenizer(dirs[name])
        assert type(tok) is cls and detect_tokenizer_kind(dirs[name]) == tok.kind
    # Files themselves: vocab.txt, vocab.json (merges.txt beside it), tokenizer.json.
    assert type(load_tokenizer(dirs["wordpiece-bertkit"] / "vocab.txt")) is WordPieceTokenizer
    assert type(load_tokenizer(dirs["bpe-bertkit"] / "vocab.json")) is ByteLevelBPETokenizer
    assert type(load_tokenizer(dirs["unigram-bertkit"] / "tokenizer.json")) is UnigramTokenizer
    assert detect_tokenizer_kind(dirs["bpe-bertkit"] / "tokenizer.json") == "json"
    assert type(load_tokenizer(dirs["bpe-bertkit"] / "tokenizer.json")) is JsonTokenizer


def test_only_a_non_unigram_tokenizer_json_is_the_generic_kind(dirs, tmp_path):
    for name in ("wordpiece-bertkit", "bpe-bertkit"):
        only = tmp_path / name
        only.mkdir()
        shutil.copy(dirs[name] / "tokenizer.json", only / "tokenizer.json")
        assert detect_tokenizer_kind(only) == "json"
        tok = load_tokenizer(only)
        assert type(tok) is JsonTokenizer
        assert tok.encode(TEXTS[0], TEXTS[1]).input_ids == load_tokenizer(dirs[name]).encode(
            TEXTS[0], TEXTS[1]).input_ids


def test_forcing_a_kind(dirs):
    # The tokenizer.json bertkit writes beside vocab.txt, read as the file says.
    forced = load_tokenizer(dirs["wordpiece-bertkit"], kind="json")
    assert type(forced) is JsonTokenizer
    own = load_tokenizer(dirs["wordpiece-bertkit"])
    assert forced.encode(TEXTS[0], TEXTS[2]).input_ids == own.encode(TEXTS[0], TEXTS[2]).input_ids
    assert forced.special_ids == own.special_ids and forced.cls_id == own.cls_id
    assert type(load_tokenizer(dirs["unigram-bertkit"], kind="json")) is JsonTokenizer
    assert type(load_tokenizer(dirs["unigram-bertkit"], kind="unigram")) is UnigramTokenizer


def test_errors_name_the_files(dirs, tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer kind 'sentencepiece'; choose one of wordpiece, bpe, "
                                         "unigram, json"):
        load_tokenizer(dirs["unigram-bertkit"], kind="sentencepiece")
    with pytest.raises(ValueError, match=r"a unigram tokenizer needs tokenizer\.json, but tokenizer\.json is "
                                         r"missing; it has vocab\.txt \(a WordPiece vocabulary\)"):
        vocab_only = tmp_path / "vocab-only"
        vocab_only.mkdir()
        shutil.copy(dirs["wordpiece-bertkit"] / "vocab.txt", vocab_only / "vocab.txt")
        load_tokenizer(vocab_only, kind="unigram")
    with pytest.raises(ValueError, match=r"a wordpiece tokenizer needs vocab\.txt, but vocab\.txt is missing; "
                                         r"it has only tokenizer\.json"):
        load_tokenizer(dirs["unigram-bertkit"], kind="wordpiece")
    with pytest.raises(ValueError, match=r"a bpe tokenizer needs vocab\.json \+ merges\.txt.*vocab\.txt \(a "
                                         r"WordPiece vocabulary\) and tokenizer\.json"):
        load_tokenizer(dirs["wordpiece-bertkit"], kind="bpe")
    with pytest.raises(ValueError, match="a unigram tokenizer needs a Unigram model, this one is WordPiece"):
        load_tokenizer(dirs["wordpiece-bertkit"], kind="unigram")
    with pytest.raises(ValueError, match=r"tokenizer\.json: a bpe tokenizer is not read from this file"):
        load_tokenizer(dirs["unigram-bertkit"] / "tokenizer.json", kind="bpe")
    with pytest.raises(ValueError, match=r"vocab\.json: a json tokenizer is not read from this file \(tokenizer"):
        load_tokenizer(dirs["bpe-bertkit"] / "vocab.json", kind="json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no tokenizer files: expected vocab\.txt .* or tokenizer\.json"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such tokenizer directory"):
        load_tokenizer(tmp_path / "nowhere", kind="json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad/tokenizer\.json: not valid JSON"):
        load_tokenizer(bad)
    (bad / "tokenizer.json").write_text(json.dumps({"version": "1.0", "added_tokens": []}))
    with pytest.raises(ValueError, match=r"bad/tokenizer\.json: not a tokenizer\.json \(no \"model\" object\)"):
        load_tokenizer(bad)
    (bad / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "Nonsense"}}))
    with pytest.raises(ValueError, match=r"bad/tokenizer\.json: not a tokenizer\.json the tokenizers library reads"):
        load_tokenizer(bad)
    with pytest.raises(TypeError, match="cannot be trained"):
        JsonTokenizer.train(TEXTS, vocab_size=100)


@pytest.mark.parametrize("name", NAMES)
def test_every_kind_implements_the_whole_interface(dirs, name):
    tok = load_tokenizer(dirs[name])
    assert isinstance(tok, PieceTokenizer)
    missing = [member for member in INTERFACE if not hasattr(tok, member)]
    assert missing == []
    assert not getattr(type(tok), "__abstractmethods__", None)
    # The special ids and their strings agree, and the framing uses only special ids.
    for role in ("pad", "unk", "cls", "sep", "mask"):
        index, token = getattr(tok, f"{role}_id"), getattr(tok, f"{role}_token")
        assert (index is None) == (token is None) and (index is None or tok.id_to_token(index) == token), role
        assert index is None or index in tok.special_ids
    frame = tok.frame(pair=True)
    assert {i for i, _ in frame.prefix + frame.middle + frame.suffix} <= tok.special_ids
    assert len(frame.middle) == tok.pair_separators and frame.type_b == tok.pair_type_id
    # encode_raw / encode_words / encode_plain agree with tokenize and with each other.
    raw = tok.encode_raw([TEXTS[0]])[0]
    assert raw.tokens == tok.tokenize(TEXTS[0]) and tok.encode_plain([TEXTS[0]]) == [raw.ids]
    assert tok.convert_ids_to_tokens(raw.ids) == [tok.id_to_token(i) for i in raw.ids]
    words = tok.encode_words([["quick", "brown"]])[0]
    assert set(words.word_ids) == {0, 1}
    assert len(tok.word_start_flags()) == tok.vocab_size == len(tok) and len(tok.vocab_hash()) == 64


@pytest.mark.parametrize("cls, size", [(WordPieceTokenizer, 120), (ByteLevelBPETokenizer, 300),
                                       (UnigramTokenizer, 220)])
def test_every_kind_trains_from_an_iterable_of_text(cls, size, tmp_path):
    tok = cls.train((line for line in TEXTS), vocab_size=size, show_progress=False)
    assert tok.vocab_size <= size and tok.encode(TEXTS[0]).input_ids
    assert set(cls.train(texts=TEXTS, vocab_size=size, show_progress=False).get_vocab()) == set(tok.get_vocab())
    with pytest.raises(TypeError, match=r"texts\[1\] is PosixPath.*bertkit\.data\.corpus\.iter_lines"):
        cls.train(["some text", tmp_path / "corpus.txt"], vocab_size=size, show_progress=False)
    with pytest.raises(TypeError, match="not one string"):
        cls.train("a corpus.txt", vocab_size=size, show_progress=False)
    with pytest.raises(ValueError, match="no text to train on"):
        cls.train(["", " \t"], vocab_size=size, show_progress=False)
