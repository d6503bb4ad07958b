"""XLNet tokenizers: `bertkit tokenize` on a directory written by transformers' XLNetTokenizer gives its ids and
segment ids (`A <sep> B <sep> <cls>`, <cls> in segment 2), and `bertkit tokenizer train --kind unigram --xlnet`
writes a directory transformers reads with the same ids, XLNet's special tokens at ids 0-8 and left padding."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit import cli
from bertkit.tokenizers import load_tokenizer
from bertkit.tokenizers.unigram import XLNET_SPECIAL_TOKENS

from conftest import TINY_TEXT

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CASES = [("The quick brown fox, naïve café!", None), ("Pack my box", "with five dozen jugs!"),
         ("  spaces\tand tabs  ", "x"), ("unseen QQQ zzz 12345", None)]


def run_tokenize(capsys, directory, text, pair=None) -> dict:
    args = ["tokenize", "--model-or-vocab", str(directory), "--json", text] + (["--pair", pair] if pair else [])
    assert cli.main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def transformers_dir(tmp_path_factory):
    """A tiny Unigram trained with the tokenizers library, XLNet's special tokens first, saved by transformers'
    XLNetTokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    engine = Tokenizer(models.Unigram())
    engine.pre_tokenizer = pre_tokenizers.Metaspace()
    engine.train_from_iterator(TINY_TEXT, trainers.UnigramTrainer(
        vocab_size=150, special_tokens=list(XLNET_SPECIAL_TOKENS), unk_token="<unk>", show_progress=False))
    vocab = [(piece, score) for piece, score in json.loads(engine.to_str())["model"]["vocab"]]
    directory = tmp_path_factory.mktemp("xlnet-tok")
    transformers.XLNetTokenizer(vocab=vocab).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus") / "text.txt"
    corpus.write_text("\n".join(TINY_TEXT) + "\n", encoding="utf-8")
    out = tmp_path_factory.mktemp("ours")
    assert cli.main(["tokenizer", "train", "--kind", "unigram", "--xlnet", "--vocab-size", "150", "--files",
                     str(corpus), "--out", str(out), "--quiet"]) == 0
    return out


def test_transformers_xlnet_directory_tokenizes_alike(transformers_dir, capsys):
    auto = transformers.AutoTokenizer.from_pretrained(transformers_dir)
    assert type(auto).__name__.startswith("XLNetTokenizer")
    for text, pair in CASES:
        ours = run_tokenize(capsys, transformers_dir, text, pair)
        want = auto(text, pair, return_token_type_ids=True)
        assert ours["input_ids"] == want["input_ids"]
        assert ours["token_type_ids"] == want["token_type_ids"]
        assert ours["tokens"][-2:] == ["<sep>", "<cls>"] and ours["token_type_ids"][-1] == 2


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=40))
def test_any_text_gives_transformers_ids(transformers_dir, text):
    ours = load_tokenizer(transformers_dir).encode(text)
    auto = _auto(transformers_dir)
    assert ours.input_ids == auto(text)["input_ids"]


_AUTOS: dict = {}


def _auto(directory):
    if directory not in _AUTOS:
        _AUTOS[directory] = transformers.AutoTokenizer.from_pretrained(directory)
    return _AUTOS[directory]


def test_trained_xlnet_tokenizer_has_xlnets_layout_and_transformers_reads_it(trained_dir, capsys):
    tok = load_tokenizer(trained_dir)
    assert [tok.convert_ids_to_tokens([i])[0] for i in range(9)] == list(XLNET_SPECIAL_TOKENS)
    assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == (3, 4, 5, 6)
    auto = transformers.AutoTokenizer.from_pretrained(trained_dir)
    assert auto.padding_side == "left" and auto.cls_token_id == 3 and auto.mask_token_id == 6
    for text, pair in CASES:
        ours = run_tokenize(capsys, trained_dir, text, pair)
        want = auto(text, pair, return_token_type_ids=True)
        assert ours["input_ids"] == want["input_ids"] and ours["token_type_ids"] == want["token_type_ids"]
        types = [0] * (ours["input_ids"].index(4) + 1)
        assert ours["token_type_ids"][:len(types)] == types and ours["token_type_ids"][-1] == 2


def test_xlnet_option_is_refused_with_sentinels_or_another_kind(tmp_path, capsys):
    corpus = tmp_path / "t.txt"
    corpus.write_text("a b c\n", encoding="utf-8")
    for extra in (["--kind", "unigram", "--extra-ids", "3"], ["--kind", "bpe"]):
        assert cli.main(["tokenizer", "train", *extra, "--xlnet", "--files", str(corpus), "--out",
                         str(tmp_path / "o")]) != 0
        assert "--xlnet" in capsys.readouterr().err
