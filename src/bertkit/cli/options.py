"""What several verbs' parsers and handlers share: config dataclass fields as options, a run's summary line, the
input-table and ELMo word options. Nothing here imports torch."""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from pathlib import Path


def add_config_options(group, fields, skip: tuple[str, ...] = (), aliases: dict[str, list[str]] | None = None,
                       metavars: dict[str, str] | None = None) -> None:
    """One --option per field of a config dataclass (its `config_fields()` rows: name, type, default, help; the
    single source of truth), default None = the config's default; a bool field is --x / --no-x."""
    for name, hint, default, text in fields:
        if name in skip:
            continue
        flags = [f"--{name.replace('_', '-')}", *(aliases or {}).get(name, [])]
        shown = "" if default is None else f" (default {default})"
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) else hint
        if base is bool:
            group.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None,
                               help=text + shown)
        else:
            metavar = (metavars or {}).get(name) or {int: "N", float: "X", str: "NAME"}.get(base, "V")
            group.add_argument(*flags, dest=name, type=base, default=None, metavar=metavar, help=text + shown)


def given_fields(args: argparse.Namespace, fields, skip: tuple[str, ...] = ()) -> dict:
    """The fields of a config (`config_fields()` rows) that the command line set."""
    return {name: getattr(args, name) for name, *_ in fields
            if name not in skip and getattr(args, name, None) is not None}


def print_summary(summary: dict, out: str) -> None:
    """A run's summary as one JSON line with its model directory (rank 0 only under torchrun)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({**summary, "model": str(Path(out) / "model")}, default=float))


def print_train_result(result, out: str) -> None:
    """A pretraining (or MLM distillation) run's summary line: steps, tokens, time, why it stopped, eval metrics."""
    print_summary({"step": result.step, "tokens": result.tokens, "elapsed_s": round(result.elapsed, 1),
                   "stopped_by": result.stopped_by, **result.eval_metrics}, out)


def add_words_option(parser) -> None:
    """--words: how an ELMo's text splits into words (the tokenizer's own way when not given)."""
    parser.add_argument("--words", choices=["whitespace", "bert"],
                        help="ELMo: split text into words on whitespace (a released options.json + weights.hdf5 "
                             "directory's default, as bilm-tf and AllenNLP read it) or with BERT's pre-tokenizer "
                             "(bertkit's own ELMo directories' default)")


def add_input_table_options(parser: argparse.ArgumentParser, pair: bool = False) -> None:
    """--format, --records and the text columns of an --input that is a table (`predict`, `features`)."""
    group = parser.add_argument_group("an --input table")
    group.add_argument("--format", help="tsv, csv, jsonl, json, parquet, arrow or datasets (default: from the path)")
    group.add_argument("--records", help="JSON: the key whose list holds the records")
    group.add_argument("--text-column", help="the column of the text (default text)")
    if pair:
        group.add_argument("--pair-column", help="classify: the column of the second text (default pair)")
