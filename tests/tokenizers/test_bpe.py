"""Byte-level BPE (RoBERTa's tokenizer): trained in-process, and giving transformers' ids and offsets."""

import json
import shutil

import pytest

from bertkit.tokenizers.bpe import SPECIAL_TOKENS, ByteLevelBPETokenizer, truncate_pair

from conftest import TINY_TEXT

transformers = pytest.importorskip("transformers")

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Café, naïve, résumé!", "  two  spaces  ",
             "中文字符 and 日本語 🙂", "She sells sea shells by the sea <mask> shore.", "", "unseenword xyzzy"]
PAIRS = [("A journey of a thousand miles", "begins with a single step."), ("Pack my box", "with five dozen jugs!"),
         ("short", "a much longer second text that will be cut first when we truncate the pair")]


@pytest.fixture(scope="module")
def bpe() -> ByteLevelBPETokenizer:
    return ByteLevelBPETokenizer.train(texts=TINY_TEXT, vocab_size=400, min_frequency=1, show_progress=False)


@pytest.fixture(scope="module")
def theirs(bpe, tmp_path_factory):
    """transformers' RobertaTokenizerFast built from nothing but our vocab.json and merges.txt.

    <mask> is given as roberta-base declares it (lstrip: it takes the space before it); transformers 5 no longer
    defaults to that when it has only the two files.
    """
    full = tmp_path_factory.mktemp("bpe")
    bpe.save(full)
    bare = tmp_path_factory.mktemp("bpe-files")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(full / name, bare / name)
    mask = transformers.AddedToken("<mask>", lstrip=True, rstrip=False)
    return transformers.RobertaTokenizerFast.from_pretrained(str(bare), mask_token=mask)


def test_special_tokens_have_fairseq_ids_and_bytes_are_never_unknown(bpe):
    assert [bpe.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (bpe.cls_id, bpe.pad_id, bpe.sep_id, bpe.unk_id, bpe.mask_id) == (0, 1, 2, 3, 4)
    assert bpe.vocab_size == 400
    enc = bpe.encode("🙂 zzz")
    assert bpe.unk_id not in enc.input_ids
    assert bpe.decode(enc.input_ids) == "🙂 zzz"
    assert bpe.encode("").input_ids == [0, 2]
    assert bpe.tokenize("the lazy")[1].startswith("Ġ")  # the space belongs to the next word


def test_pair_layout(bpe):
    enc = bpe.encode("the fox", "the dog")
    a, b = len(bpe.tokenize("the fox")), len(bpe.tokenize("the dog"))
    assert enc.input_ids[0] == 0 and enc.input_ids[a + 1: a + 3] == [2, 2] and enc.input_ids[-1] == 2
    assert len(enc) == a + b + 4 and set(enc.token_type_ids) == {0}
    assert enc.sequence_ids == [None, *[0] * a, None, None, *[1] * b, None]
    assert enc.special_tokens_mask == [1, *[0] * a, 1, 1, *[0] * b, 1]


@pytest.mark.parametrize("text", SENTENCES)
def test_single_texts_match_transformers(bpe, theirs, text):
    ours = bpe.encode(text)
    hf = theirs(text, return_offsets_mapping=True)
    assert ours.input_ids == hf["input_ids"]
    assert ours.offsets == [tuple(o) for o in hf["offset_mapping"]]
    assert bpe.decode(ours.input_ids) == theirs.decode(hf["input_ids"], skip_special_tokens=True)


@pytest.mark.parametrize("max_length", [None, 12, 9])
def test_pairs_with_truncation_and_padding_match_transformers(bpe, theirs, max_length):
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    ours = bpe.encode_batch(firsts, seconds, max_length=max_length, padding=True)
    hf = theirs(firsts, seconds, max_length=max_length, truncation="longest_first" if max_length else False,
                padding=True, return_offsets_mapping=True)
    assert [e.input_ids for e in ours] == hf["input_ids"]
    assert [e.attention_mask for e in ours] == hf["attention_mask"]
    assert [e.offsets for e in ours] == [[tuple(o) for o in row] for row in hf["offset_mapping"]]
    if max_length:
        assert all(len(e) == max_length for e in ours)


def test_save_and_load_round_trip(bpe, tmp_path):
    bpe.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "tokenizer.json", "tokenizer_config.json",
                                                          "vocab.json"]
    assert (tmp_path / "merges.txt").read_text().splitlines()[0] == "#version: 0.2"
    again = ByteLevelBPETokenizer.from_pretrained(tmp_path)
    assert again.vocab_hash() == bpe.vocab_hash() and again.get_vocab() == bpe.get_vocab()
    assert [again.encode(t).input_ids for t in SENTENCES] == [bpe.encode(t).input_ids for t in SENTENCES]
    # transformers reads the directory the same way, with tokenizer.json or from the files and config alone.
    full = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert [full(t)["input_ids"] for t in SENTENCES] == [bpe.encode(t).input_ids for t in SENTENCES]
    (tmp_path / "tokenizer.json").unlink()
    files = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(files).__name__ == "RobertaTokenizer"
    assert [files(t)["input_ids"] for t in SENTENCES] == [bpe.encode(t).input_ids for t in SENTENCES]


