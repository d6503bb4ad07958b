"""A verb whose optional dependency is missing says, in one line, which extra installs it (bertkit.errors.EXTRAS):
every module of the table is a package of that extra in pyproject.toml, and each extra is reached through a real
verb with its module made unimportable."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.errors import EXTRAS, missing_extra

# The distribution that provides each importable module (where the two names differ).
DISTRIBUTION = {"sklearn": "scikit-learn"}


def test_every_module_belongs_to_its_extra_in_pyproject():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for module, extra in EXTRAS.items():
        packages = [p.split(">")[0].split("=")[0].split("<")[0].strip() for p in extras[extra]]
        assert DISTRIBUTION.get(module, module) in packages, (module, extra)
    # and every package of the user-facing extras is in the table
    for extra in ("tasks", "plots", "serve"):
        for package in extras[extra]:
            name = package.split(">")[0].strip()
            assert name in {DISTRIBUTION.get(m, m) for m, e in EXTRAS.items() if e == extra}, (extra, name)


def test_other_import_errors_are_left_alone():
    assert missing_extra(ModuleNotFoundError("No module named 'foo'", name="foo"), "info") is None
    assert missing_extra(ImportError("cannot import name 'x' from 'seqeval'", name="seqeval"), "info") is None
    assert missing_extra(ModuleNotFoundError("No module named 'scipy.stats'", name="scipy.stats"),
                         "evaluate classify") == ("bertkit evaluate classify needs scipy, which is not installed: "
                                                  "pip install 'bertkit[tasks]'")


def block(monkeypatch, module: str) -> None:
    """Make `module` (and its submodules) unimportable, as if not installed."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # an import then raises ModuleNotFoundError(name=module)


def test_finetune_family_metric_names_the_tasks_extra(monkeypatch, tmp_path, capsys):
    data = tmp_path / "dev.conll"
    data.write_text("EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n\n")
    predictions = tmp_path / "predictions.conll"
    predictions.write_text("EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n\n")
    assert main(["evaluate", "ner", "--data", str(data), "--predictions", str(predictions)]) == 0  # installed here
    capsys.readouterr()
    block(monkeypatch, "seqeval")
    assert main(["evaluate", "ner", "--data", str(data), "--predictions", str(predictions)]) == 2
    assert capsys.readouterr().err == ("bertkit: error: bertkit evaluate ner needs seqeval, which is not installed: "
                                       "pip install 'bertkit[tasks]'\n")


def test_plot_names_the_plots_extra(monkeypatch, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    block(monkeypatch, "matplotlib")
    assert main(["plot", str(run)]) == 2
    assert capsys.readouterr().err == ("bertkit: error: bertkit plot needs matplotlib, which is not installed: "
                                       "pip install 'bertkit[plots]'\n")


@pytest.mark.parametrize("module, argv", [
    ("uvicorn", ["serve", "--model", "MODEL"]),
    ("onnx", ["export", "onnx", "--model", "MODEL", "--out", "OUT"]),
])
def test_serve_and_export_name_the_serve_extra(module, argv, monkeypatch, tmp_path, tiny_tokenizer, capsys):
    from bertkit import BertForMaskedLM
    from conftest import tiny_config

    model = tmp_path / "model"
    BertForMaskedLM(tiny_config(vocab_size=tiny_tokenizer.vocab_size)).save_pretrained(model, tokenizer=tiny_tokenizer)
    argv = [{"MODEL": str(model), "OUT": str(tmp_path / "model.onnx")}.get(a, a) for a in argv]
    block(monkeypatch, module)
    assert main(argv) == 2
    verb = " ".join(argv[:2] if argv[0] == "export" else argv[:1])
    assert capsys.readouterr().err == (f"bertkit: error: bertkit {verb} needs {module}, which is not installed: "
                                       f"pip install 'bertkit[serve]'\n")
