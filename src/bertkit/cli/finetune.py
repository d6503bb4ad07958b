"""`bertkit finetune KIND` (one parser per task kind, with the settings that kind reads), `evaluate` and
`predict`; the fine-tuning settings that `distill KIND` shares."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from bertkit.cli.options import (add_config_options, add_input_table_options, add_words_option, given_fields,
                                 print_summary)
from bertkit.data.readers import is_table_input
from bertkit.pipeline.plots import plot_card, plot_confusion
from bertkit.tasks.base import KINDS, TASK_OPTIONS, family_for, prediction_kind
from bertkit.tasks.card import card_markdown, find_runs, merge_cards, parse_grid, parse_seeds, read_results
from bertkit.tasks.finetune import evaluate_predictions, finetune, finetune_sweep, predict
from bertkit.tasks.run import FinetuneConfig, config_fields


def finetune_config(args: argparse.Namespace):
    """The FinetuneConfig that a `finetune` or `distill` task verb's options describe (unset ones keep defaults)."""
    settings = given_fields(args, config_fields(), skip=("kind",))
    if args.quiet:
        settings["progress"] = False
    return dataclasses.replace(FinetuneConfig(), kind=args.kind, **settings)


def cmd_finetune(args: argparse.Namespace) -> None:
    config = finetune_config(args)
    if args.seeds is not None or args.lr_grid is not None:
        return _finetune_sweep(args, config)
    results = finetune(args.kind, args.model, args.train, args.dev, args.out, config, resume=args.resume,
                       new_heads=args.new_head, eval_files=args.eval_file or ())
    _draw_confusion(results, Path(args.out))
    print_summary({k: results.get(k) for k in ("kind", "task", "metric", "best", "train_examples_per_s", "steps")},
                  args.out)


def _draw_confusion(results: dict, out: Path, title: str = "") -> None:
    """OUT/confusion_matrix.png when the results hold confusion matrices and matplotlib is there."""
    if results.get("confusion_matrix") and int(os.environ.get("RANK", "0")) == 0:
        try:
            plot_confusion(results["confusion_matrix"], out / "confusion_matrix.png", title)
        except ImportError as err:
            print(f"bertkit: {err}; confusion_matrix.png not drawn", file=sys.stderr)


def _finetune_sweep(args: argparse.Namespace, config) -> None:
    """`finetune --seeds/--lr-grid`: one run per seed (and learning rate), the card, its figures."""
    if args.resume:
        raise ValueError("--resume: a sweep continues by itself (run the same command again); drop --resume")
    seeds = parse_seeds(args.seeds if args.seeds is not None else str(config.seed))
    rates = parse_grid(args.lr_grid) if args.lr_grid is not None else None
    if rates is not None and args.learning_rate is not None:
        raise ValueError("give either --lr/--learning-rate (one setting) or --lr-grid (a grid), not both")
    card = finetune_sweep(args.kind, args.model, args.train, args.dev, args.out, config, seeds=seeds,
                          learning_rates=rates, new_heads=args.new_head, eval_files=args.eval_file or (),
                          name=args.name)
    out = Path(args.out)
    for run in find_runs(out):
        _draw_confusion(read_results(run), run)
    _draw_confusion(card, out, f"{card['name']}: {card['task']}")
    try:
        plot_card(merge_cards([card], metrics=list(card["stats"])), out / "card.png")
    except ImportError as err:
        print(f"bertkit: {err}; card.png not drawn", file=sys.stderr)
    print(card_markdown(card), end="")


def cmd_evaluate(args: argparse.Namespace) -> None:
    metrics = evaluate_predictions(args.kind, args.data, args.predictions, args.null_odds, task=args.task,
                                   text_column=args.text_column, pair_column=args.pair_column,
                                   label_column=args.label_column, regression=args.regression,
                                   column=args.column, scheme=args.scheme, **_table_args(args))
    print(json.dumps(metrics, indent=None if args.compact else 2))


# The flag of `bertkit predict` that gives each input field (`TaskFamily.input_fields`).
_FIELD_FLAGS = {"text": "text", "pair": "pair", "question": "question", "context": "context", "choices": "choice"}


