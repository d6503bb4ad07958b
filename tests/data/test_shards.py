"""Tests for bertkit.data.prepare, .manifest and .shards: prepare -> ShardedCorpus round trip, resume, errors."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit.data import prepare as prepare_module
from bertkit.data.corpus import iter_documents
from bertkit.data.manifest import Manifest
from bertkit.data.prepare import prepare
from bertkit.data.shards import ShardedCorpus
from bertkit.errors import DataError
from bertkit.tokenizers.wordpiece import SPECIAL_TOKENS, WordPieceTokenizer

WORDS = ("the cat dog sat ran on a mat under tree quickly slowly unbelievable bird sang morning evening river "
         "flowed past stones and hills where children played games all day long").split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
    return " ".join(words).capitalize() + rng.choice([".", "!", "?", ", indeed."])


def documents(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[sentence(rng) for _ in range(rng.randint(1, 5))] for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    texts = [" ".join(s) for s in documents(99, 60)]
    return WordPieceTokenizer.train(texts=texts, vocab_size=200, show_progress=False)


@pytest.fixture
def tok_dir(tmp_path, tokenizer) -> Path:
    tokenizer.save(tmp_path / "tok")
    return tmp_path / "tok"


@pytest.fixture
def corpus(tmp_path) -> Path:
    """Three files, three formats: 12 text documents, 8 gzipped JSONL documents, 4 WikiText articles."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.txt").write_text("\n\n".join("\n".join(doc) for doc in documents(1, 12)) + "\n")
    jsonl = "".join(json.dumps({"text": " ".join(doc)}) + "\n" for doc in documents(2, 8))
    (root / "b.jsonl.gz").write_bytes(gzip.compress(jsonl.encode()))
    wiki = "".join(f" = Article {i} = \n \n = = Part = = \n \n {' '.join(doc)} \n \n"
                   for i, doc in enumerate(documents(3, 4)))
    (root / "wiki.c.raw").write_text(wiki)
    return root


def expected(tokenizer, paths, **options) -> list[tuple[list[list[int]], list[list[bool]]]]:
    """What the shards must hold: encode_plain ids per sentence, word starts from the engine's word ids."""
    out = []
    for document in iter_documents(paths, **options):
        ids = tokenizer.encode_plain(document.sentences)
        encodings = tokenizer.encode_raw(document.sentences)
        starts = [[k == 0 or e.word_ids[k] != e.word_ids[k - 1] for k in range(len(e.ids))] for e in encodings]
        kept = [(i, s) for i, s in zip(ids, starts) if i]
        if kept:
            out.append(([i for i, _ in kept], [s for _, s in kept]))
    return out


def as_lists(corpus: ShardedCorpus):
    return [([s.tolist() for s in ids], [w.tolist() for w in starts]) for ids, starts in corpus.documents_in_order()]


def shard_mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(out.glob("*/shard_*"))}


def checksums(out: Path) -> dict[str, str]:
    manifest = Manifest.load(out)
    return {f"{split}/{s['name']}.{suffix}": f["sha256"] for split in manifest.splits
            for s in manifest.split(split)["shards"] for suffix, f in s["files"].items()}


