"""Bad inputs named in one line, never a traceback: config.json that is not an object, non-finite or absurd
sizes, weights of the wrong dtype, shape errors blamed on the right tensor, empty corpora, another vocabulary of the
same size, --resume on nothing or with other settings, a device that is not there, out-of-range settings; and a
metrics window that straddles a resume logs what the uninterrupted run logged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from reliability_helpers import make_prepared, one_error_line, pretrain_argv, tiny_overrides, training_records
from safetensors.torch import load_file, save_file

from bertkit import BertForPreTraining, BertModel, WordPieceTokenizer
from bertkit.checkpoint import CheckpointError, HeadMismatchError, ShapeMismatchError
from bertkit.cli import main
from bertkit.config import BertConfig
from bertkit.data.prepare import prepare
from bertkit.errors import DataError
from bertkit.training.pretrain import pretrain, resolve_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("validation"))


@pytest.fixture
def model_dir(tmp_path, tiny_tokenizer) -> Path:
    torch.manual_seed(0)
    BertForPreTraining(tiny_config(vocab_size=tiny_tokenizer.vocab_size)).save_pretrained(
        tmp_path / "model", tokenizer=tiny_tokenizer)
    return tmp_path / "model"


def _set_config(model_dir: Path, text: str) -> Path:
    path = model_dir / "config.json"
    path.write_text(text, encoding="utf-8")
    return path


# ---- config.json ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, said", [("[1, 2]", "expected a JSON object, found list"),
                                        ("null", "expected a JSON object, found NoneType"),
                                        ('{"vocab_size": 12', "not valid JSON")])
def test_config_json_that_is_not_an_object(model_dir, capsys, text, said):
    path = _set_config(model_dir, text)
    with pytest.raises(CheckpointError, match=f"^{path}: {said}"):
        BertModel.from_pretrained(model_dir)
    assert main(["info", str(model_dir)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"bertkit: error: {path}: {said}")
    with pytest.raises(ValueError, match="a config must be a JSON object, found"):
        BertConfig.from_dict(json.loads(text)) if text != '{"vocab_size": 12' else BertConfig.from_dict([])


@pytest.mark.parametrize("field, value", [("layer_norm_eps", "NaN"), ("initializer_range", "Infinity"),
                                          ("hidden_dropout_prob", "-Infinity"), ("layer_norm_eps", '"1e-12"')])
def test_non_finite_or_non_numeric_floats(model_dir, field, value):
    config = json.loads((model_dir / "config.json").read_text())
    text = json.dumps(config).replace(f'"{field}": {json.dumps(config[field])}', f'"{field}": {value}')
    path = _set_config(model_dir, text)
    with pytest.raises(ValueError, match=f"^{path}: BertConfig.{field} must be a finite number, got "):
        BertModel.from_pretrained(model_dir)


def test_absurd_sizes_are_refused_before_allocating(model_dir, capsys):
    config = json.loads((model_dir / "config.json").read_text())
    path = _set_config(model_dir, json.dumps({**config, "vocab_size": 2 ** 40}))
    with pytest.raises(ValueError, match=f"^{path}: BertConfig.vocab_size 1099511627776 is absurdly large"):
        BertModel.from_pretrained(model_dir)
    # 10^9 x 768 floats are 2.8 TiB: refused from the shapes alone, before anything is allocated
    path = _set_config(model_dir, json.dumps({**config, "vocab_size": 10 ** 9, "hidden_size": 768,
                                              "num_attention_heads": 12}))
    assert main(["fill-mask", "--model", str(model_dir), "a [MASK] b"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"bertkit: error: {path}: this model would need 2,8") and "GiB for its weights alone, " \
        "more than this machine's" in line and "vocab_size 1000000000" in line


# ---- weights ---------------------------------------------------------------------------------------------------
def _retype(model_dir: Path, name: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    path = model_dir / "model.safetensors"
    state = load_file(str(path))
    state[name] = state[name].to(dtype) if dtype != torch.complex64 else torch.complex(state[name], state[name])
    save_file(state, str(path), metadata={"format": "pt"})
    return state


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, torch.uint8])
def test_weights_that_are_not_floating_point_are_refused_by_name(model_dir, dtype):
    name = "bert.encoder.layer.1.attention.self.key.weight"
    _retype(model_dir, name, dtype)
    with pytest.raises(CheckpointError) as err:
        BertForPreTraining.from_pretrained(model_dir)
    assert str(err.value) == (f"{model_dir}: tensor {name!r} has dtype {str(dtype)[6:]}; weights must be floating "
                              f"point (float32, float16 or bfloat16)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_half_and_double_weights_convert_to_float32(model_dir, dtype):
    name = "bert.embeddings.word_embeddings.weight"
    state = _retype(model_dir, name, dtype)
    model = BertForPreTraining.from_pretrained(model_dir)
    weight = model.bert.embeddings.word.weight
    assert weight.dtype == torch.float32 and torch.equal(weight, state[name].float())


def test_a_shape_error_blames_the_head_only_when_it_is_the_head(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    _set_config(model_dir, json.dumps({**config, "intermediate_size": 40}))  # an encoder tensor no longer fits
    with pytest.raises(ShapeMismatchError) as err:
        BertForPreTraining.from_pretrained(model_dir)
    assert not isinstance(err.value, HeadMismatchError) and "head" not in str(err.value)
    assert f"{model_dir}: tensor 'bert.encoder.layer.0.intermediate.dense." in str(err.value)


# ---- corpora -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "\n\n\n   \n", "   "])
def test_an_empty_corpus_is_refused(tmp_path, tiny_vocab_dir, text):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=f"^{corpus}: "):
        prepare([corpus], tiny_vocab_dir, tmp_path / "data", progress=False)
    assert not (tmp_path / "data" / "manifest.json").exists()


def test_an_empty_eval_corpus_is_refused(tmp_path, tiny_vocab_dir, data_dir):
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"^{held_out}: no eval document in the eval corpus"):
        prepare([data_dir.parent / "corpus.txt"], tiny_vocab_dir, tmp_path / "data", eval_paths=[held_out],
                progress=False)


# ---- pretraining options -------------------------------------------------------------------------------------
def test_init_from_another_vocabulary_of_the_same_size(data_dir, tmp_path, capsys):
    ours = WordPieceTokenizer.from_pretrained(data_dir / "tokenizer")
    vocab = ours.get_vocab()
    swapped = sorted(vocab, key=vocab.get)
    swapped[-1], swapped[-2] = swapped[-2], swapped[-1]  # two tokens trade ids: same size, other vocabulary
    other = WordPieceTokenizer({token: i for i, token in enumerate(swapped)})
    BertForPreTraining(tiny_config(vocab_size=other.vocab_size)).save_pretrained(tmp_path / "init", tokenizer=other)
    assert main(pretrain_argv(data_dir, tmp_path / "run", "--init-from", str(tmp_path / "init"), max_steps=2)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"bertkit: error: {tmp_path / 'init'}: its vocabulary (wordpiece, hash ")
    assert f"although both have {ours.vocab_size} tokens" in line


def test_resume_on_nothing_starts_fresh_and_resume_with_other_settings_is_refused(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(pretrain_argv(data_dir, run, "--resume", max_steps=2, save_every=1)) == 0
    assert (f"bertkit: --resume: {run} holds no checkpoint (a new or empty run directory); starting a fresh run"
            in capsys.readouterr().err)
    for changes, named in [(dict(batch_size=16), "data.batch_size 8 -> 16; global batch size 8 -> 16"),
                           (dict(learning_rate=1e-3), "train.learning_rate 0.002 -> 0.001"),
                           (dict(hidden_size=64), "model.hidden_size 32 -> 64"),
                           (dict(objective="roberta"), "data.objective 'bert' -> 'roberta'")]:
        assert main(pretrain_argv(data_dir, run, "--resume", max_steps=2, save_every=1, **changes)) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"bertkit: error: {run}: --resume with other settings than the run was started "
                               f"with: {named}"), line
    other = make_prepared(tmp_path / "other", documents=30)
    assert main(pretrain_argv(other, run, "--resume", max_steps=2, save_every=1)) == 2
    assert f"data {data_dir} -> {other} (other vocabulary: 40 documents" in one_error_line(capsys.readouterr().err)
    # The budget may change: the run goes on from step 2.
    assert main(pretrain_argv(data_dir, run, "--resume", max_steps=3, save_every=1)) == 0
    assert sorted(training_records(run)) == [2, 3]  # the last step of each run is logged
    # A new run (no --resume) in a run directory replaces the earlier run's checkpoints, and says so.
    assert main(pretrain_argv(data_dir, run, max_steps=1, save_every=1)) == 0
    assert "held the checkpoints of an earlier run (up to step-00000003.pt)" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001.pt"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("device, said", [("cuda", "--device cuda: no CUDA GPU is available"),
                                          ("cuda:1", "--device cuda:1: no CUDA GPU is available"),
                                          ("tpu", "--device 'tpu': not a device name")])
def test_a_device_that_is_not_there(data_dir, tmp_path, capsys, device, said):
    assert main(pretrain_argv(data_dir, tmp_path / "run", max_steps=2, device=device)) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"bertkit: error: {said}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("setting, value, said", [
    ("weight_decay", "-0.01", "weight_decay must not be negative, got -0.01"),
    ("max_grad_norm", "-1", "max_grad_norm must not be negative, got -1.0 (0 turns clipping off)"),
    ("max_time", "-5", "max_time must be a positive number of seconds, got -5.0"),
    ("max_predictions_per_seq", "0", "max_predictions_per_seq must be at least 1, got 0"),
    ("learning_rate", "nan", "learning_rate must be a finite number, got nan"),
    ("max_tokens", "0", "max_tokens must be at least 1, got 0"),
    ("mask_prob", "inf", "DataConfig.mask_prob must be a finite number, got inf"),
    ("adam_beta2", "1.5", "adam_beta2 must be in [0, 1), got 1.5"),
    ("layer_norm_eps", "nan", "BertConfig.layer_norm_eps must be a finite number, got nan"),
])
def test_settings_out_of_range(data_dir, tmp_path, capsys, setting, value, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        config = resolve_config("tiny", {**tiny_overrides(), setting: value})
        BertConfig.preset("tiny", **config.model)  # the model section is checked when the model is built
    assert main(pretrain_argv(data_dir, tmp_path / "run", f"--{setting.replace('_', '-')}", value)) == 2
    assert said in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_metrics_window_straddling_a_resume_logs_what_the_uninterrupted_run_logged(data_dir, tmp_path):
    """save_every 3, log_every 4: the line at step 4 averages steps 1-4, of which 1-3 ran before the checkpoint."""
    settings = tiny_overrides(max_steps=8, save_every=3, log_every=4, keep_last=10)
    full = tmp_path / "full"
    pretrain(data_dir, full, resolve_config("tiny", settings), eval_at_start=False)
    # An interrupted run: the same directory as it stood just after the step-3 checkpoint.
    interrupted = Path(shutil.copytree(full, tmp_path / "interrupted"))
    for later in ("step-00000006.pt", "step-00000008.pt"):
        (interrupted / "checkpoints" / later).unlink()
    pretrain(data_dir, interrupted, resolve_config("tiny", settings), resume=True, eval_at_start=False)
    assert sorted(training_records(full)) == [4, 8]
    assert training_records(interrupted) == training_records(full)