def _predict_inputs(args: argparse.Namespace) -> list:
    """The inputs of `bertkit predict`: from the flags, or from --input (JSON Lines or tab-separated lines), read
    as the kind's family reads a JSON input (`TaskFamily.input_fields`, `input_from_json`)."""
    kind, family = args.kind, family_for(args.kind)
    required, optional = family.input_fields
    keys = (*required, *optional)
    if args.input is None:
        record = {k: getattr(args, _FIELD_FLAGS[k]) for k in keys if getattr(args, _FIELD_FLAGS[k])}
        if any(k not in record for k in required):
            what = " and ".join(f"--{_FIELD_FLAGS[k]}" + (" (repeated)" if k == "choices" else "")
                                + (f" ({family.input_notes[k]})" if k in family.input_notes else "") for k in required)
            raise ValueError(f"{kind} prediction needs {what} (or --input)")
        return [family.input_from_json(record)]
    path = Path(args.input)
    if is_table_input(path, args.format):  # Parquet, Arrow, a datasets directory, JSON records, CSV
        columns = {"text": args.text_column, "pair": args.pair_column}
        return family.inputs_from_table(path, args.format, args.records,
                                        {k: v for k, v in columns.items() if v is not None})
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if line.strip()]
    inputs = []
    for number, line in lines:
        if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: invalid JSON: {err.msg}") from None
            if not isinstance(record, dict) or any(k not in record for k in required):
                raise ValueError(f"{path}:{number}: expected a JSON object with keys {list(keys)}")
        else:  # the fields in order; a list field (swag's choices) takes the rest of the line
            fields = line.split("\t")
            record = {k: (fields[i:] if k == "choices" else fields[i]) for i, k in enumerate(keys) if i < len(fields)}
            if any(not record.get(k) for k in required):
                raise ValueError(f"{path}:{number}: expected {' and '.join(required)} separated by a tab")
        try:
            inputs.append(family.input_from_json(record))
        except ValueError as err:
            raise ValueError(f"{path}:{number}: {err}") from None
    return inputs


def cmd_predict(args: argparse.Namespace) -> None:
    inputs = _predict_inputs(args)
    results = predict(args.model, args.kind, inputs, batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                      top_k=args.top_k, words=args.words)
    show = None if args.json else family_for(prediction_kind(args.kind)).show  # the kind's family prints its answer
    for result in results:
        print(json.dumps(result, ensure_ascii=False, default=float) if show is None else show(result))


_TABLE_OPTIONS = ("format", "records", "tokens_column", "tags_column")  # FinetuneConfig's fields on reading files


def _add_table_options(parser: argparse.ArgumentParser) -> None:
    """How a verb's data file is read (bertkit.data.readers): FinetuneConfig's format, records and NER columns."""
    add_config_options(parser.add_argument_group("reading the data file"),
                       [row for row in config_fields() if row[0] in _TABLE_OPTIONS])


def _table_args(args: argparse.Namespace) -> dict:
    """The table options the command line set (`_add_table_options`)."""
    return {name: getattr(args, name) for name in _TABLE_OPTIONS if getattr(args, name, None) is not None}


def add_kind_options(parser: argparse.ArgumentParser, kind: str, skip: tuple[str, ...] = ()) -> None:
    """One --option per FinetuneConfig field that a run of `kind` reads: the ones every run reads and the kind's
    own (`bertkit.tasks.base.TASK_OPTIONS`)."""
    others = {name for options in TASK_OPTIONS.values() for name in options} - set(TASK_OPTIONS[kind])
    add_config_options(parser.add_argument_group("fine-tuning settings (FinetuneConfig)"), config_fields(),
                       skip=("kind", "progress", *others, *skip), aliases={"learning_rate": ["--lr"]})


# What each kind fine-tunes on, as `finetune --help` lists the kinds.
_KIND_HELP = {
    "glue": "a GLUE task (--task)",
    "classify": "your CSV / TSV / JSONL / Parquet classification or regression tables",
    "ner": "CoNLL named-entity (or other tagging) files",
    "squad": "SQuAD v1.1 / v2.0 extractive question answering",
    "swag": "SWAG multiple choice",
    "embed": "(query, positive[, negatives]) pairs: a contrastive embedding model",
    "rerank": "(query, document, relevance) tables: a cross-encoder reranker",
}


def add_finetune(verbs, help_text: str) -> None:
    """Fine-tune a pretrained model directory on a task: a fresh head, AdamW with warm-up and linear decay, dev
    evaluation every epoch with the official metric; the best epoch is kept as OUT/model, every metric is in
    OUT/results.json. `bertkit finetune KIND --help` lists the settings of a kind."""
    fine = verbs.add_parser("finetune", help=help_text, description=add_finetune.__doc__)
    kinds = fine.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind in KINDS:
        what = _KIND_HELP.get(kind, kind)
        _add_finetune_kind(kinds.add_parser(kind, help=what, description=f"Fine-tune on {what}: a fresh head, "
                                            f"dev evaluation every epoch with the official metric; the best epoch is "
                                            f"kept as OUT/model, every metric is in OUT/results.json."), kind)