# ---- round trip --------------------------------------------------------------------------------------------
def test_round_trip_ids_word_starts_and_layout(tokenizer, tok_dir, corpus, tmp_path):
    out = tmp_path / "out"
    manifest = prepare([corpus], tok_dir, out, shard_tokens=150, progress=False)
    want = expected(tokenizer, [corpus])
    data = ShardedCorpus(out, tokenizer=tokenizer)
    assert len(data) == len(want) == 24
    assert as_lists(data) == want
    assert [data.document(i)[0][0].tolist() for i in (0, -1)] == [want[0][0][0], want[-1][0][0]]
    assert all(s.dtype == np.int64 for s in data.document(3)[0]) and data.document(3)[1][0].dtype == bool
    assert [t.tolist() for t in data.token_stream()] == [sum(ids, []) for ids, _ in want]
    assert data.num_tokens == sum(len(t) for ids, _ in want for t in ids) == manifest.split("train")["tokens"]
    assert data.vocab_size == tokenizer.vocab_size
    # Storage: uint16 for a small vocabulary, offsets and packed bits as documented.
    assert manifest.data["dtype"] == "uint16" and data.dtype == np.dtype("<u2")
    first = out / "train" / "shard_00000"
    entry = manifest.split("train")["shards"][0]
    assert Path(f"{first}.tokens.bin").stat().st_size == 2 * entry["tokens"]
    sentences = np.load(f"{first}.sentences.npy")
    docs = np.load(f"{first}.documents.npy")
    assert sentences.dtype == docs.dtype == np.int64
    assert (sentences[0], sentences[-1], docs[0], docs[-1]) == (0, entry["tokens"], 0, entry["sentences"])
    assert np.fromfile(f"{first}.wordstarts.bin", np.uint8).size == (entry["tokens"] + 7) // 8
    # Shards hold whole documents and close at the first document arriving once they are full.
    for shard in manifest.split("train")["shards"][:-1]:
        assert shard["tokens"] >= 150
    assert len(manifest.split("train")["shards"]) > 3
    # The tokenizer travels with the data, and the manifest records what the data was built from.
    assert WordPieceTokenizer.from_pretrained(data.tokenizer_dir).vocab_hash() == tokenizer.vocab_hash()
    assert manifest.data["tokenizer"]["vocab_hash"] == tokenizer.vocab_hash()
    assert [Path(f["path"]).name for f in manifest.data["streams"]["corpus"]["inputs"]] == \
        ["a.txt", "b.jsonl.gz", "wiki.c.raw"]
    assert data.verify() == 4 * len(manifest.split("train")["shards"])


def test_word_starts_follow_word_ids(tokenizer, tok_dir, tmp_path):
    texts = ["unbelievable birds", "Quickly, quickly!! un-believable", "#hashtag ##x", "Ünïcode naïve café",
             "中文 text", "[MASK] masked", "x" * 120]
    (tmp_path / "w.txt").write_text("\n".join(texts) + "\n")
    prepare(tmp_path / "w.txt", tok_dir, tmp_path / "out", progress=False)
    assert as_lists(ShardedCorpus(tmp_path / "out")) == expected(tokenizer, tmp_path / "w.txt")


def test_final_sigma_matches_the_tokenizer(tmp_path):
    """Upper-case Greek words ending in sigma: shards hold the ids of tokenizer.encode (final "ς"), which the engine
    alone (always "σ") would not give."""
    greek = ["ΟΔΟΣ ΣΟΦΟΣ ΚΟΣΜΟΣ", "ο δρόμος είναι σοφός", "ΣΙΣΥΦΟΣ, ΘΕΟΣ. ΣΑΣ", "σοφός κόσμος θεός σας"]
    tok = WordPieceTokenizer.train(texts=greek * 5, vocab_size=120, show_progress=False)
    tok.save(tmp_path / "tok")
    (tmp_path / "g.txt").write_text("\n".join(greek) + "\n")
    prepare(tmp_path / "g.txt", tmp_path / "tok", tmp_path / "out", progress=False)
    engine_only = [e.ids for e in tok.backend.encode_batch(greek, add_special_tokens=False)]
    assert tok.encode_plain(greek) != engine_only  # the rule matters for this text
    assert as_lists(ShardedCorpus(tmp_path / "out")) == expected(tok, tmp_path / "g.txt")
    assert as_lists(ShardedCorpus(tmp_path / "out"))[0][0] == tok.encode_plain(greek)


