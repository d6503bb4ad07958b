"""`bertkit.models.ModelDir`: every architecture's directory read once, answering what it holds and loading it for
each use; a bad or missing file is one line naming the directory and the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit.config import BertConfig, ElmoConfig, ModernBertConfig, T5Config, XLNetConfig
from bertkit.models import (BertForCausalLM, BertForMaskedLM, BertForMultipleChoice, BertForPreTraining,
                            BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                            BertModel, ElmoLanguageModel, ElmoModel, ModelDir, ModernBertForMaskedLM,
                            ModernBertForSequenceClassification, ModernBertForTokenClassification, ModernBertModel,
                            T5EncoderModel, T5ForConditionalGeneration, XLNetForQuestionAnswering, XLNetLMHeadModel,
                            XLNetModel)
from bertkit.models.modeldir import SERVED_USES, USES
from bertkit.tasks import KINDS, family_for
from bertkit.tasks.base import SERVED_KINDS, default_kind
from bertkit.tokenizers import UnigramTokenizer, WordPieceTokenizer, WordTokenizer

TEXTS = [f"the cat {w} on the mat number {i}" for i, w in enumerate(["sat", "ran", "slept", "ate"] * 10)]
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=48)


@pytest.fixture(scope="module")
def wordpiece():
    return WordPieceTokenizer.train(TEXTS, vocab_size=80, show_progress=False)


def save(model, path: Path, tokenizer, finetune: dict | None = None) -> Path:
    model.save_pretrained(path, tokenizer=tokenizer)
    if finetune is not None:
        (path / "finetune.json").write_text(json.dumps(finetune), encoding="utf-8")
    return path


def bert_config(tokenizer, **fields) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, **SMALL, **fields)


# ---- what each architecture's bare (pretrained) directory holds --------------------------------------------------
def test_a_bert_pretraining_directory(tmp_path, wordpiece):
    model_dir = ModelDir.open(save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "bert", wordpiece))
    assert model_dir.model_type == "bert" and isinstance(model_dir.config, BertConfig)
    assert model_dir.architectures == ["BertForMaskedLM"] and model_dir.head_role == "mlm"
    assert model_dir.max_positions == 48 and model_dir.info == {} and model_dir.task_model is None
    assert model_dir.form == "head" and not model_dir.generates and not model_dir.text_to_text
    assert default_kind(model_dir) == "fill-mask"
    assert model_dir.tokenizer().vocab_hash() == wordpiece.vocab_hash()
    assert type(model_dir.load("encoder")) is BertModel
    assert type(model_dir.load("mlm")) is BertForMaskedLM
    assert model_dir.model_class("fill-mask") is model_dir.model_class("pretraining")
    assert ModelDir.open(model_dir) is model_dir  # a ModelDir passes through


def test_a_causal_directory_generates(tmp_path, wordpiece):
    model_dir = ModelDir.open(save(BertForCausalLM(bert_config(wordpiece, causal=True)), tmp_path / "gpt", wordpiece))
    assert model_dir.causal and model_dir.generates and model_dir.model_class("generate") is BertForCausalLM
    assert default_kind(model_dir) == "generate" and type(model_dir.load("generate")) is BertForCausalLM


def test_config_json_is_parsed_once_per_load(tmp_path, wordpiece, monkeypatch):
    """from_pretrained reads through ModelDir, and checkpoint.load_model takes the config ModelDir parsed: one read of
    config.json per load, by whichever door it comes in (a class's from_pretrained, a role, a class)."""
    import bertkit.models.modeldir as modeldir

    path = save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "m", wordpiece)
    reads: list[Path] = []
    real = modeldir.read_config
    monkeypatch.setattr(modeldir, "read_config", lambda directory: reads.append(Path(directory)) or real(directory))
    model = BertForMaskedLM.from_pretrained(path)
    assert reads == [path] and type(model) is BertForMaskedLM
    model_dir = ModelDir.open(path)
    for how, cls in (("mlm", BertForMaskedLM), (BertForMaskedLM, BertForMaskedLM), ("encoder", BertModel),
                     ("pretraining", BertForPreTraining)):
        assert type(model_dir.load(how, new_heads=how == "pretraining")) is cls  # an MLM directory has no NSP head
    assert reads == [path, path]  # the second: ModelDir.open; its loads read no config again
    torch.testing.assert_close(model_dir.load(BertForMaskedLM).state_dict(), model.state_dict(), rtol=0, atol=0)


