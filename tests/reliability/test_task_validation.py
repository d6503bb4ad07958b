"""Bad task inputs named in one line, never a traceback: invalid UTF-8 in GLUE, CoNLL, SWAG and user tables (file and
line), SQuAD fields of the wrong type (file, line and question), an empty CoLA sentence, `tokenize --max-length`
below the special tokens, out-of-range fine-tuning and distillation settings (the field named); and the run files
of fine-tuning and distillation written atomically, so a full disk names the file and leaves the old one whole."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from reliability_helpers import one_error_line

from bertkit import BertForPreTraining
from bertkit import io as bertkit_io
from bertkit.cli import main
from bertkit.training.distill import DistillConfig
from bertkit.errors import DataError
from bertkit.io import DiskFullError
from bertkit.tasks.run import FinetuneConfig, record_evaluation, resume_history
from bertkit.tasks.classify import read_table
from bertkit.tasks.glue import read_glue
from bertkit.tasks.ner import read_conll
from bertkit.tasks.squad import read_squad
from bertkit.tasks.swag import read_swag

BAD = b"caf\xe9"  # Latin-1, not UTF-8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "model"
    BertForPreTraining(tiny_config(vocab_size=tiny_tokenizer.vocab_size)).save_pretrained(path, tokenizer=tiny_tokenizer)
    return path


# ---- invalid UTF-8 -------------------------------------------------------------------------------------------
def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("reader, lines, bad_line", [
    (lambda p: read_glue("sst2", p), [b"sentence\tlabel", b"good\t1", BAD + b" food\t1", b"bad\t0"], 3),
    (lambda p: read_glue("cola", p), [b"gj04\t1\t\tOur friends won't buy this analysis.", b"gj04\t0\t*\t" + BAD], 2),
    (lambda p: read_glue("mrpc", p), [b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                                      b"1\t1\t2\ta b\t" + BAD], 2),
    (read_conll, [b"-DOCSTART- -X- O O", b"", b"EU NNP B-NP B-ORG", b"rejects VBZ B-VP O",
                  b"", BAD + b" NNP B-NP B-PER"], 6),
    (lambda p: read_table(p, "text", label_column="label", format="tsv"), [b"text\tlabel", b"ok\ta", BAD + b"\tb"], 3),
    (lambda p: read_table(p, "text", label_column="label", format="jsonl"),
     [b'{"text": "ok", "label": "a"}', b'{"text": "' + BAD + b'", "label": "b"}'], 2),
    (read_swag, [b"video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label",
                 b"v,1,a b,a,b,gold,e0,e1,e2," + BAD + b",0"], 2),
])
def test_invalid_utf8_names_the_file_and_line(tmp_path, reader, lines, bad_line):
    path = _write(tmp_path / "data.tsv", lines)
    at = lines[bad_line - 1].index(b"\xe9")
    with pytest.raises(DataError, match=rf"^{path}:{bad_line}: invalid UTF-8 \(byte 0xe9 at byte {at} of the line\)"):
        reader(path)


def test_invalid_utf8_in_squad_names_the_file_and_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_bytes(b'{"data": [\n{"title": "t", "paragraphs": [\n{"context": "' + BAD + b'", "qas": []}]}]}\n')
    with pytest.raises(DataError, match=rf"^{path}:3: invalid UTF-8"):
        read_squad(path)


def test_finetune_names_invalid_utf8_in_one_line(tmp_path, capsys, model_dir):
    train = _write(tmp_path / "train.tsv", [b"sentence\tlabel", b"good\t1", BAD + b" food\t0"])
    assert main(["finetune", "glue", "--task", "sst2", "--model", str(model_dir), "--train", str(train),
                 "--dev", str(train), "--out", str(tmp_path / "run")]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"bertkit: error: {train}:3: invalid UTF-8")


# ---- SQuAD fields of the wrong type --------------------------------------------------------------------------
def _squad(tmp_path, context="Paris is in France.", question="Where is Paris?", text="France", start=12,
           impossible=None, qid="q1") -> Path:
    qa = {"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}]}
    if impossible is not None:
        qa["is_impossible"] = impossible
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def _line_of_id(path: Path, qid: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if f'"id": "{qid}"' in line)


@pytest.mark.parametrize("change, said", [
    ({"context": 12}, "article 0 paragraph 0: context must be a string, found int 12"),
    ({"question": ["Where", "is"]}, 'question q1: question must be a string, found list ["Where", "is"]'),
    ({"question": None}, "question q1: question must be a string, found NoneType null"),
    ({"text": 7}, "question q1 answer 0: text must be a string, found int 7"),
    ({"start": "12"}, 'question q1 answer 0: answer_start must be an integer, found str "12"'),
    ({"start": True}, "question q1 answer 0: answer_start must be an integer, found bool true"),
    ({"impossible": "false"}, 'question q1: is_impossible must be true or false, found "false"'),
])
def test_squad_fields_of_the_wrong_type(tmp_path, change, said):
    path = _squad(tmp_path, **change)
    with pytest.raises(DataError) as caught:
        read_squad(path)
    assert str(caught.value) == f"{path}:{_line_of_id(path, 'q1')}: {said}"


def test_squad_id_of_the_wrong_type(tmp_path):
    path = _squad(tmp_path, qid={"a": 1})
    with pytest.raises(DataError, match=rf"^{path}: article 0 paragraph 0 question 0: id must be a string or an "
                                        r"integer, found dict"):
        read_squad(path)


# ---- an empty CoLA sentence ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sentence", ["", "   "])
def test_empty_cola_sentence_raises(tmp_path, sentence):
    path = tmp_path / "in_domain_train.tsv"
    path.write_text(f"gj04\t1\t\tA fine sentence.\ngj04\t0\t*\t{sentence}\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}:2: empty text field 3$"):
        read_glue("cola", path)


def test_empty_pair_raises_and_skip_malformed_skips_it(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta b\tc d\n0\t3\t4\te f\t \n",
                    encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}:3: empty pair field 4$"):
        read_glue("mrpc", path)
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        kept = read_glue("mrpc", path, skip_malformed=True)
    assert [(e.text, e.pair, e.label) for e in kept] == [("a b", "c d", "1")]
    # A user's own table may hold empty texts (read_table's contract).
    assert read_table(path, "#1 String", "#2 String", "Quality", format="tsv")[1].pair == " "


# ---- tokenize --max-length -----------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, needed", [(["--max-length", "1"], 2), (["--max-length", "0"], 2),
                                           (["--max-length", "-5"], 2), (["--max-length", "2", "--pair", "b"], 3)])
def test_tokenize_max_length_below_the_special_tokens(tiny_vocab_dir, capsys, extra, needed):
    assert main(["tokenize", "--model-or-vocab", str(tiny_vocab_dir), "the quick fox", *extra]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--max-length {extra[1]}" in line and f"special tokens alone take {needed}" in line


def test_tokenize_max_length_at_the_special_tokens_still_works(tiny_vocab_dir, capsys):
    assert main(["tokenize", "--model-or-vocab", str(tiny_vocab_dir), "the quick fox", "--max-length", "3",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"][0] == "[CLS]"


# ---- settings out of range -----------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, said", [
    ("weight_decay", -0.01, "must not be negative"), ("max_grad_norm", -1.0, "must not be negative"),
    ("epochs", 0, "must be positive"), ("epochs", -1.0, "must be positive"),
    ("epochs", math.nan, "must be a finite number"), ("learning_rate", math.nan, "must be a finite number"),
    ("learning_rate", math.inf, "must be a finite number"), ("learning_rate", 0.0, "must be positive"),
    ("weight_decay", math.inf, "must be a finite number"), ("adam_epsilon", math.inf, "must be a finite number"),
    ("batch_size", 0, "must be an integer of at least 1"), ("batch_size", -4, "must be an integer of at least 1"),
    ("batch_size", 2.5, "must be an integer of at least 1"), ("eval_batch_size", 0, "must be an integer of at least 1"),
    ("warmup_ratio", math.nan, "must be a finite number"), ("dropout", math.nan, "must be a finite number"),
])
def test_finetune_config_ranges_name_the_field(field, value, said):
    with pytest.raises(ValueError, match=f"{field} {said}"):
        FinetuneConfig(**{field: value})


@pytest.mark.parametrize("field, value, said", [
    ("temperature", 0.0, "must be positive"), ("temperature", math.inf, "must be a finite number"),
    ("temperature", math.nan, "must be a finite number"), ("alpha_soft", -1.0, "must be a non-negative number"),
    ("alpha_hard", math.inf, "must be a finite number"), ("alpha_logits", math.nan, "must be a finite number"),
])
def test_distill_config_ranges_name_the_field(field, value, said):
    with pytest.raises(ValueError, match=f"{field} {said}"):
        DistillConfig(**{field: value})


@pytest.mark.parametrize("option, value, field", [("--weight-decay", "-0.1", "weight_decay"),
                                                  ("--max-grad-norm", "-1", "max_grad_norm"),
                                                  ("--epochs", "0", "epochs"), ("--learning-rate", "nan", "learning_rate"),
                                                  ("--batch-size", "0", "batch_size")])
def test_finetune_cli_refuses_out_of_range_settings_in_one_line(tmp_path, capsys, model_dir, option, value, field):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood\t1\nbad\t0\n", encoding="utf-8")
    assert main(["finetune", "glue", "--task", "sst2", "--model", str(model_dir), "--train", str(train),
                 "--dev", str(train), "--out", str(tmp_path / "run"), option, value]) == 2
    assert field in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run" / "config.yaml").exists()


# ---- run files written atomically ----------------------------------------------------------------------------
def test_eval_history_survives_a_full_disk(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    history = record_evaluation(run, [], {"epoch": 1, "step": 10, "accuracy": 0.5})
    before = (run / "eval.jsonl").read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bertkit_io.os, "fsync", full)
    with pytest.raises(DiskFullError, match=rf"^{run / 'eval.jsonl'}: no space left on the device"):
        record_evaluation(run, history, {"epoch": 2, "step": 20, "accuracy": 0.6})
    assert (run / "eval.jsonl").read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["eval.jsonl"]  # no temporary file left


def test_resume_reads_an_eval_history_with_a_torn_last_line(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval.jsonl").write_text('{"epoch": 1, "step": 10, "accuracy": 0.5}\n{"epoch": 2, "st', encoding="utf-8")
    import bertkit.tasks.run as taskrun  # the names resume_history reads

    monkeypatch.setattr(taskrun, "latest_checkpoint", lambda run_dir: run_dir / "checkpoints" / "step-20.pt")
    monkeypatch.setattr(taskrun, "resume_state_step", lambda path: 20)
    history, best = resume_history(run, True, "accuracy")
    assert history == [{"epoch": 1, "step": 10, "accuracy": 0.5}] and best == history[0]