def test_uint32_for_large_vocabularies(tmp_path):
    vocab = list(SPECIAL_TOKENS) + ["hello", "world", "##s"] + [f"w{i}" for i in range(65600)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    big = WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")
    (tmp_path / "c.txt").write_text("hello worlds w65599\n")
    manifest = prepare(tmp_path / "c.txt", big, tmp_path / "out", progress=False)
    assert manifest.data["dtype"] == "uint32"
    assert as_lists(ShardedCorpus(tmp_path / "out")) == expected(big, tmp_path / "c.txt")


def test_batch_size_does_not_change_the_shards(tok_dir, corpus, tmp_path):
    prepare(corpus, tok_dir, tmp_path / "one", shard_tokens=150, batch_size=1, progress=False)
    prepare(corpus, tok_dir, tmp_path / "many", shard_tokens=150, batch_size=10_000, progress=False)
    assert checksums(tmp_path / "one") == checksums(tmp_path / "many")


def test_empty_sentences_and_documents_are_dropped_and_counted(tok_dir, tmp_path):
    # "\x07" is a control character: the normaliser removes it, leaving no token.
    (tmp_path / "c.txt").write_text("Real one.\n\x07\nReal two.\n\n\x07\n\x07\n\nLast.\n")
    manifest = prepare(tmp_path / "c.txt", tok_dir, tmp_path / "out", progress=False)
    train = manifest.split("train")
    assert (train["documents"], train["sentences"]) == (2, 3)
    assert (train["dropped_documents"], train["dropped_sentences"]) == (1, 3)


def test_skipped_lines_are_counted_in_the_manifest(tok_dir, tmp_path):
    (tmp_path / "c.jsonl").write_bytes(b'{"text": "Good."}\n{"text": ""}\nnot json\n{"text": "Bad \xff"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:2: "):
        prepare(tmp_path / "c.jsonl", tok_dir, tmp_path / "out", progress=False)
    manifest = prepare(tmp_path / "c.jsonl", tok_dir, tmp_path / "out", on_bad_line="skip", progress=False)
    assert manifest.data["skipped"] == {"empty_document": 1, "invalid_json": 1, "invalid_utf8": 1}
    assert manifest.split("train")["documents"] == 1


# ---- reuse, resume, rebuild ----------------------------------------------------------------------------------
def test_rerun_reuses_everything(tok_dir, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    first = prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    assert first.reused == {"train": []} and len(first.written["train"]) > 3
    before = shard_mtimes(out)
    again = prepare(corpus, tok_dir, out, shard_tokens=150, progress=True)
    assert again.reused["train"] == first.written["train"] and again.written == {"train": []}
    assert shard_mtimes(out) == before
    summary = again.summary()
    assert summary["splits"]["train"]["reused"] == summary["splits"]["train"]["shards"] == len(before) // 5
    json.dumps(summary)
    assert "reused all" in capsys.readouterr().err


def test_resume_after_a_crash_redoes_only_unfinished_shards(tok_dir, corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    prepare(corpus, tok_dir, tmp_path / "clean", shard_tokens=150, eval_fraction=0.3, progress=False)
    original = prepare_module._ShardWriter._close
    calls = []

    def crashing_close(self, *args, **kwargs):
        calls.append(self.split)
        if len(calls) == 5:
            raise KeyboardInterrupt("simulated crash")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(prepare_module._ShardWriter, "_close", crashing_close)
    with pytest.raises(KeyboardInterrupt):
        prepare(corpus, tok_dir, out, shard_tokens=150, eval_fraction=0.3, progress=False)
    assert not (out / "manifest.json").exists()
    finished = shard_mtimes(out)
    monkeypatch.setattr(prepare_module._ShardWriter, "_close", original)
    manifest = prepare(corpus, tok_dir, out, shard_tokens=150, eval_fraction=0.3, progress=False)
    assert sum(map(len, manifest.reused.values())) == 4
    assert {k: v for k, v in shard_mtimes(out).items() if k in finished and k.endswith(".json")} == \
        {k: v for k, v in finished.items() if k.endswith(".json")}
    assert checksums(out) == checksums(tmp_path / "clean")
    assert Manifest.load(out).data["splits"] == Manifest.load(tmp_path / "clean").data["splits"]


def test_changed_input_rebuilds_from_the_first_shard_that_reads_it(tokenizer, tok_dir, corpus, tmp_path):
    out = tmp_path / "out"
    first = prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    records = [json.loads((out / "train" / f"{n}.json").read_text()) for n in first.written["train"]]
    only_first_file = [r["name"] for r in records if r["end"]["file"] == 0]
    assert 0 < len(only_first_file) < len(records)
    wiki = corpus / "wiki.c.raw"
    wiki.write_text(wiki.read_text() + " = New = \n \n The new dog sang . \n")
    again = prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    assert again.reused["train"] == [r["name"] for r in records if r["end"]["file"] <= 1]
    assert again.written["train"]
    assert as_lists(ShardedCorpus(out)) == expected(tokenizer, corpus)


def test_changed_tokenizer_or_options_rebuild_everything(tok_dir, corpus, tmp_path):
    out = tmp_path / "out"
    prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    other = WordPieceTokenizer.train(texts=[" ".join(d) for d in documents(5, 40)], vocab_size=150,
                                     show_progress=False)
    rebuilt = prepare(corpus, other, out, shard_tokens=150, progress=False)
    assert rebuilt.reused == {"train": []} and rebuilt.data["tokenizer"]["vocab_hash"] == other.vocab_hash()
    resized = prepare(corpus, other, out, shard_tokens=1000, progress=False)
    assert resized.reused == {"train": []}
    assert sorted(p.name.split(".")[0] for p in (out / "train").glob("shard_*")) == \
        sorted(n for n in resized.written["train"] for _ in range(5))  # old, higher-numbered shards are gone


def test_corrupted_shard_is_detected_and_rebuilt(tok_dir, corpus, tmp_path):
    out = tmp_path / "out"
    prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    victim = out / "train" / "shard_00002.tokens.bin"
    payload = bytearray(victim.read_bytes())
    payload[0] ^= 1
    victim.write_bytes(bytes(payload))
    with pytest.raises(DataError, match="shard_00002.tokens.bin does not match its checksum"):
        ShardedCorpus(out).verify()
    again = prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    assert again.reused["train"] == ["shard_00000", "shard_00001"]
    ShardedCorpus(out).verify()


# ---- eval split --------------------------------------------------------------------------------------------
def test_eval_fraction_partitions_documents_deterministically(tokenizer, tok_dir, corpus, tmp_path):
    manifest = prepare(corpus, tok_dir, tmp_path / "a", eval_fraction=0.3, seed=1, progress=False)
    train, held = as_lists(ShardedCorpus(tmp_path / "a")), as_lists(ShardedCorpus(tmp_path / "a", "eval"))
    assert 0 < len(held) < len(train)
    assert sorted(map(repr, train + held)) == sorted(map(repr, expected(tokenizer, corpus)))
    assert manifest.split("eval")["documents"] == len(held)
    prepare(corpus, tok_dir, tmp_path / "b", eval_fraction=0.3, seed=1, progress=False)
    assert checksums(tmp_path / "a") == checksums(tmp_path / "b")
    prepare(corpus, tok_dir, tmp_path / "c", eval_fraction=0.3, seed=2, progress=False)
    assert as_lists(ShardedCorpus(tmp_path / "c", "eval")) != held
    again = prepare(corpus, tok_dir, tmp_path / "c", progress=False)  # no eval split any more
    assert again.splits == ["train"] and not list((tmp_path / "c" / "eval").glob("shard_*"))
    assert as_lists(ShardedCorpus(tmp_path / "c")) == expected(tokenizer, corpus)


def test_eval_paths(tokenizer, tok_dir, corpus, tmp_path):
    held_out = tmp_path / "held.txt"
    held_out.write_text("Held out one.\n\nHeld out two.\n")
    manifest = prepare(corpus, tok_dir, tmp_path / "out", eval_paths=[held_out], progress=False)
    assert manifest.splits == ["train", "eval"]
    assert as_lists(ShardedCorpus(tmp_path / "out", "eval")) == expected(tokenizer, held_out)
    assert as_lists(ShardedCorpus(tmp_path / "out", "train")) == expected(tokenizer, corpus)
    with pytest.raises(ValueError, match="not both"):
        prepare(corpus, tok_dir, tmp_path / "x", eval_paths=[held_out], eval_fraction=0.1, progress=False)
    with pytest.raises(ValueError, match="leak"):
        prepare(corpus, tok_dir, tmp_path / "x", eval_paths=[corpus / "a.txt"], progress=False)
    with pytest.raises(KeyError, match="no split 'test'"):
        ShardedCorpus(tmp_path / "out", "test")


# ---- reading errors ----------------------------------------------------------------------------------------
def test_vocabulary_mismatch_names_both_hashes(tokenizer, tok_dir, corpus, tmp_path):
    prepare(corpus, tok_dir, tmp_path / "out", progress=False)
    other = WordPieceTokenizer.train(texts=["something else entirely"] * 5, vocab_size=60, show_progress=False)
    with pytest.raises(ValueError) as error:
        ShardedCorpus(tmp_path / "out", tokenizer=other)
    assert tokenizer.vocab_hash() in str(error.value) and other.vocab_hash() in str(error.value)
    ShardedCorpus(tmp_path / "out", tokenizer=tok_dir)  # a directory works too


def test_missing_or_truncated_files_name_the_file(tok_dir, corpus, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match="manifest.json not found"):
        ShardedCorpus(out)
    prepare(corpus, tok_dir, out, shard_tokens=150, progress=False)
    sentences = out / "train" / "shard_00001.sentences.npy"
    sentences.write_bytes(sentences.read_bytes()[:-8])
    with pytest.raises(DataError, match=f"{sentences}: .* bytes, the manifest says"):
        ShardedCorpus(out)
    sentences.unlink()
    with pytest.raises(FileNotFoundError, match=f"{sentences}: shard file missing"):
        ShardedCorpus(out)


def test_pickles_and_is_a_document_source(tok_dir, corpus, tmp_path):
    prepare(corpus, tok_dir, tmp_path / "out", progress=False)
    data = ShardedCorpus(tmp_path / "out")
    copy = pickle.loads(pickle.dumps(data))
    assert len(pickle.dumps(data)) < 20_000  # the maps are reopened, not copied
    assert as_lists(copy) == as_lists(data)
    instances = pytest.importorskip("bertkit.data.instances")
    assert isinstance(data, instances.DocumentSource)


def test_progress_bar_and_environment(tok_dir, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    prepare(corpus, tok_dir, tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert "prepare" in err and "24 documents" in err
    assert "TOKENIZERS_PARALLELISM" not in os.environ


def test_an_eval_fraction_that_holds_out_nothing_is_refused_with_the_numbers(tok_dir, tmp_path):
    """122 documents at --eval-fraction 0.02 (about 2.4 expected): each document is held out independently, so
    some seeds hold out none (0.98^122, about 8.5%). Such a prepare is refused, naming the numbers, and writes no
    manifest a pretraining run could read; every other seed gives an eval split with documents."""
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join("\n".join(doc) for doc in documents(5, 122)) + "\n")
    refused = []
    for seed in range(60):
        out = tmp_path / f"data-{seed}"
        try:
            manifest = prepare([text], tok_dir, out, eval_fraction=0.02, seed=seed, progress=False)
        except DataError as err:
            refused.append(seed)
            assert str(err) == (f"{text}: --eval-fraction 0.02 held out none of the corpus's 122 documents (about "
                                f"2.4 expected), so there would be no eval split; use a larger fraction "
                                f"(--eval-fraction 0.041: about 5 documents) or give held-out files (--eval-corpus)")
            assert not (out / "manifest.json").exists()
            continue
        assert manifest.data["splits"]["eval"]["documents"] >= 1
        assert manifest.data["splits"]["eval"]["documents"] + manifest.data["splits"]["train"]["documents"] == 122
    assert refused  # the case exists (seeds 0-59 give it; about 5 expected)


def test_a_split_without_documents_is_named_with_its_directory(tok_dir, corpus, tmp_path):
    prepare(corpus, tok_dir, tmp_path / "data", eval_fraction=0.3, progress=False)
    for split in ("train", "eval"):
        opened = ShardedCorpus(tmp_path / "data", split)
        assert opened.require_documents() is opened
        opened.num_documents = 0  # as an eval split held out by an older prepare could be
        with pytest.raises(DataError, match=f"^{tmp_path / 'data'}: the {split} split has no documents "):
            opened.require_documents()


# ------------------------------------------------------------------------------------------------------------------
# Parquet, Arrow and datasets directories: the same documents give the same shards, byte for byte
# ------------------------------------------------------------------------------------------------------------------
def test_prepare_from_parquet_arrow_and_datasets_writes_the_text_corpus_shards(tmp_path, tok_dir):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    datasets = pytest.importorskip("datasets", reason="datasets (the test extra) writes the save_to_disk fixture")
    docs = documents(7, 30)
    (tmp_path / "c.txt").write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    rows = {"body": ["\n".join(doc) for doc in docs], "id": list(range(len(docs)))}
    pq.write_table(pa.table(rows), tmp_path / "c.parquet", row_group_size=7)
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.table(rows).slice(0, 11), shards / "a.parquet")
    pq.write_table(pa.table(rows).slice(11), shards / "b.parquet")
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    # One row per line, grouped into documents by their id column.
    lines = {"line": [s for doc in docs for s in doc], "doc": [i for i, doc in enumerate(docs) for _ in doc]}
    pq.write_table(pa.table(lines), tmp_path / "lines.parquet")

    text = prepare(tmp_path / "c.txt", tok_dir, tmp_path / "from-text", shard_tokens=150, progress=False)
    want = checksums(tmp_path / "from-text")
    assert len(want) > 8
    for name, inputs, options in (("parquet", tmp_path / "c.parquet", {}), ("shards", shards, {}),
                                  ("datasets", tmp_path / "saved", {}),
                                  ("grouped", tmp_path / "lines.parquet",
                                   {"text_column": "line", "document_column": "doc"})):
        options = {"text_column": "body", **options}
        manifest = prepare(inputs, tok_dir, tmp_path / name, shard_tokens=150, progress=False, **options)
        assert checksums(tmp_path / name) == want, name
        for relative in want:  # the files themselves, not only what the manifest says of them
            assert (tmp_path / name / relative).read_bytes() == (tmp_path / "from-text" / relative).read_bytes()
        assert manifest.split("train")["documents"] == text.split("train")["documents"] == len(docs)
        assert ShardedCorpus(tmp_path / name).verify() == len(want)


def test_prepare_from_parquet_resumes_after_a_crash_with_the_same_shards(tmp_path, tok_dir, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = documents(8, 40)
    pq.write_table(pa.table({"text": ["\n".join(doc) for doc in docs]}), tmp_path / "c.parquet", row_group_size=5)
    prepare(tmp_path / "c.parquet", tok_dir, tmp_path / "whole", shard_tokens=120, progress=False)
    real = prepare_module._ShardWriter._close
    calls = []

    def crash_on_third(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated crash")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(prepare_module._ShardWriter, "_close", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "c.parquet", tok_dir, tmp_path / "crashed", shard_tokens=120, progress=False)
    monkeypatch.setattr(prepare_module._ShardWriter, "_close", real)
    manifest = prepare(tmp_path / "c.parquet", tok_dir, tmp_path / "crashed", shard_tokens=120, progress=False)
    # Two shards were kept; reading resumed at the row after the second (whole row groups before it unread).
    assert len(manifest.reused["train"]) == 2 and checksums(tmp_path / "crashed") == checksums(tmp_path / "whole")


def test_a_null_or_missing_text_column_is_one_line_and_writes_nothing(tmp_path, tok_dir):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["one doc", None, "two"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c.parquet:row 1: the column 'text' is null$"):
        prepare(tmp_path / "c.parquet", tok_dir, tmp_path / "out", progress=False)
    with pytest.raises(DataError, match=r"c.parquet: no column 'body'; the file has columns \['text'\]$"):
        prepare(tmp_path / "c.parquet", tok_dir, tmp_path / "out2", progress=False, text_column="body")
    assert not list((tmp_path / "out").rglob("*.bin")) and not list((tmp_path / "out").rglob("*.tmp*"))
    assert not (tmp_path / "out2").exists()  # a missing column is refused before the output is touched
    manifest = prepare(tmp_path / "c.parquet", tok_dir, tmp_path / "skip", progress=False, on_bad_line="skip")
    assert manifest.split("train")["documents"] == 2


def test_reads_by_index_are_slices_of_the_whole_document(tok_dir, corpus, tmp_path):
    # What the streams read by ranges (document_sizes, sentence_offsets, token_range, token_view) is
    # flat_document's, sliced, in every shard.
    prepare([corpus], tok_dir, tmp_path / "out", shard_tokens=150, progress=False)
    data = ShardedCorpus(tmp_path / "out")
    tokens, sentences = data.document_sizes()
    assert len(tokens) == len(sentences) == len(data) and tokens.dtype == sentences.dtype == np.int64
    rng = np.random.default_rng(0)
    for i in range(len(data)):
        ids, starts, bounds = data.flat_document(i)
        assert (tokens[i], sentences[i]) == (len(ids), len(bounds) - 1)
        assert np.array_equal(data.sentence_offsets(i), bounds)
        view = data.token_view(i)
        assert np.array_equal(view, ids) and view.dtype == data.dtype and not view.flags.writeable
        for lo, hi in [(0, len(ids)), *sorted(rng.integers(0, len(ids) + 1, (3, 2)).tolist())]:
            lo, hi = min(lo, hi), max(lo, hi)
            got, bits = data.token_range(i, lo, hi)
            assert np.array_equal(got, ids[lo:hi]) and got.dtype == np.int64
            assert np.array_equal(bits, starts[lo:hi]) and bits.dtype == bool
            assert data.token_range(i, lo, hi, word_starts=False)[1] is None
    order = rng.permutation(len(data))
    assert all(np.array_equal(view, data.flat_document(int(i))[0]) for i, view in zip(order, data.token_views(order)))
    with pytest.raises(IndexError, match="out of range"):
        data.token_range(0, 0, int(tokens[0]) + 1)
