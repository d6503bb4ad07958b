"""bertkit.cli: every verb answers --help; a user's mistake is one line on stderr and exit status 2, no traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from bertkit.cli import build_parser, main


def verb_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every verb and sub-verb the parser knows, e.g. ("tokenizer",), ("tokenizer", "train"), ("distill", "mlm")."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += verb_paths(sub, (*prefix, name))
    return found


VERBS = verb_paths(build_parser())


def test_the_verbs_are_found():
    top = {path[0] for path in VERBS}
    assert {"tokenizer", "tokenize", "fill-mask", "generate", "info", "prepare", "pretrain", "pipeline", "init",
            "plot", "finetune", "evaluate", "predict", "features", "distill"} <= top
    assert ("tokenizer", "train") in VERBS and ("distill", "mlm") in VERBS


@pytest.mark.parametrize("path", VERBS, ids=[" ".join(p) for p in VERBS])
def test_every_verb_has_help(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bertkit " + " ".join(path))


def one_line_error(capsys, argv: list[str]) -> str:
    """Run `bertkit argv`, expect exit status 2 with exactly one line on stderr; return that line."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("bertkit: error: "), err
    assert "Traceback" not in err
    return lines[0]


MISTAKES = {
    "info: no such directory": (["info", "{tmp}/nope"], "{tmp}/nope"),
    "tokenize: no such vocabulary": (["tokenize", "--model-or-vocab", "{tmp}/nope", "hello"], "{tmp}/nope"),
    "fill-mask: no such model": (["fill-mask", "--model", "{tmp}/nope", "a [MASK] b"], "{tmp}/nope"),
    "prepare: no such corpus": (["prepare", "--corpus", "{tmp}/missing.txt", "--tokenizer", "{vocab}",
                                 "--out", "{tmp}/data", "--quiet"], "{tmp}/missing.txt"),
    "prepare: no such tokenizer": (["prepare", "--corpus", "{corpus}", "--tokenizer", "{tmp}/nope",
                                    "--out", "{tmp}/data", "--quiet"], "{tmp}/nope"),
    "pretrain: not prepared": (["pretrain", "--data", "{tmp}/nope", "--out", "{tmp}/run"], "{tmp}/nope"),
    "pretrain: unknown setting": (["pretrain", "--data", "{tmp}/nope", "--out", "{tmp}/run", "--no-such-field", "3"],
                                  "--no_such_field"),
    "init: no such tokenizer": (["init", "--tokenizer", "{tmp}/nope", "--out", "{tmp}/m"], "{tmp}/nope"),
    "plot: no metrics": (["plot", "{tmp}/nope"], "{tmp}/nope"),
    "features: no such model": (["features", "--model", "{tmp}/nope", "--input", "{corpus}",
                                 "--out", "{tmp}/f.npz"], "{tmp}/nope"),
    "evaluate: no such data file": (["evaluate", "classify", "--data", "{tmp}/dev.tsv", "--predictions",
                                     "{corpus}"], "{tmp}/dev.tsv"),
    "finetune: no such model": (["finetune", "classify", "--model", "{tmp}/nope", "--train", "{corpus}",
                                 "--dev", "{corpus}", "--out", "{tmp}/run"], "{tmp}/nope"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_a_mistake_is_one_line_naming_what_is_wrong(name, tmp_path, tiny_vocab_dir, capsys, monkeypatch):
    monkeypatch.delenv("BERTKIT_DEBUG", raising=False)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one sentence here.\nanother one.\n\nsecond document.\nand more.\n", encoding="utf-8")
    argv, named = MISTAKES[name]
    fill = {"tmp": str(tmp_path), "vocab": str(tiny_vocab_dir), "corpus": str(corpus)}
    line = one_line_error(capsys, [a.format(**fill) for a in argv])
    assert named.format(**fill) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]  # nothing half-written


def test_a_bad_config_json_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BERTKIT_DEBUG", raising=False)
    (tmp_path / "config.json").write_text('{"hidden_size": 32,', encoding="utf-8")
    line = one_line_error(capsys, ["info", str(tmp_path)])
    assert str(tmp_path / "config.json") in line and "not valid JSON" in line


def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BERTKIT_DEBUG"}
    done = subprocess.run([sys.executable, "-m", "bertkit.cli", "info", str(tmp_path / "nope")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"bertkit: error: {tmp_path / 'nope'}: no config.json; not a model directory"]


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTKIT_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["info", str(tmp_path / "nope")])


def test_pretrain_help_lists_every_architectures_fields(capsys):
    """`bertkit pretrain --help` shows every field of every config class of the architecture table (XLNet's
    included), each under a section of its class, and each is an option the command takes."""
    import dataclasses

    from bertkit.models.registry import config_classes

    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    text = capsys.readouterr().out
    sections = text.split("\n  [")[1:]
    for cls in config_classes():
        name = cls.__name__
        shown = [s for s in sections if s.startswith("model") and all(
            f"--{f.name.replace('_', '-')} " in s for f in dataclasses.fields(cls))]
        assert shown, f"{name}: a field is missing from pretrain --help"
    parser = build_parser()
    args, extra = parser.parse_known_args(["pretrain", "--data", "d", "--out", "o", "--d-model", "64",
                                           "--mem-len", "8", "--filters", "x"])
    assert extra == [] and (args.field_d_model, args.field_mem_len, args.field_filters) == ("64", "8", "x")