def test_every_use_loads_its_role_and_the_served_uses_are_served(tmp_path, wordpiece):
    bert = ModelDir.open(save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "bert", wordpiece))
    gpt = ModelDir.open(save(BertForCausalLM(bert_config(wordpiece, causal=True)), tmp_path / "gpt", wordpiece))
    classes = {"pretraining": bert.model_class("pretraining"), "encoder": BertModel, "generate": BertForCausalLM}
    for name, use in USES.items():
        assert (gpt if use.role == "generate" else bert).model_class(name) is classes[use.role], name
        assert use.input_fields == (("text",), ())  # one text per served input
    assert SERVED_USES == ("fill-mask", "embeddings", "generate")  # `bertkit features` reads "features"
    # what serve and export offer: every kind whose family predicts, and the served uses; nothing twice
    predicting = {k for k in KINDS if family_for(k).predicts_as is None}
    assert len(set(SERVED_KINDS)) == len(SERVED_KINDS) and set(SERVED_KINDS) == predicting | set(SERVED_USES)


def test_a_modernbert_directory(tmp_path, wordpiece):
    config = ModernBertConfig(vocab_size=wordpiece.vocab_size, **{**SMALL, "num_hidden_layers": 3},
                              global_attn_every_n_layers=2, local_attention=8, pad_token_id=wordpiece.pad_id)
    model_dir = ModelDir.open(save(ModernBertForMaskedLM(config), tmp_path / "modernbert", wordpiece))
    assert model_dir.model_type == "modernbert" and model_dir.max_positions == 48
    assert model_dir.model_class("sequence") is ModernBertForSequenceClassification
    assert type(model_dir.load("encoder")) is ModernBertModel and default_kind(model_dir) == "fill-mask"


def test_an_xlnet_directory(tmp_path):
    tokenizer = UnigramTokenizer.train(TEXTS, vocab_size=60, show_progress=False, xlnet=True)
    config = XLNetConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_layer=2, n_head=4, d_inner=48, mem_len=16)
    model_dir = ModelDir.open(save(XLNetLMHeadModel(config), tmp_path / "xlnet", tokenizer))
    assert model_dir.model_type == "xlnet" and isinstance(model_dir.config, XLNetConfig)
    assert type(model_dir.load("encoder")) is XLNetModel and model_dir.model_class("qa") is XLNetForQuestionAnswering
    assert not model_dir.generates


