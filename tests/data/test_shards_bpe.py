"""Byte-level BPE corpora: `prepare` with RoBERTa's vocabulary, then a RoBERTa pretraining run on the shards."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit import cli
from bertkit.tokenizers import ByteLevelBPETokenizer
from bertkit.data.manifest import Manifest
from bertkit.data.prepare import prepare
from bertkit.data.shards import ShardedCorpus
from bertkit.tokenizers import WordPieceTokenizer, detect_tokenizer_kind, load_tokenizer

WORDS = ("the cat dog sat ran on a mat under tree quickly slowly unbelievable bird sang morning evening river "
         "flowed past stones and hills where children played games all day long").split()
# Lines a byte-level vocabulary must give back byte for byte: accents, CJK, emoji, a contraction, numbers, runs of
# spaces, and RoBERTa's special-token strings written as plain text.
ODD_LINES = ["Café naïve résumé, déjà vu.", "中文字符 and 日本語 ideographs.", "She doesn't like 🙂 or 🦜!",
             "Numbers like 3.14 and 2,718 stay.", "Two  spaces   here.", "Write <mask> or <s> and </s> <pad>."]


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
    return " ".join(words).capitalize() + rng.choice([".", "!", "?", ", indeed."])


def corpus_documents(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    docs = [[sentence(rng) for _ in range(rng.randint(1, 5))] for _ in range(count)]
    docs[1][:0] = ODD_LINES[:3]
    docs[-1].extend(ODD_LINES[3:])
    return docs


def write_corpus(path: Path, docs: list[list[str]]) -> Path:
    path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def docs() -> list[list[str]]:
    return corpus_documents(5, 40)


@pytest.fixture(scope="module")
def bpe(docs) -> ByteLevelBPETokenizer:
    return ByteLevelBPETokenizer.train(texts=[line for doc in docs for line in doc], vocab_size=420, min_frequency=1,
                                       show_progress=False)


@pytest.fixture
def bpe_dir(tmp_path, bpe) -> Path:
    bpe.save(tmp_path / "bpe")
    return tmp_path / "bpe"


@pytest.fixture
def wordpiece_dir(tmp_path, docs) -> Path:
    tok = WordPieceTokenizer.train(texts=[" ".join(doc) for doc in docs], vocab_size=200, show_progress=False)
    tok.save(tmp_path / "wp")
    return tmp_path / "wp"


# ---- prepare ------------------------------------------------------------------------------------------------
def test_bpe_shards_decode_to_the_corpus_text(bpe, bpe_dir, docs, tmp_path):
    path = write_corpus(tmp_path / "corpus.txt", docs)
    manifest = prepare(path, bpe_dir, tmp_path / "out", shard_tokens=300, progress=False)  # kind detected
    data = ShardedCorpus(tmp_path / "out", tokenizer=bpe)
    assert len(data) == len(docs) and len(manifest.split("train")["shards"]) > 2
    got = [[bpe.decode(s, skip_special_tokens=False) for s in data.document(i)[0]] for i in range(len(data))]
    assert got == docs  # every sentence back byte for byte, "<mask>" and runs of spaces included
    # Special-token strings in the text are text: no special id is ever stored.
    stored = np.concatenate([t for t in data.token_stream()])
    assert not set(stored.tolist()) & set(bpe.special_ids)
    assert "Ġ<" in bpe.convert_ids_to_tokens(data.document(len(docs) - 1)[0][-1])


def test_bpe_word_starts_are_space_marked_pieces_and_line_starts(bpe, bpe_dir, docs, tmp_path):
    prepare(write_corpus(tmp_path / "corpus.txt", docs), bpe_dir, tmp_path / "out", progress=False)
    data = ShardedCorpus(tmp_path / "out")
    checked, continuations = 0, 0
    for (ids, starts), lines in zip(data.documents_in_order(), docs):
        for s_ids, s_starts, line in zip(ids, starts, lines):
            pieces = bpe.convert_ids_to_tokens(s_ids)
            assert s_starts.tolist() == [k == 0 or p.startswith("Ġ") for k, p in enumerate(pieces)]
            if "  " not in line:  # one space between words: exactly one word start per word
                assert int(s_starts.sum()) == len(line.split(" "))
                checked += 1
            continuations += int((~s_starts).sum())
    assert checked > 100 and continuations > 100  # punctuation and split words continue their word


def test_bpe_manifest_records_kind_hash_and_special_ids(bpe, bpe_dir, docs, tmp_path):
    out = tmp_path / "out"
    prepare(write_corpus(tmp_path / "corpus.txt", docs), bpe_dir, out, eval_fraction=0.2, progress=False)
    manifest = Manifest.load(out)
    entry = manifest.data["tokenizer"]
    assert entry["kind"] == manifest.tokenizer_kind == "bpe"
    assert entry["vocab_hash"] == bpe.vocab_hash() and entry["vocab_size"] == 420
    assert entry["special_ids"] == {"cls": 0, "sep": 2, "pad": 1, "mask": 4, "unk": 3}
    assert entry["special_tokens"] == {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>"}
    assert entry["add_prefix_space"] is False and "lowercase" not in entry
    assert manifest.summary()["tokenizer_kind"] == "bpe" and manifest.data["dtype"] == "uint16"
    assert sorted(p.name for p in manifest.tokenizer_dir.iterdir()) == \
        ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    again = manifest.load_tokenizer()
    assert isinstance(again, ByteLevelBPETokenizer) and again.vocab_hash() == bpe.vocab_hash()
    assert ShardedCorpus(out, "eval").num_documents + ShardedCorpus(out).num_documents == len(docs)


def test_switching_kind_in_one_directory_rebuilds_and_replaces_the_tokenizer(bpe_dir, wordpiece_dir, docs,
                                                                             tmp_path):
    path, out = write_corpus(tmp_path / "corpus.txt", docs), tmp_path / "out"
    prepare(path, wordpiece_dir, out, progress=False)
    manifest = prepare(path, bpe_dir, out, progress=False)
    assert manifest.reused["train"] == [] and manifest.written["train"]
    assert not (out / "tokenizer" / "vocab.txt").exists() and detect_tokenizer_kind(out / "tokenizer") == "bpe"
    manifest = prepare(path, wordpiece_dir, out, progress=False)
    assert manifest.tokenizer_kind == "wordpiece" and not (out / "tokenizer" / "vocab.json").exists()
    assert isinstance(manifest.load_tokenizer(), WordPieceTokenizer)


def test_kind_is_detected_forced_and_refused_with_the_files_named(bpe, bpe_dir, wordpiece_dir, docs, tmp_path):
    path = write_corpus(tmp_path / "corpus.txt", docs)
    assert detect_tokenizer_kind(bpe_dir) == "bpe" and detect_tokenizer_kind(wordpiece_dir) == "wordpiece"
    assert isinstance(load_tokenizer(bpe_dir / "vocab.json"), ByteLevelBPETokenizer)
    assert isinstance(load_tokenizer(wordpiece_dir / "vocab.txt"), WordPieceTokenizer)
    forced = prepare(path, bpe_dir, tmp_path / "forced", tokenizer_kind="bpe", progress=False)
    assert forced.tokenizer_kind == "bpe"
    with pytest.raises(ValueError, match=r"a wordpiece tokenizer needs vocab\.txt.*vocab\.json, merges\.txt "
                                         r"\(a byte-level BPE tokenizer\)"):
        prepare(path, bpe_dir, tmp_path / "x", tokenizer_kind="wordpiece", progress=False)
    with pytest.raises(ValueError, match=r"a bpe tokenizer needs vocab\.json \+ merges\.txt.*vocab\.txt "
                                         r"\(a WordPiece vocabulary\)"):
        prepare(path, wordpiece_dir, tmp_path / "x", tokenizer_kind="bpe", progress=False)
    with pytest.raises(ValueError, match="tokenizer given is bpe"):
        prepare(path, bpe, tmp_path / "x", tokenizer_kind="wordpiece", progress=False)
    with pytest.raises(ValueError, match="unknown tokenizer kind 'sentencepiece'"):
        prepare(path, bpe_dir, tmp_path / "x", tokenizer_kind="sentencepiece", progress=False)
    # Missing, half-present, ambiguous and mismatched files.
    with pytest.raises(FileNotFoundError, match="no such tokenizer directory"):
        prepare(path, tmp_path / "nowhere", tmp_path / "x", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no tokenizer files: expected vocab\.txt"):
        prepare(path, tmp_path / "empty", tmp_path / "x", progress=False)
    (bpe_dir / "merges.txt").rename(tmp_path / "merges.txt")
    with pytest.raises(ValueError, match=r"has vocab\.json but not merges\.txt"):
        prepare(path, bpe_dir, tmp_path / "x", progress=False)
    (tmp_path / "merges.txt").rename(bpe_dir / "merges.txt")
    both = tmp_path / "both"
    bpe.save(both)
    (both / "vocab.txt").write_bytes((wordpiece_dir / "vocab.txt").read_bytes())
    (both / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match="holds both a WordPiece vocabulary"):
        prepare(path, both, tmp_path / "x", progress=False)
    assert prepare(path, both, tmp_path / "both-out", tokenizer_kind="wordpiece", progress=False) \
        .tokenizer_kind == "wordpiece"
    merges = (bpe_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    (bpe_dir / "merges.txt").write_text("\n".join(merges[:5] + ["zz qq"] + merges[5:]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merge 5 \('zz' 'qq'\) needs 'zz'.*do not belong together"):
        prepare(path, bpe_dir, tmp_path / "x", progress=False)


def test_shards_refuse_a_tokenizer_of_the_other_kind(bpe_dir, wordpiece_dir, docs, tmp_path):
    prepare(write_corpus(tmp_path / "corpus.txt", docs), bpe_dir, tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="made with the bpe vocabulary .* tokenizer given is wordpiece"):
        ShardedCorpus(tmp_path / "out", tokenizer=wordpiece_dir)


def test_cli_trains_a_bpe_vocabulary_and_prepares_with_it(docs, wordpiece_dir, tmp_path, capsys):
    path = write_corpus(tmp_path / "corpus.txt", docs)
    assert cli.main(["tokenizer", "train", "--kind", "bpe", "--files", str(path), "--vocab-size", "400",
                     "--min-frequency", "1", "--out", str(tmp_path / "tok"), "--quiet"]) == 0
    tok = load_tokenizer(tmp_path / "tok")
    assert isinstance(tok, ByteLevelBPETokenizer) and tok.vocab_size == 400
    assert cli.main(["prepare", "--corpus", str(path), "--tokenizer", str(tmp_path / "tok"), "--out",
                     str(tmp_path / "out"), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert summary["tokenizer_kind"] == "bpe" and summary["vocab_hash"] == tok.vocab_hash()
    assert cli.main(["prepare", "--corpus", str(path), "--tokenizer", str(wordpiece_dir), "--tokenizer-kind", "bpe",
                     "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "a bpe tokenizer needs vocab.json + merges.txt" in capsys.readouterr().err
    assert cli.main(["tokenizer", "train", "--kind", "bpe", "--cased", "--files", str(path), "--out",
                     str(tmp_path / "t2"), "--quiet"]) == 2
    assert "WordPiece options" in capsys.readouterr().err


# ---- pretraining on BPE shards ------------------------------------------------------------------------------
def test_roberta_pretrains_on_bpe_shards_with_s_and_slash_s(bpe, bpe_dir, tmp_path, monkeypatch):
    from bertkit.training import pretrain as pretrain_module
    from bertkit.inference import fill_mask
    from bertkit.models import IGNORE_INDEX

    rng = random.Random(0)
    docs = [[sentence(rng) for _ in range(rng.randint(2, 6))] for _ in range(120)]
    prepare(write_corpus(tmp_path / "corpus.txt", docs), bpe_dir, tmp_path / "data", eval_fraction=0.25,
            progress=False)
    seen = {}
    real_train = pretrain_module.train

    def spy(model, objective, stream, *args, **kwargs):
        batches = iter(stream)
        seen["batch"] = {k: v.numpy() for k, v in next(batches).items() if k != "_state"}
        batches.close()  # the real run iterates the stream afresh, from its beginning
        seen["pad_token_id"] = model.config.pad_token_id
        return real_train(model, objective, stream, *args, **kwargs)

    monkeypatch.setattr(pretrain_module, "train", spy)
    config = pretrain_module.resolve_config("roberta-mini", {
        "preset": "tiny", "max_seq_length": 32, "max_predictions_per_seq": 5, "batch_size": 16, "max_steps": 60,
        "learning_rate": 2e-3, "log_every": 1, "eval_instances": 64, "save_every": 1000, "progress": False})
    result = pretrain_module.pretrain(tmp_path / "data", tmp_path / "run", config)

    batch = seen["batch"]
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    original = np.where(labels != IGNORE_INDEX, labels, ids)
    lengths = mask.sum(1)
    assert (ids[:, 0] == 0).all()  # every row opens with <s>
    assert all(original[r, lengths[r] - 1] == 2 for r in range(len(ids)))  # and closes with </s>
    assert ((ids == 1) == (mask == 0)).all() and seen["pad_token_id"] == 1  # <pad> = 1 pads, and only pads
    assert (ids == 4).any() and not np.isin(original[mask == 1], [1, 3, 4]).any()  # <mask> only by masking
    assert (batch["token_type_ids"] == 0).all() and "next_sentence_label" not in batch

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 60 and np.mean(losses[-10:]) < np.mean(losses[:10]) - 1.0
    before, after = records[0], result.eval_metrics  # held-out MLM before the first step and at the end
    assert after["eval_mlm_loss"] < before["eval_mlm_loss"] - 1.0
    assert after["eval_mlm_accuracy"] > before["eval_mlm_accuracy"] + 0.03
    model_dir = tmp_path / "run" / "model"
    saved = json.loads((model_dir / "config.json").read_text())
    assert (saved["model_type"], saved["pad_token_id"], saved["bos_token_id"], saved["eos_token_id"]) == \
        ("roberta", 1, 0, 2)
    assert saved["architectures"] == ["RobertaForMaskedLM"]
    assert load_tokenizer(model_dir).vocab_hash() == bpe.vocab_hash()
    predictions = fill_mask(model_dir, "The cat sat on the <mask>.", top_k=3)
    assert len(predictions) == 1 and len(predictions[0]) == 3


def test_random_replacements_are_every_real_bpe_piece(bpe):
    from bertkit.training.pretrain import random_token_ids

    assert random_token_ids(bpe).tolist() == sorted(set(range(bpe.vocab_size)) - set(bpe.special_ids))
