"""Any transformers tokenizer.json (`JsonTokenizer`): transformers' AutoTokenizer's ids on random text for every
kind, special tokens read from the configs, the file's framing, word starts, save and reload."""

import json
import pickle
import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertkit.tokenizers import JsonTokenizer, UnigramTokenizer, load_tokenizer
from bertkit.tokenizers.wordpiece import needs_python

from tokenizer_dirs import NAMES, TEXTS, google_cut, write_all

transformers = pytest.importorskip("transformers")

# Random Unicode (no surrogates), with the characters the pipelines treat specially mixed in often.
SPECIAL_CHARS = "  \t\n\u00a0\u3000\u200b\x00\ufffdÀéΣς中文ﬁ①😀.,!?'-<>[]" + "[MASK]<mask></s>"
texts = st.text(alphabet=st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(SPECIAL_CHARS)),
                max_size=40) | st.sampled_from(TEXTS)


def google_agrees(text: str) -> bool:
    """Texts on which Google's BERT tokenizer (bertkit's WordPiece) and transformers' BertTokenizer agree by
    design: they differ on purpose where composing characters (NFC) changes the text, and where the `tokenizers`
    engine's Unicode tables, which transformers' tokenizer uses, are not Google's (unassigned code points, characters
    newer than those tables, a final sigma: `needs_python`)."""
    return unicodedata.normalize("NFC", text) == text and not needs_python(text, lowercase=True)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture(scope="module")
def pairs(dirs):
    """{name: (ours, AutoTokenizer)} for every directory."""
    return {name: (load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(str(path)))
            for name, path in dirs.items()}


def _check(ours, auto, text, pair=None, max_length=None, name=""):
    if ours.kind == "wordpiece" and not (google_agrees(text) and google_agrees(pair or "")):
        return
    wordpiece_pair_cut = ours.kind == "wordpiece" and pair is not None and max_length
    google = google_cut(ours, text, pair, max_length) if wordpiece_pair_cut else None
    if google is not None:  # BERT's own pair rule, where transformers' differs
        assert ours.encode(text, pair, max_length=max_length).input_ids == ours.build_inputs(*google)[0]
        return
    kwargs = {"truncation": "longest_first", "max_length": max_length} if max_length else {}
    # transformers' batch call: its single-text call drops an empty pair ("" as no pair), its batch call keeps it.
    want = auto([text], None if pair is None else [pair], return_offsets_mapping=True, return_token_type_ids=True,
                **kwargs)
    got = ours.encode(text, pair, max_length=max_length)
    assert got.input_ids == want["input_ids"][0], (name, text, pair, max_length)
    assert got.token_type_ids == want["token_type_ids"][0], (name, text, pair)
    if pair is None:
        assert got.offsets == [tuple(o) for o in want["offset_mapping"][0]], (name, text)
        assert got.word_ids == want.word_ids(0), (name, text)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_random_text_single_parity_with_autotokenizer(pairs, name, text):
    _check(*pairs[name], text, name=name)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, pair=texts, max_length=st.none() | st.integers(4, 24))
def test_random_pair_parity_with_autotokenizer(pairs, name, text, pair, max_length):
    _check(*pairs[name], text, pair, max_length, name=name)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(texts.filter(lambda w: w.strip() != "" or w == ""), min_size=1, max_size=6))
def test_pre_split_words_parity_with_autotokenizer(pairs, name, words):
    """encode_words is what transformers gives with is_split_into_words=True: for bertkit's byte-level BPE, what
    RobertaTokenizerFast gives with add_prefix_space=True (each word after a space); for a tokenizer.json, what
    transformers gives with that file as it stands."""
    ours, auto = pairs[name]
    if ours.kind == "wordpiece" and not all(google_agrees(w) for w in words):
        return
    if name == "bpe-bertkit":
        auto = transformers.AutoTokenizer.from_pretrained(auto.name_or_path, add_prefix_space=True)
    want = auto(words, is_split_into_words=True, add_special_tokens=False, return_offsets_mapping=True)
    got = ours.encode_words([words])[0]
    assert got.ids == want["input_ids"], (name, words)
    assert got.word_ids == want.word_ids(), (name, words)
    assert got.offsets == [tuple(o) for o in want["offset_mapping"]], (name, words)


