"""`bertkit extend-context`: a BERT directory grown to longer inputs (position table copied or interpolated), then
continued pretraining at the longer length; ModernBERT's rotary directories change config.json only."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from bertkit.cli import main
from bertkit.models import BertForPreTraining, BertModel, ModernBertForMaskedLM
from bertkit.training.extend_context import grown_position_table
from conftest import tiny_config

transformers = pytest.importorskip("transformers")
TABLE = "bert.embeddings.position_embeddings.weight"


def run(*argv) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, f"bertkit {' '.join(map(str, argv))} exited {code}"


@pytest.fixture()
def bert_dir(tmp_path, tiny_tokenizer):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(vocab_size=tiny_tokenizer.vocab_size, max_position_embeddings=16))
    model.save_pretrained(tmp_path / "bert", tokenizer=tiny_tokenizer)
    return tmp_path / "bert"


def test_copy_keeps_the_learned_rows_and_repeats_them():
    table = torch.randn(5, 3)
    grown = grown_position_table(table, 12, "copy")
    assert grown.shape == (12, 3)
    assert torch.equal(grown[:5], table) and torch.equal(grown[5:10], table) and torch.equal(grown[10:], table[:2])
    # RoBERTa's offset rows (padding_idx + 1 of them) are not positions: kept, and the learned rows repeat after.
    with_offset = grown_position_table(table, 6, "copy", offset=2)
    assert torch.equal(with_offset[:5], table) and torch.equal(with_offset[5:], table[2:5])


def test_interpolate_stretches_the_table_between_its_ends():
    table = torch.arange(5.0)[:, None].repeat(1, 2)  # (5, 2): row i holds i, i
    grown = grown_position_table(table, 9, "interpolate")  # row j sits at 4 * j / 8 = j / 2 of the old table
    torch.testing.assert_close(grown, (torch.arange(9.0) / 2)[:, None].repeat(1, 2), atol=1e-6, rtol=0)
    assert torch.equal(grown[0], table[0]) and torch.equal(grown[-1], table[-1])
    with pytest.raises(ValueError, match="already has 5 positions"):
        grown_position_table(table, 5)
    with pytest.raises(ValueError, match="unknown extension method 'cubic'"):
        grown_position_table(table, 9, "cubic")


@pytest.mark.parametrize("method", ["copy", "interpolate"])
def test_extend_context_grows_a_bert_directory(method, bert_dir, tmp_path, capsys, tiny_tokenizer):
    out = tmp_path / f"bert-{method}"
    run("extend-context", "--model", bert_dir, "--max-position-embeddings", 40, "--method", method, "--out", out)
    summary = json.loads(capsys.readouterr().out)
    assert (summary["positions_before"], summary["positions_after"], summary["method"]) == (16, 40, method)
    before, after = load_file(str(bert_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert after[TABLE].shape == (40, 32)
    if method == "copy":
        assert torch.equal(after[TABLE][:16], before[TABLE])  # the first rows are the learned ones, unchanged
        assert torch.equal(after[TABLE][16:32], before[TABLE])
    else:
        assert torch.equal(after[TABLE][0], before[TABLE][0]) and torch.equal(after[TABLE][-1], before[TABLE][-1])
    assert all(torch.equal(after[k], v) for k, v in before.items() if k != TABLE)  # heads and all the rest kept
    assert (out / "vocab.txt").read_text() == (bert_dir / "vocab.txt").read_text()
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 40

    theirs, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = BertForPreTraining.from_pretrained(out).eval()
    ids = torch.randint(5, tiny_tokenizer.vocab_size, (2, 40))  # the new length runs, in both
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).prediction_logits, theirs.eval()(input_ids=ids).prediction_logits,
                                   atol=1e-5, rtol=0)
        if method == "copy":  # inputs the old table covered give what they gave
            old = BertForPreTraining.from_pretrained(bert_dir).eval()
            torch.testing.assert_close(ours(ids[:, :16]).prediction_logits, old(ids[:, :16]).prediction_logits,
                                       atol=1e-6, rtol=0)


def test_roberta_offset_rows_are_kept(tmp_path):
    config = tiny_config(model_type="roberta", padding_offset_positions=True, pad_token_id=1,
                         max_position_embeddings=18, type_vocab_size=1)
    torch.manual_seed(1)
    BertModel(config).save_pretrained(tmp_path / "roberta")
    run("extend-context", "--model", tmp_path / "roberta", "--max-position-embeddings", 32, "--out", tmp_path / "out")
    before = load_file(str(tmp_path / "roberta" / "model.safetensors"))
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    key = "embeddings.position_embeddings.weight"
    assert after[key].shape == (34, 32) and torch.equal(after[key][:18], before[key])
    assert torch.equal(after[key][18:], before[key][2:18])  # learned rows after the 2 offset rows, repeated
    theirs = transformers.RobertaModel.from_pretrained(str(tmp_path / "out"))
    assert theirs.config.max_position_embeddings == 34


def test_continued_pretraining_at_the_longer_length(bert_dir, tmp_path, capsys):
    """extend-context, then `pretrain --init-from OUT --max-seq-length N`: trains on rows longer than the old table;
    the same command on the original directory is refused, naming extend-context."""
    from conftest import synthetic_corpus

    corpus = synthetic_corpus(tmp_path / "corpus.txt", documents=20)
    run("prepare", "--corpus", corpus, "--tokenizer", bert_dir, "--out", tmp_path / "data", "--eval-fraction", "0.2",
        "--quiet")
    run("extend-context", "--model", bert_dir, "--max-position-embeddings", 48, "--out", tmp_path / "long")
    common = ["--data", tmp_path / "data", "--config", "tiny", "--objective", "roberta", "--max-seq-length", 48,
              "--max-predictions-per-seq", 8, "--batch-size", 4, "--max-steps", 3, "--save-every", 3,
              "--eval-instances", 4, "--progress", "false", "--log-every", 1]
    capsys.readouterr()
    assert main([str(a) for a in ["pretrain", "--out", tmp_path / "refused", "--init-from", bert_dir, *common]]) == 2
    err = capsys.readouterr().err
    assert "longer than its 16 positions" in err and "bertkit extend-context" in err
    run("pretrain", "--out", tmp_path / "run", "--init-from", tmp_path / "long", *common)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert max(r["tokens"] for r in rows if "tokens" in r) > 3 * 4 * 16  # rows longer than the old table ran
    theirs, info = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "run" / "model"),
                                                               output_loading_info=True)
    assert theirs.config.max_position_embeddings == 48 and not info["missing_keys"]


def test_modernbert_changes_config_only(tmp_path, tiny_tokenizer):
    from bertkit.config import ModernBertConfig

    config = ModernBertConfig.preset("tiny", vocab_size=tiny_tokenizer.vocab_size, pad_token_id=tiny_tokenizer.pad_id,
                                     max_position_embeddings=64, global_rope_theta=10000.0)
    ModernBertForMaskedLM(config).save_pretrained(tmp_path / "mb", tokenizer=tiny_tokenizer)
    run("extend-context", "--model", tmp_path / "mb", "--max-position-embeddings", 256, "--global-rope-theta",
        160000, "--out", tmp_path / "long")
    before, after = load_file(str(tmp_path / "mb" / "model.safetensors")), load_file(str(tmp_path / "long" /
                                                                                          "model.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    ours = ModernBertForMaskedLM.from_pretrained(tmp_path / "long")
    assert (ours.config.max_position_embeddings, ours.config.global_rope_theta) == (256, 160000.0)
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "long"))
    assert theirs.config.max_position_embeddings == 256
    ids = torch.randint(5, tiny_tokenizer.vocab_size, (1, 100))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids).prediction_logits, theirs.eval()(input_ids=ids).logits,
                                   atol=1e-5, rtol=0)


def test_bad_requests_are_refused_in_one_line(bert_dir, tmp_path, capsys):
    for argv, named in (
            (["--model", bert_dir, "--max-position-embeddings", 8, "--out", tmp_path / "a"], "already has 16"),
            (["--model", bert_dir, "--max-position-embeddings", 32, "--global-rope-theta", 1e5, "--out",
              tmp_path / "b"], "ModernBERT setting"),
            (["--model", bert_dir, "--max-position-embeddings", 32, "--out", bert_dir], "not empty")):
        capsys.readouterr()
        assert main(["extend-context", *map(str, argv)]) == 2
        err = capsys.readouterr().err.strip()
        assert named in err and "\n" not in err
    assert not (tmp_path / "a").exists() and not any(p.name.startswith(".a.") for p in tmp_path.iterdir())