def t5_dir(path: Path, finetune: dict | None = None) -> Path:
    tokenizer = UnigramTokenizer.train(TEXTS, vocab_size=60, show_progress=False, extra_ids=3)
    config = T5Config(vocab_size=tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return save(T5ForConditionalGeneration(config), path, tokenizer, finetune)


def test_a_t5_directory_is_text_to_text(tmp_path):
    model_dir = ModelDir.open(t5_dir(tmp_path / "t5"))
    assert model_dir.model_type == "t5" and model_dir.text_to_text and model_dir.generates
    assert model_dir.form == "text-to-text" and model_dir.head_role == "seq2seq"
    assert default_kind(model_dir) == "generate"
    assert type(model_dir.load("generate")) is T5ForConditionalGeneration
    assert type(model_dir.load("encoder")) is T5EncoderModel
    with pytest.raises(ValueError, match=r"no sequence-classification model for model_type 't5'"):
        model_dir.load("sequence")
    tuned = ModelDir.open(t5_dir(tmp_path / "t5-glue", {"kind": "glue", "task": "sst2", "text_to_text": True}))
    assert tuned.trained_kind == "glue" and default_kind(tuned) == "classify"  # a GLUE model predicts as classify


def elmo_dir(path: Path) -> tuple[Path, WordTokenizer]:
    tokenizer = WordTokenizer.train(TEXTS, vocab_size=30, max_characters=10, show_progress=False)
    config = ElmoConfig.preset("tiny", vocab_size=tokenizer.vocab_size, char_vocab_size=tokenizer.char_vocab_size,
                               max_characters=10)
    return save(ElmoLanguageModel(config), path, tokenizer), tokenizer


def test_an_elmo_directory(tmp_path):
    path, _ = elmo_dir(tmp_path / "elmo")
    model_dir = ModelDir.open(path)
    assert model_dir.model_type == "elmo" and isinstance(model_dir.config, ElmoConfig)
    assert model_dir.max_positions > 10 ** 9  # ELMo reads any length
    assert model_dir.tokenizer().open_vocabulary  # unknown words keep their spelling
    assert type(model_dir.load("encoder")) is ElmoModel and not model_dir.has_role("sequence")
    assert default_kind(model_dir) == "embeddings"


def test_a_released_bilm_tf_elmo(tmp_path):
    pytest.importorskip("h5py", reason="reading bilm-tf's weights.hdf5 needs h5py (pip install 'bertkit[elmo]')")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_elmo_hdf5 import write_bilm

    model_dir = ModelDir.open(write_bilm(tmp_path / "bilm"))
    assert model_dir.model_type == "elmo" and model_dir.raw["model_type"] == "elmo"
    assert model_dir.tokenizer().open_vocabulary
    encoder = model_dir.load("encoder")
    assert type(encoder) is ElmoModel and encoder.config == model_dir.config


# ---- fine-tuned directories: each head, and the frozen-feature task model --------------------------------------
@pytest.mark.parametrize("cls, role, kind", [
    (BertForSequenceClassification, "sequence", "classify"), (BertForTokenClassification, "token", "ner"),
    (BertForQuestionAnswering, "qa", "squad"), (BertForMultipleChoice, "choice", "swag")])
def test_a_fine_tuned_bert_of_each_kind(tmp_path, wordpiece, cls, role, kind):
    path = save(cls(bert_config(wordpiece)), tmp_path / kind, wordpiece, {"kind": kind, "max_seq_length": 32})
    model_dir = ModelDir.open(path)
    assert model_dir.head_role == role and model_dir.trained_kind == kind and model_dir.info["max_seq_length"] == 32
    assert default_kind(model_dir) == kind and model_dir.form == "head"
    assert type(model_dir.load(role)) is cls
    encoder = model_dir.load("encoder")  # a token classifier or QA model has no pooler: the encoder loads without
    assert type(encoder) is BertModel and (encoder.pooler is None) == (role in ("token", "qa"))


def test_a_rerank_directory_serves_as_rerank(tmp_path, wordpiece):
    path = save(BertForSequenceClassification(bert_config(wordpiece), num_labels=1), tmp_path / "rr", wordpiece,
                {"kind": "rerank"})
    assert default_kind(ModelDir.open(path)) == "rerank"


def test_a_transformers_task_directory_without_finetune_json(tmp_path, wordpiece):
    path = save(ModernBertForTokenClassification(ModernBertConfig(
        vocab_size=wordpiece.vocab_size, **SMALL, pad_token_id=wordpiece.pad_id), num_labels=3),
        tmp_path / "mb-ner", wordpiece)
    model_dir = ModelDir.open(path)
    assert model_dir.trained_kind is None and model_dir.head_role == "token" and default_kind(model_dir) == "ner"


def test_a_task_model_on_encoder_layers(tmp_path):
    from bertkit.features import FeatureTaskModel, encoder_shape

    path, tokenizer = elmo_dir(tmp_path / "elmo")
    encoder = ModelDir.open(path).load("encoder")
    count, width = encoder_shape(encoder, tokenizer)
    model = FeatureTaskModel(encoder, tokenizer, "token", num_labels=3, num_hidden=count, width=width, layers=[0, 1],
                             task_model="bilstm", lstm_hidden=8, labels=["O", "B-X", "I-X"])
    model.save_pretrained(tmp_path / "tagger", tokenizer=tokenizer)
    (tmp_path / "tagger" / "finetune.json").write_text(json.dumps({"kind": "ner"}), encoding="utf-8")
    model_dir = ModelDir.open(tmp_path / "tagger")
    assert model_dir.form == "feature-task" and model_dir.task_model["role"] == "token"
    assert model_dir.task_model["labels"] == ["O", "B-X", "I-X"] and default_kind(model_dir) == "ner"
    loaded = FeatureTaskModel.from_pretrained(model_dir)
    assert loaded.labels == ["O", "B-X", "I-X"]
    for a, b in zip(loaded.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


# ---- errors: one line naming the directory and the file ---------------------------------------------------------
def test_a_missing_directory_or_config_is_one_line(tmp_path):
    for path in (tmp_path / "nope", tmp_path):
        with pytest.raises(FileNotFoundError) as err:
            ModelDir.open(path)
        assert str(err.value) == f"{path}: no config.json; not a model directory"


@pytest.mark.parametrize("name, text, says", [
    ("config.json", '{"hidden_size": 32,', "not valid JSON"),
    ("config.json", "[1, 2]", "expected a JSON object"),
    ("finetune.json", "{kind", "not valid JSON"),
    ("task_model.json", '"bilstm"', "expected a JSON object")])
def test_a_bad_file_is_one_line_naming_it(tmp_path, wordpiece, name, text, says):
    path = save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "m", wordpiece)
    (path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        ModelDir.open(path)
    message = str(err.value)
    assert message.startswith(str(path / name)) and says in message and "\n" not in message


def test_a_bad_config_field_names_the_file(tmp_path, wordpiece):
    path = save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "m", wordpiece)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "hidden_size": "wide"}), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        ModelDir.open(path)
    assert str(path / "config.json") in str(err.value) and "hidden_size" in str(err.value)


def test_generation_needs_a_model_that_generates(tmp_path, wordpiece):
    model_dir = ModelDir.open(save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "m", wordpiece))
    with pytest.raises(ValueError, match=r": not a causal model \(config.json has no is_decoder: true\)"):
        model_dir.load("generate")


def test_missing_tokenizer_files_name_the_directory(tmp_path, wordpiece):
    path = save(BertForMaskedLM(bert_config(wordpiece)), tmp_path / "m", None)
    with pytest.raises(FileNotFoundError, match="the teacher must be a model directory with its tokenizer files"):
        ModelDir.open(path).tokenizer("teacher")