@pytest.mark.parametrize("name", ["bpe-bertkit", "bpe-transformers"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_byte_level_decode_gives_the_text_back(pairs, name, text):
    ours, _ = pairs[name]
    if any(s in text for s in ("<s>", "</s>", "<pad>", "<unk>", "<mask>")):
        return  # special tokens in the text are dropped by decoding
    assert ours.decode(ours.encode(text).input_ids) == text


@pytest.mark.parametrize("name", NAMES)
def test_build_inputs_frames_pieces_as_encode_does(pairs, name):
    ours, _ = pairs[name]
    for a, b in [(TEXTS[0], TEXTS[1]), ("", "x"), (TEXTS[2], None)]:
        ids_a = ours.encode_raw([a])[0].ids
        ids_b = None if b is None else ours.encode_raw([b])[0].ids
        enc = ours.encode(a, b)
        assert ours.build_inputs(ids_a, ids_b) == (enc.input_ids, enc.token_type_ids)
        assert len(enc) == len(ids_a) + len(ids_b or []) + ours.num_special_tokens(b is not None)


def test_special_tokens_from_the_configs_and_the_usual_names(dirs, pairs):
    bert, _ = pairs["wordpiece-transformers"]
    vocab = bert.get_vocab()
    assert (bert.cls_id, bert.sep_id, bert.pad_id, bert.mask_id, bert.unk_id) == tuple(
        vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"))
    assert (bert.pair_separators, bert.pair_type_id) == (1, 1)
    roberta, _ = pairs["bpe-transformers"]
    assert (roberta.cls_token, roberta.sep_token, roberta.mask_token) == ("<s>", "</s>", "<mask>")
    assert (roberta.pair_separators, roberta.pair_type_id) == (2, 0)
    t5, auto = pairs["unigram-bertkit"]
    assert t5.cls_id is None and t5.mask_id is None and t5.sep_token == "</s>" and t5.pad_id == 0
    assert set(t5.special_ids) == set(auto.all_special_ids)
    # Without any config, the usual names among the added tokens; a role with none is None.
    backend = Tokenizer.from_file(str(dirs["unigram-transformers"] / "tokenizer.json"))
    bare = UnigramTokenizer(backend)
    assert (bare.cls_token, bare.sep_token, bare.pad_token, bare.mask_token, bare.unk_token) == (
        "[CLS]", "[SEP]", "<pad>", "[MASK]", "<unk>")
    # A config naming another token wins over the names.
    renamed = UnigramTokenizer(Tokenizer.from_file(str(dirs["unigram-transformers"] / "tokenizer.json")),
                               {"pad_token": {"content": "[MASK]"}, "mask_token": "not-in-vocab"})
    assert renamed.pad_token == "[MASK]" and renamed.mask_token == "[MASK]"


def test_padding_truncation_and_their_errors(pairs):
    t5, _ = pairs["unigram-bertkit"]
    encs = t5.encode_batch(["a b c d e f", "a"], padding=True)
    assert len(encs[0]) == len(encs[1]) and encs[1].input_ids[-1] == t5.pad_id and encs[1].attention_mask[-1] == 0
    with pytest.raises(ValueError, match="longer than max_length 3 and truncation is off"):
        t5.encode("a b c d e f", max_length=3, truncation=False)
    with pytest.raises(ValueError, match="max_length 1 leaves no room"):
        t5.encode("a", "b", max_length=1)
    backend = Tokenizer.from_str(t5.backend.to_str())
    no_pad = JsonTokenizer(backend, {"eos_token": "</s>", "pad_token": "nothing-like-it"})
    no_pad_tokens = {t.content for t in backend.get_added_tokens_decoder().values()}
    assert "<pad>" in no_pad_tokens and no_pad.pad_token == "<pad>"  # the usual name still finds it
    backend.no_truncation()
    data = json.loads(backend.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<pad>"]
    stripped = JsonTokenizer(Tokenizer.from_str(json.dumps(data)), {})
    assert stripped.pad_id is None
    with pytest.raises(ValueError, match="no padding token"):
        stripped.encode_batch(["a b c", "a"], padding=True)


def test_a_file_carrying_truncation_and_padding_still_encodes_whole_texts(dirs):
    data = json.loads((dirs["wordpiece-transformers"] / "tokenizer.json").read_text(encoding="utf-8"))
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = {"strategy": {"Fixed": 30}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": "[PAD]"}
    tok = JsonTokenizer(Tokenizer.from_str(json.dumps(data)), {})
    enc = tok.encode(TEXTS[0])
    assert len(enc) > 4 and enc.attention_mask.count(0) == 0
    assert len(tok.encode(TEXTS[0], max_length=6)) == 6


def test_save_round_trip_keeps_ids_hash_and_class(dirs, pairs, tmp_path):
    for name in ("wordpiece-transformers", "bpe-transformers", "unigram-transformers"):
        ours, _ = pairs[name]
        ours.save(tmp_path / name)
        again = load_tokenizer(tmp_path / name)
        assert type(again) is type(ours) and again.vocab_hash() == ours.vocab_hash()
        config = json.loads((tmp_path / name / "tokenizer_config.json").read_text())
        original = json.loads((dirs[name] / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == original["tokenizer_class"]
        auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / name))
        for text, pair in [(TEXTS[0], None), (TEXTS[1], TEXTS[2])]:
            assert auto(text, pair)["input_ids"] == again.encode(text, pair).input_ids
    # The hash tells tokenizers apart.
    hashes = {pairs[name][0].vocab_hash() for name in NAMES}
    assert len(hashes) == len(NAMES)
    # Pickled copies (data loader workers) encode the same.
    t5, _ = pairs["unigram-bertkit"]
    copy = pickle.loads(pickle.dumps(t5))
    assert copy.encode(TEXTS[3], TEXTS[4], max_length=10) == t5.encode(TEXTS[3], TEXTS[4], max_length=10)


def _tiny(model, pre, words=("low", "lower", "newest", "widest", "new", "wide")):
    engine = Tokenizer(model)
    engine.pre_tokenizer = pre
    return engine, [" ".join(words)] * 5


def test_word_start_flags_follow_the_files_scheme(pairs):
    for name in NAMES:
        ours, _ = pairs[name]
        flags = ours.word_start_flags()
        assert flags.shape == (ours.vocab_size,) and flags.dtype == np.bool_
        assert flags[sorted(ours.special_ids)].all()
        vocab = ours.get_vocab()
        for token, index in vocab.items():
            if index in ours.special_ids:
                continue
            if "wordpiece" in name:
                assert flags[index] == (not token.startswith("##")), token
            elif "bpe" in name:
                assert flags[index] == token.startswith("Ġ"), token
            else:
                assert flags[index] == token.startswith("▁"), token
    # BPE with a continuation prefix, and one with end-of-word suffixes (no start marker: every piece a word).
    engine, corpus = _tiny(models.BPE(continuing_subword_prefix="##", unk_token="[UNK]"), pre_tokenizers.Whitespace())
    engine.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=40, continuing_subword_prefix="##",
                                                           special_tokens=["[UNK]"], show_progress=False))
    tok = JsonTokenizer(engine)
    assert [bool(f) for f in tok.word_start_flags()] == [
        not tok.id_to_token(i).startswith("##") for i in range(tok.vocab_size)]
    engine, corpus = _tiny(models.BPE(end_of_word_suffix="</w>", unk_token="[UNK]"), pre_tokenizers.Whitespace())
    engine.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=40, end_of_word_suffix="</w>",
                                                           special_tokens=["[UNK]"], show_progress=False))
    assert JsonTokenizer(engine).word_start_flags().all()


def test_a_generic_bpe_file_with_a_template_and_no_cls(tmp_path):
    """A Llama-like file: BPE over "▁"-written spaces, `<s> A` framing only; read and saved as transformers does."""
    engine = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=False))
    engine.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    engine.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    engine.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"],
                                                          show_progress=False))
    engine.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                          special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=engine, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path)
    assert tok.kind == "json" and tok.cls_token == "<s>" and tok.sep_token == "</s>" and tok.pad_id is None
    assert tok.frame(False).prefix == ((1, 0),) and tok.frame(False).suffix == ()
    assert tok.pair_separators == 1
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text, pair in [(TEXTS[0], None), (TEXTS[5], TEXTS[6])]:
        assert tok.encode(text, pair).input_ids == auto(text, pair)["input_ids"]
    flags = tok.word_start_flags()
    assert all(flags[i] == t.startswith("▁") for t, i in tok.get_vocab().items() if i not in tok.special_ids)
    assert tok.decode(tok.encode("the lazy dog").input_ids) == "the lazy dog"
