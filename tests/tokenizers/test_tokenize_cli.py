"""`bertkit tokenize --json` gives transformers' AutoTokenizer's ids, token types, offsets and word ids for every
tokenizer kind, trained by bertkit or written by transformers; `bertkit tokenizer train` for every kind."""

import json

import pytest

from bertkit import cli
from bertkit.tokenizers import UnigramTokenizer, load_tokenizer

from tokenizer_dirs import NAMES, TEXTS, google_cut, write_all

transformers = pytest.importorskip("transformers")

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Café, naïve, résumé: accents!",
             "  two  spaces\tand tab  ", "中文字符 and 日本語 🙂", "unseenword xyzzy QQQ 12345", ""]
PAIRS = [("A journey of a thousand miles", "begins with a single step."), ("Pack my box", "with five dozen jugs!"),
         ("short", "a much longer second text that is cut first when the pair is truncated to fit"), ("", "x y")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture(scope="module")
def autos(dirs):
    return {name: transformers.AutoTokenizer.from_pretrained(str(path)) for name, path in dirs.items()}


def run_tokenize(capsys, directory, text, pair=None, max_length=None) -> dict:
    args = ["tokenize", "--model-or-vocab", str(directory), "--json", text]
    if pair is not None:
        args += ["--pair", pair]
    if max_length is not None:
        args += ["--max-length", str(max_length)]
    assert cli.main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def theirs(auto, text, pair=None, max_length=None):
    kwargs = {"truncation": "longest_first", "max_length": max_length} if max_length else {}
    return auto(text, pair, return_offsets_mapping=True, return_token_type_ids=True, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_single_texts_ids_offsets_and_word_ids(dirs, autos, capsys, name):
    for text in SENTENCES:
        ours = run_tokenize(capsys, dirs[name], text)
        want = theirs(autos[name], text)
        assert ours["input_ids"] == want["input_ids"], (name, text)
        assert ours["token_type_ids"] == want["token_type_ids"]
        assert ours["attention_mask"] == want["attention_mask"]
        assert [tuple(o) for o in ours["offsets"]] == [tuple(o) for o in want["offset_mapping"]], (name, text)
        assert ours["word_ids"] == want.word_ids(), (name, text)
        assert ours["tokens"] == want.tokens()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("max_length", [None, 9, 14])
def test_pairs_with_and_without_truncation(dirs, autos, capsys, name, max_length):
    tok = load_tokenizer(dirs[name])
    for text, pair in PAIRS:
        ours = run_tokenize(capsys, dirs[name], text, pair, max_length)
        want = theirs(autos[name], text, pair, max_length)
        google = google_cut(tok, text, pair, max_length) if tok.kind == "wordpiece" and max_length else None
        if google is not None:  # BERT's own pair rule, where transformers' differs
            assert ours["input_ids"] == tok.build_inputs(*google)[0]
            assert len(ours["input_ids"]) == max_length
            continue
        assert ours["input_ids"] == want["input_ids"], (name, text, pair, max_length)
        assert ours["token_type_ids"] == want["token_type_ids"]
        assert ours["sequence_ids"] == want.sequence_ids()
        if max_length:
            assert len(ours["input_ids"]) <= max_length
    # A single text is truncated too, its closing special tokens kept.
    long = " ".join(TEXTS[:3])
    ours = run_tokenize(capsys, dirs[name], long, max_length=7)
    assert ours["input_ids"] == theirs(autos[name], long, max_length=7)["input_ids"]
    assert len(ours["input_ids"]) == 7


def test_kinds_found_in_each_directory(dirs):
    kinds = {name: load_tokenizer(path).kind for name, path in dirs.items()}
    assert kinds["wordpiece-bertkit"] == "wordpiece" and kinds["bpe-bertkit"] == "bpe"
    assert kinds["unigram-bertkit"] == kinds["unigram-transformers"] == "unigram"
    # transformers 5 writes only tokenizer.json (read as the file says); older versions also write vocab files.
    assert kinds["wordpiece-transformers"] in (
        "json" if not (dirs["wordpiece-transformers"] / "vocab.txt").exists() else "wordpiece",)
    assert kinds["bpe-transformers"] in ("json" if not (dirs["bpe-transformers"] / "merges.txt").exists() else "bpe",)


def test_tokenize_options_and_errors(dirs, capsys):
    forced = run_tokenize(capsys, dirs["wordpiece-bertkit"], "The dog")
    assert cli.main(["tokenize", "--model-or-vocab", str(dirs["wordpiece-bertkit"]), "--tokenizer-kind", "json",
                     "--json", "The dog"]) == 0
    assert json.loads(capsys.readouterr().out)["input_ids"] == forced["input_ids"]
    assert cli.main(["tokenize", "--model-or-vocab", str(dirs["unigram-bertkit"]), "--cased", "The dog"]) == 2
    assert "--cased applies to a WordPiece vocabulary" in capsys.readouterr().err
    assert cli.main(["tokenize", "--model-or-vocab", str(dirs["unigram-bertkit"]), "--tokenizer-kind", "bpe",
                     "x"]) == 2
    assert "a bpe tokenizer needs vocab.json + merges.txt" in capsys.readouterr().err
    # Plain output: one line per token.
    assert cli.main(["tokenize", "--model-or-vocab", str(dirs["unigram-bertkit"]), "a b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].split() == ["</s>", "1", "0"]


def test_cli_trains_every_kind_from_files(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    base = ["tokenizer", "train", "--files", str(corpus), "--quiet"]
    assert cli.main([*base, "--kind", "unigram", "--vocab-size", "120", "--extra-ids", "5",
                     "--out", str(tmp_path / "u")]) == 0
    assert "5 extra ids" in capsys.readouterr().out
    tok = load_tokenizer(tmp_path / "u")
    assert isinstance(tok, UnigramTokenizer) and tok.extra_ids == 5 and tok.vocab_size <= 120
    assert tok.id_to_token(tok.vocab_size - 1) == "<extra_id_0>"
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "u"))
    assert auto(TEXTS[0])["input_ids"] == tok.encode(TEXTS[0]).input_ids
    assert cli.main([*base, "--kind", "wordpiece", "--vocab-size", "120", "--min-frequency", "1",
                     "--out", str(tmp_path / "w")]) == 0
    assert load_tokenizer(tmp_path / "w").kind == "wordpiece"
    assert cli.main([*base, "--kind", "unigram", "--cased", "--out", str(tmp_path / "x")]) == 2
    assert "WordPiece options" in capsys.readouterr().err
    assert cli.main([*base, "--kind", "bpe", "--extra-ids", "3", "--out", str(tmp_path / "x")]) == 2
    assert "--extra-ids is a unigram option" in capsys.readouterr().err
    assert cli.main([*base, "--kind", "unigram", "--min-frequency", "3", "--out", str(tmp_path / "x")]) == 2
    assert "--min-frequency is a wordpiece / bpe option" in capsys.readouterr().err
    # Corpus errors still name the file and line.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\n\xff bad\n")
    assert cli.main(["tokenizer", "train", "--files", str(bad), "--kind", "unigram", "--quiet", "--out",
                     str(tmp_path / "x")]) == 2
    assert "bad.txt:2" in capsys.readouterr().err