def test_bad_files_are_named(tmp_path, bpe):
    bpe.save(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t\nthree parts here\n")
    with pytest.raises(ValueError, match=r"merges.txt:3: a merge is two symbols"):
        ByteLevelBPETokenizer.from_pretrained(tmp_path)
    bpe.save(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    del vocab["<mask>"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match=r"lacks the special tokens \['<mask>'\]"):
        ByteLevelBPETokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(ValueError, match="too small"):
        ByteLevelBPETokenizer.train(texts=["a b"], vocab_size=100, show_progress=False)


@pytest.mark.parametrize("n_a, n_b, budget, kept", [
    (3, 4, 10, (3, 4)), (2, 9, 6, (2, 4)), (9, 2, 6, (4, 2)), (6, 7, 5, (2, 3)), (7, 6, 5, (3, 2)),
    (4, 4, 5, (2, 3)), (8, 1, 0, (0, 0)), (5, None, 3, (3, 0))])
def test_pair_truncation_is_transformers_longest_first(n_a, n_b, budget, kept):
    assert truncate_pair(n_a, n_b, budget) == kept


def test_roberta_model_directory_with_bpe_tokenizer_works_in_transformers(bpe, tmp_path):
    """A RoBERTa directory written by bertkit: transformers' Auto classes read model and tokenizer alike."""
    import torch

    from bertkit.config import BertConfig
    from bertkit.models import BertForMaskedLM

    config = BertConfig.for_family("roberta", vocab_size=bpe.vocab_size, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=37, max_position_embeddings=66,
                                   type_vocab_size=1, pad_token_id=bpe.pad_id, bos_token_id=bpe.bos_id,
                                   eos_token_id=bpe.eos_id)
    torch.manual_seed(0)
    ours = BertForMaskedLM(config).eval()
    ours.save_pretrained(tmp_path / "m", tokenizer=bpe)
    ours.save_pretrained(tmp_path / "m")  # a re-save keeps the tokenizer files
    assert {"vocab.json", "merges.txt", "tokenizer.json"} <= {p.name for p in (tmp_path / "m").iterdir()}
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    hf_model = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "m")).eval()
    texts = ["The lazy dog <mask>.", "A single step, then a thousand miles"]
    encs = bpe.encode_batch(texts, padding=True)
    hf = hf_tok(texts, padding=True, return_tensors="pt")
    ids = torch.tensor([e.input_ids for e in encs])
    mask = torch.tensor([e.attention_mask for e in encs])
    assert torch.equal(ids, hf["input_ids"]) and torch.equal(mask, hf["attention_mask"])
    with torch.no_grad():
        real = mask.bool()  # bertkit's unpadded path leaves padding positions at 0
        torch.testing.assert_close(ours(ids, mask).prediction_logits[real], hf_model(**hf).logits[real], atol=1e-5,
                                   rtol=0)


def test_pre_split_words_match_roberta_with_a_prefix_space(bpe, theirs, tmp_path):
    """encode_words (NER's input) is RobertaTokenizerFast(add_prefix_space=True)(words, is_split_into_words=True)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    bpe.save(tmp_path / "full")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tmp_path / "full" / name, bare / name)
    spaced = transformers.RobertaTokenizerFast.from_pretrained(str(bare), add_prefix_space=True)
    sentences = [["The", "quick", "brown", "fox."], ["Café", "", "  x", "中文", "the"], ["unseenword"], []]
    ours = bpe.encode_words(sentences)
    for words, enc in zip(sentences, ours):
        want = spaced(words, is_split_into_words=True, add_special_tokens=False, return_offsets_mapping=True)
        assert enc.ids == want["input_ids"], words
        assert enc.word_ids == want.word_ids(), words
        assert enc.offsets == [tuple(o) for o in want["offset_mapping"]], words
        # Framed, they are what the full call gives.
        full = spaced(words, is_split_into_words=True)
        assert bpe.build_inputs(enc.ids)[0] == full["input_ids"]
    firsts = [ours[0].tokens[ours[0].word_ids.index(w)] for w in range(4)]
    assert all(t.startswith("Ġ") for t in firsts), firsts  # every word after a space
    assert bpe.encode_raw(["The"])[0].tokens[0] == "The"  # whole texts are unchanged: no prefix space
    with pytest.raises(TypeError, match=r"words\[0\]\[1\] is int"):
        bpe.encode_words([["a", 3]])
