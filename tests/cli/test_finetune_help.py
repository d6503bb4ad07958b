"""bertkit.cli.finetune: `finetune KIND` offers the settings that kind's runs read and no other kind's, a full
command line of them parses into the FinetuneConfig it spells, and `bertkit --help` starts without torch."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
import textwrap

import pytest

from bertkit.cli import build_parser, main
from bertkit.cli.finetune import finetune_config
from bertkit.tasks.base import FEATURE_MODEL_OPTIONS, KINDS, TASK_OPTIONS, TaskFamily, family_for
from bertkit.tasks.run import FinetuneConfig, config_fields
from bertkit.tasks.text2text import TEXT_TO_TEXT_KINDS, Text2TextFamily

FIELDS = [name for name, *_ in config_fields() if name not in ("kind", "progress")]
SHARED = set(FIELDS) - {name for options in TASK_OPTIONS.values() for name in options}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def help_of(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def shown(text: str, name: str) -> bool:
    """Whether the help text offers the field's option (as itself, not as a prefix of a longer one)."""
    return re.search(rf"(?<![\w-]){re.escape(flag(name))}(?![\w-])", text) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_finetune_kind_help_lists_its_options_and_no_other_kinds(kind, capsys):
    text = help_of(capsys, ["finetune", kind])
    assert text.startswith(f"usage: bertkit finetune {kind} ")
    offered = SHARED | set(TASK_OPTIONS[kind])
    assert [n for n in FIELDS if n in offered and not shown(text, n)] == []
    assert [n for n in FIELDS if n not in offered and shown(text, n)] == []


def test_the_kinds_options_as_the_issue_names_them(capsys):
    """Hand-written expectations, independent of the table: squad's help lost the embedding and logistic options
    it used to list; each kind keeps the options of its files and model."""
    squad = help_of(capsys, ["finetune", "squad"])
    for name in ("negative_column", "min_score", "symmetric", "scale", "logistic_c", "text_column", "column",
                 "gather_negatives"):
        assert not shown(squad, name), name
    for name in ("doc_stride", "max_query_length", "max_answer_length", "n_best_size", "epochs", "frozen"):
        assert shown(squad, name), name
    expected = {"glue": ("task", "lm_weight", "logistic_c"), "classify": ("text_column", "regression", "lm_weight"),
                "ner": ("column", "scheme", "tags_column"), "swag": ("epochs", "learning_rate"),
                "embed": ("negative_column", "scale", "symmetric", "matryoshka_dims", "gather_negatives"),
                "rerank": ("text_column", "pair_column", "label_column")}
    for kind, names in expected.items():
        text = help_of(capsys, ["finetune", kind])
        assert all(shown(text, n) for n in names), (kind, [n for n in names if not shown(text, n)])
    assert not shown(help_of(capsys, ["finetune", "swag"]), "frozen")  # multiple choice is fine-tuned whole
    assert not shown(help_of(capsys, ["finetune", "ner"]), "logistic_c")  # a classifier's option


# FinetuneConfig's properties -> the field each reads.
PROPERTIES = {"seq_length": "max_seq_length", "layer_combine": "combine", "dims": "matryoshka_dims"}
# Read by ClassificationFamily.__init__ and overwritten by the subclass's own: GLUE's task says whether it is a
# regression, a reranker's relevance is always a number.
OVERWRITTEN = {"glue": {"regression"}, "rerank": {"regression"}}


def _is_config(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("config", "c")) or (
        isinstance(node, ast.Attribute) and node.attr == "config")


def _reads(function: ast.AST) -> set[str]:
    """The FinetuneConfig fields a function reads: `self.config.X`, `config.X`, `c.X` (c being self.config),
    `getattr(config, "X", ...)`, and the config's properties."""
    names = {**{name: name for name in FIELDS}, **PROPERTIES}
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and node.attr in names and _is_config(node.value):
            found.add(names[node.attr])
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and _is_config(node.args[0]) and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in names):
            found.add(names[node.args[1].value])
    return found


def _methods(cls: type) -> dict[str, ast.AST]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {node.name: node for node in tree.body[0].body if isinstance(node, ast.FunctionDef)}


def _calls_super(function: ast.AST, name: str) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Call)
               and isinstance(node.value.func, ast.Name) and node.value.func.id == "super"
               for node in ast.walk(function))


