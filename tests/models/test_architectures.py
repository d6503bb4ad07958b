"""The architecture table (bertkit.models.registry): every row agrees with the code it describes, and the tables
derived from it (ROLE_CLASSES, OBJECTIVE_MODEL_TYPES, the refused matrix cells, config_class_for, FORMATS' keys)
hold exactly the rows' facts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import bertkit.models as models
from bertkit.checkpoint import FORMATS
from bertkit.config import BertConfig, ConfigFile, config_class_for, presets_for
from bertkit.models.registry import (ARCHITECTURES, OBJECTIVE_MODEL_TYPES, OBJECTIVES, ROLE_NAMES, architecture,
                                     architecture_of, config_classes, refused_cells)
from bertkit.training.objectives import check_objective
from bertkit.tasks.base import MATRIX_FAMILIES, MATRIX_KINDS, REFUSED


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_role_class_exists_and_reads_the_rows_config_class(name):
    row = ARCHITECTURES[name]
    assert set(row.roles) <= set(ROLE_NAMES)
    for role, class_name in row.roles.items():
        cls = getattr(models, class_name)
        # SentenceEncoder wraps any encoder; every other class reads config.json as the row's config class
        if class_name != "SentenceEncoder":
            assert getattr(cls, "config_class", BertConfig) is row.config_class, (role, class_name)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_each_row_is_what_config_json_reads_and_checkpoint_maps(name):
    row = ARCHITECTURES[name]
    assert config_class_for(row.model_type) is row.config_class
    assert presets_for(row.model_type) is row.presets and row.presets
    assert row.model_type in FORMATS  # one mapping table per model_type
    assert set(row.objectives) <= set(OBJECTIVES)
    assert all(kind in MATRIX_KINDS for kind in row.refused)
    assert row.pretraining_role in row.roles


def test_the_table_covers_every_mapping_table_and_config_class():
    assert {row.model_type for row in ARCHITECTURES.values()} == set(FORMATS)
    assert set(config_classes()) == set(ConfigFile.__subclasses__())
    # config_class_for derives from the classes' own model_type: an unknown type stays BERT's (its from_dict
    # then names what bertkit reads)
    assert config_class_for(None) is BertConfig and config_class_for("gpt2") is BertConfig


def test_derived_tables_hold_the_rows_facts():
    assert OBJECTIVE_MODEL_TYPES == {"t5": "t5", "xlnet": "xlnet", "elmo": "elmo"}
    assert MATRIX_FAMILIES == {name: row.label for name, row in ARCHITECTURES.items()}
    assert REFUSED == refused_cells()
    assert {cell for cell in REFUSED if cell[1] == "export"} == {
        (name, "export") for name, row in ARCHITECTURES.items() if row.onnx_refusal}
    assert {name for name, row in ARCHITECTURES.items() if row.onnx_refusal} == {"t5", "xlnet", "elmo"}
    roles = models.ROLE_CLASSES
    assert set(roles) == set(ARCHITECTURES)  # the causal model is a row like every other
    for row in ARCHITECTURES.values():
        assert {r: c.__name__ for r, c in roles[row.name].items()} == row.roles


def test_class_for_and_pretraining_class_follow_the_rows():
    from bertkit.config import T5Config, XLNetConfig

    causal = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, causal=True)
    assert architecture_of(causal).name == "causal" and architecture_of(BertConfig()).name == "bert"
    assert models.pretraining_class(causal).__name__ == "BertForCausalLM"
    assert models.pretraining_class(BertConfig()).__name__ == "BertForPreTraining"
    assert models.pretraining_class(T5Config.preset("tiny")).__name__ == "T5ForConditionalGeneration"
    assert models.class_for(XLNetConfig.preset("tiny"), "qa").__name__ == "XLNetForQuestionAnswering"
    with pytest.raises(ValueError, match="bertkit has no masked-LM model for model_type 't5' \\(here\\)"):
        models.class_for(T5Config.preset("tiny"), "mlm", "here")
    with pytest.raises(ValueError, match="unknown model_type 'gpt2'"):
        architecture("gpt2")


def test_rows_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ARCHITECTURES["bert"].label = "x"


def test_the_table_and_the_matrix_import_without_torch():
    code = ("import sys, bertkit.models.registry, bertkit.tasks.base\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("objective, model_type, named", [
    ("roberta", "t5", "objective 'roberta' with model_type 't5'"), ("t5", "bert", "the t5 objective"),
    ("xlnet", "modernbert", "the xlnet objective"), ("causal", "elmo", "the elmo objective"),
    ("bert", "modernbert", "sentence-pair head"), ("electra", "modernbert", "roberta, roberta-doc")])
def test_check_objective_refuses_what_the_row_does_not_take(objective, model_type, named):
    from bertkit.training.objectives import check_objective

    with pytest.raises(ValueError, match=named):
        check_objective(objective, model_type)
    for name, row in ARCHITECTURES.items():
        if name != "causal":
            for taken in row.objectives:
                check_objective(taken, row.model_type)  # every objective a row lists passes


def test_every_objective_is_taken_by_some_row():
    """An objective no row takes could never run (`check_objective` refuses it everywhere): each of the objectives
    table's rows is some architecture's, and its row names only architectures of the table."""
    taken = {objective for row in ARCHITECTURES.values() for objective in row.objectives}
    assert set(OBJECTIVES) == taken
    for name, row in OBJECTIVES.items():
        assert set(row.architectures) <= set(ARCHITECTURES)
        if row.masked_lm:  # the masked-LM objectives run on a BERT model
            check_objective(name, "bert")


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_each_objective_row_names_what_its_layers_resolve(name):
    """Every name an objective row holds resolves in the layer that owns it: its trainer task in
    bertkit.training.objectives (built from the row), its model class in bertkit.models, its stream and model builder in
    bertkit.training.pretrain, its instances in the loader, its special tokens on the tokenizer interface."""
    import bertkit.models
    import bertkit.training.objectives
    from bertkit.training import pretrain
    from bertkit.data.loader import OBJECTIVE_INSTANCES
    row = OBJECTIVES[name]
    task_class = getattr(bertkit.training.objectives, row.task_class)
    settings = {"char_table": None} if row.stream == "word-windows" else {}
    assert isinstance(task_class.for_recipe(row, settings), task_class)
    assert getattr(task_class.for_recipe(row, settings), "pair_task", None) == row.pair_task
    if row.model is not None:
        assert isinstance(getattr(bertkit.models, row.model), type)
    for arch in row.architectures:
        assert row.model_role in ARCHITECTURES[arch].roles or row.model is not None
    assert row.stream in pretrain.STREAMS and row.build in pretrain.BUILDERS
    assert row.instances in OBJECTIVE_INSTANCES or row.stream == "word-windows"
    assert set(row.special_tokens) <= set(pretrain.SPECIAL_TOKENS)
    assert row.implies is None or row.implies in row.architectures


def test_no_objective_name_is_tested_outside_the_table():
    """The objective table is the only place an objective's name is branched on: no `objective ==` or
    `objective in (...)` anywhere in the package."""
    import re
    from pathlib import Path

    import bertkit

    pattern = re.compile(r"objective\s*(==|!=|in\s*\(|not\s+in\s*\()")
    hits = [f"{path.name}:{n}" for path in Path(bertkit.__file__).parent.rglob("*.py")
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_each_rows_tokenizer_fields_are_its_config_fields_and_the_tokenizers_ids(name):
    """A fresh model's special ids come from its row (`tokenizer_fields`): each names a field its config class has
    and a tokenizer attribute, and `tokenizer_ids` reads exactly those (pad_token_id for every row)."""
    row = ARCHITECTURES[name]
    fields = {f.name for f in dataclasses.fields(row.config_class)}
    assert set(row.tokenizer_fields) | {"pad_token_id"} <= fields

    class Tokenizer:  # distinct values, so a field read from the wrong attribute shows
        pad_id, cls_id, sep_id, char_vocab_size, max_characters = 1, 2, 3, 4, 5

    ids = row.tokenizer_ids(Tokenizer())
    assert ids == {"pad_token_id": 1, **{k: getattr(Tokenizer, a) for k, a in row.tokenizer_fields.items()}}
    # the facts each family's config.json names: RoBERTa's <s> </s>, T5's decoder start at the padding id
    expected = {"roberta": {"bos_token_id": 2, "eos_token_id": 3}, "albert": {"bos_token_id": 2, "eos_token_id": 3},
                "modernbert": {"cls_token_id": 2, "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3},
                "t5": {"eos_token_id": 3, "decoder_start_token_id": 1},
                "elmo": {"char_vocab_size": 4, "max_characters": 5}}
    assert ids == {"pad_token_id": 1, **expected.get(name, {})}


def test_one_label_per_architecture_from_its_config_class():
    from bertkit.config import label_of, with_article

    assert {name: row.label for name, row in ARCHITECTURES.items()} == {
        "bert": "BERT", "roberta": "RoBERTa", "albert": "ALBERT", "electra": "ELECTRA", "distilbert": "DistilBERT",
        "causal": "causal (GPT-style) BERT", "modernbert": "ModernBERT", "t5": "T5", "xlnet": "XLNet", "elmo": "ELMo"}
    for row in ARCHITECTURES.values():
        if row.name != "causal":
            assert row.label == label_of(row.model_type) == row.config_class.label_of(row.model_type)
    assert [with_article(label_of(t)) for t in ("t5", "xlnet", "elmo", "albert", "bert")] == [
        "a T5", "an XLNet", "an ELMo", "an ALBERT", "a BERT"]


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_matrix_family_of_each_rows_config_json_is_the_row(name):
    """tasks.base.matrix_family reads the row from the registry (no tuple of family names of its own): a config.json
    of each row's architecture, as bertkit writes it, is that row's (a causal BERT-family one: "causal")."""
    from bertkit.tasks.base import matrix_family

    row = ARCHITECTURES[name]
    if row.config_class is BertConfig:
        config = BertConfig.for_family(row.model_type, **row.config_fields)
    else:
        config = row.config_class.preset(next(iter(row.presets)), **row.config_fields)
    assert matrix_family(config.json_dict()) == name
    if name in ("roberta", "electra"):  # their causal variants (is_decoder true) are the causal row too
        assert matrix_family(BertConfig.for_family(name, causal=True).json_dict()) == "causal"