def _add_finetune_kind(task: argparse.ArgumentParser, kind: str) -> None:
    """The options of `bertkit finetune KIND`: files, run directory, sweep, and the kind's settings."""
    task.add_argument("--model", required=True,
                      help="pretrained model directory (with its tokenizer files, any kind)")
    task.add_argument("--train", required=True, help="training file")
    task.add_argument("--dev", required=True, help="development file, evaluated every epoch")
    task.add_argument("--out", required=True, help="run directory (model, results.json, predictions, checkpoints)")
    task.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    task.add_argument("--new-head", action="store_true",
                      help="replace a task head the model directory already has (another task's labels)")
    task.add_argument("--quiet", action="store_true", help="no progress bar")
    task.add_argument("--eval-file", action="append", metavar="FILE",
                      help="another labelled file in the dev file's format (a test set, CoLA's out-of-domain "
                           "sentences), scored at the end with the best epoch's model (repeat for several)")
    sweep = task.add_argument_group("several runs and a result card (OUT/seedS/, OUT/card.json, card.md, card.png)")
    sweep.add_argument("--seeds", metavar="LIST",
                       help="one run per seed, e.g. 1,2,3,4,5 or 1-5, each in OUT/seedS; then the card: median, "
                            "mean, min-max and IQR of every metric")
    sweep.add_argument("--lr-grid", nargs="?", const="paper", metavar="LRS",
                       help="every seed at each of these learning rates (OUT/lrX/seedS); alone: the paper's "
                            "2e-5,3e-5,5e-5; the card reports the one with the best median dev metric")
    sweep.add_argument("--name", help="the card's row name in `bertkit card` tables (default: the model's)")
    add_kind_options(task, kind)
    task.set_defaults(func=cmd_finetune)


def add_evaluate(verbs, help_text: str) -> None:
    """Print the metrics (JSON) of a predictions file: SQuAD predictions.json (and null_odds.json) with the official
    scripts' keys; GLUE / classify: one label per line or a GLUE submission TSV; NER: CoNLL with the predicted tag
    last; SWAG: one ending index per line."""
    ev = verbs.add_parser("evaluate", help=help_text, description=add_evaluate.__doc__)
    ev.add_argument("kind", choices=KINDS, help="task family")
    ev.add_argument("--data", required=True, help="labelled data file (dev set)")
    ev.add_argument("--predictions", required=True, help="predictions file")
    ev.add_argument("--null-odds", help="SQuAD 2.0: null_odds.json (the official --na-prob-file)")
    ev.add_argument("--task", help="GLUE task name (glue only)")
    ev.add_argument("--text-column", default="text", help="classify: text column (default text)")
    ev.add_argument("--pair-column", help="classify: second-text column")
    ev.add_argument("--label-column", default="label", help="classify: label column (default label)")
    ev.add_argument("--regression", action="store_true", help="classify: numeric labels")
    ev.add_argument("--column", type=int, help="ner: the data file's tag column (default the last)")
    ev.add_argument("--scheme", default="auto", choices=("auto", "none"),
                    help="ner: auto (entity tags: entity F1) or none (plain tags such as POS: token accuracy)")
    _add_table_options(ev)
    ev.add_argument("--compact", action="store_true", help="JSON on one line")
    ev.set_defaults(func=cmd_evaluate)


def add_predict(verbs, help_text: str) -> None:
    """Labels with probabilities (classify), entity spans (ner), answers (squad) or the best ending (swag). --input:
    one input per line (fields separated by a tab: text, pair / question, context / context, choice, choice, ...) or
    JSON Lines with those keys (text, pair / question, context / context, choices)."""
    pr = verbs.add_parser("predict", help=help_text, description=add_predict.__doc__)
    pr.add_argument("kind", choices=[k for k in KINDS if family_for(k).predicts_as is None], help="task family")
    pr.add_argument("--model", required=True, help="fine-tuned model directory")
    pr.add_argument("--text", help="text to classify or tag")
    pr.add_argument("--pair", help="second text of a pair (classify)")
    pr.add_argument("--question", help="question (squad)")
    pr.add_argument("--context", help="passage (squad) or context sentence (swag)")
    pr.add_argument("--choice", action="append", help="a candidate ending (swag; repeat for each)")
    pr.add_argument("--input", help="file of inputs (.txt/.tsv lines or .jsonl), or a table (.parquet, .arrow, "
                                    ".json records, .csv, a datasets directory) with columns named as the fields")
    add_input_table_options(pr, pair=True)
    pr.add_argument("--top-k", type=int, help="labels (classify) or n-best answers (squad) to show")
    pr.add_argument("--batch-size", type=int, default=32, help="inputs per forward pass (default 32)")
    pr.add_argument("--max-seq-length", type=int, help="tokens per input (default: as fine-tuned)")
    pr.add_argument("--json", action="store_true", help="one JSON object per input")
    add_words_option(pr)
    pr.set_defaults(func=cmd_predict)


PARSERS = {"finetune": add_finetune, "evaluate": add_evaluate, "predict": add_predict}