def family_reads(cls: type) -> set[str]:
    """The FinetuneConfig fields that a family's methods read, each method as Python resolves it (the first class
    of the MRO that defines it, then the bases it reaches through super())."""
    chain = [_methods(c) for c in cls.__mro__ if issubclass(c, TaskFamily) and c is not TaskFamily]
    found = set()
    for name in {n for methods in chain for n in methods}:
        for methods in chain:
            if name in methods:
                found |= _reads(methods[name])
                if not _calls_super(methods[name], name):
                    break
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_every_setting_a_kinds_family_reads_is_an_option_of_its_parser(kind):
    reads = family_reads(family_for(kind)) - OVERWRITTEN.get(kind, set())
    assert "max_seq_length" in reads or kind == "glue", f"{kind}: no length read found (the scan is broken)"
    offered = SHARED | set(TASK_OPTIONS[kind])
    assert sorted(reads - offered) == [], f"{kind}'s family reads settings its parser does not offer"


def test_the_text_to_text_familys_settings_are_offered():
    """T5's family serves glue, classify and squad, branching on the kind: each setting it reads is an option of
    one of them, and the target length of all three."""
    reads = family_reads(Text2TextFamily)
    assert "max_target_length" in reads
    assert all("max_target_length" in TASK_OPTIONS[kind] for kind in TEXT_TO_TEXT_KINDS)
    offered = SHARED.union(*(TASK_OPTIONS[kind] for kind in TEXT_TO_TEXT_KINDS))
    assert sorted(reads - offered) == []


# A valid value for each field whose default is None (the others are given at their default).
SAMPLES = {"task": "sst2", "max_seq_length": 64, "max_target_length": 16, "dropout": 0.2, "metric": "accuracy",
           "pair_column": "pair", "column": 3, "format": "tsv", "records": "data", "layers": "all",
           "combine": "sum", "words": "bert", "frozen": True, "feature_cache": "memory",
           "negative_column": "negative", "min_score": 1.0, "pooling": "mean", "normalize": True,
           "mini_batch_size": 4, "matryoshka_dims": "64,32", "window": 64, "stride": 32, "query_prompt": "query: ",
           "document_prompt": "passage: ", "workers": 0}


def _command_line(kind: str, names) -> tuple[list[str], dict]:
    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)}
    values = {name: SAMPLES.get(name, defaults[name]) for name in names}
    argv = []
    for name, value in values.items():
        if isinstance(value, bool):
            argv.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            argv += [flag(name), str(value)]
    return argv, values


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_command_line_of_a_kind_parses_into_its_config(kind):
    names = [n for n in FIELDS if n in SHARED or n in TASK_OPTIONS[kind]]
    argv, values = _command_line(kind, names)
    files = ["--model", "m", "--train", "t", "--dev", "d", "--out", "o", "--quiet"]
    args = build_parser().parse_args(["finetune", kind, *files, *argv])
    assert finetune_config(args) == FinetuneConfig(kind=kind, progress=False, **values)
    assert (args.model, args.train, args.dev, args.out) == ("m", "t", "d", "o")


@pytest.mark.parametrize("kind", ["glue", "classify", "ner"])
def test_distill_kinds_take_the_kinds_options_but_no_feature_model(kind):
    names = [n for n in FIELDS if (n in SHARED or n in TASK_OPTIONS[kind]) and n not in FEATURE_MODEL_OPTIONS]
    argv, values = _command_line(kind, names)
    files = ["--teacher", "t", "--out", "o", "--train", "a", "--dev", "b", "--quiet"]
    parser = build_parser()
    args = parser.parse_args(["distill", kind, *files, *argv])
    assert finetune_config(args) == FinetuneConfig(kind=kind, progress=False, **values)
    with pytest.raises(SystemExit):
        parser.parse_args(["distill", kind, *files, "--frozen"])


def test_another_kinds_option_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["finetune", "squad", "--model", "m", "--train", "t", "--dev", "d", "--out", "o",
              "--negative-column", "negative"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --negative-column negative" in capsys.readouterr().err


def test_the_top_level_help_imports_no_verb_module():
    """`bertkit --help` builds one line per verb: no verb's module, so neither torch nor the drivers."""
    code = ("import sys\nfrom bertkit.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('bertkit.cli.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
