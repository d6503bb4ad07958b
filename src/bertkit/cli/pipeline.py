"""`bertkit pipeline` (the main job), `plot`, `analyze layers` and `card`: runs drawn, measured and compared."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertkit.pipeline import run_pipeline
from bertkit.pipeline.analyze import analyze_layers
from bertkit.pipeline.plots import plot_card, plot_run
from bertkit.tasks.card import merge_cards, merged_markdown, read_card, write_card


def cmd_plot(args: argparse.Namespace) -> None:
    for path in plot_run(args.run_dir, args.out):
        print(path)


def cmd_analyze_layers(args: argparse.Namespace) -> None:
    report = analyze_layers(args.model, args.input, args.out, names=args.name, max_seq_length=args.max_seq_length,
                            batch_size=args.batch_size, device=args.device)
    print(f"distance between each layer's input and output, mean over {sum(m['tokens'] for m in report['models']):,} "
          f"tokens of {report['texts']:,} texts")
    print(report["table"])
    for path in report.get("files", []):
        print(path)


def cmd_pipeline(args: argparse.Namespace) -> None:
    run_pipeline(args.out, corpus=args.corpus, minutes=args.minutes, preset=args.preset,
                 vocab_size=args.vocab_size, probes=args.probe, seed=args.seed, task_train=args.task_train,
                 task_dev=args.task_dev, text_column=args.text_column, pair_column=args.pair_column,
                 label_column=args.label_column, precision=args.precision)


def cmd_card(args: argparse.Namespace) -> None:
    cards = []
    for spec in args.run_dirs:
        name, _, path = spec.partition("=") if "=" in spec and not Path(spec).exists() else ("", "", spec)
        cards.append(read_card(path, name=name or None))
    table = merge_cards(cards, metrics=args.metric)
    if not table["columns"]:
        raise ValueError(f"--metric {args.metric}: no card has it")
    print(merged_markdown(table), end="")
    if args.out is not None:
        print(write_card(args.out, table))
        print(plot_card(table, Path(args.out) / "card.png"))


def add_pipeline(verbs, help_text: str) -> None:
    """Train a vocabulary, prepare shards, pretrain a small BERT, fine-tune it and the same model from random
    initialisation on a labelled task, measure fill-mask accuracy on held-out text, and write OUT/report.html, all
    within --minutes. Without --corpus, a corpus is assembled from the docstrings of the Python sources installed on
    this machine; without --task-train/--task-dev, the task is built in (is a documentation sentence as written, or
    words drawn at random by their frequency?)."""
    pipe = verbs.add_parser("pipeline", help=help_text, description=add_pipeline.__doc__)
    pipe.add_argument("--corpus", nargs="+", help="your corpus: files, directories or globs (text, JSON Lines, .gz)")
    pipe.add_argument("--out", default="runs/pipeline", help="output directory (default runs/pipeline)")
    pipe.add_argument("--minutes", type=float, default=10.0, help="total time budget (default 10)")
    pipe.add_argument("--preset", default=None, choices=["tiny", "mini", "small"],
                      help="model size (default: tiny, L2/H128, the most held-out accuracy per CPU minute; small on "
                           "a CUDA GPU)")
    pipe.add_argument("--vocab-size", type=int, default=8192, help="WordPiece vocabulary size (default 8192)")
    pipe.add_argument("--probe", action="append", help="a fill-mask sentence with [MASK] (repeatable)")
    pipe.add_argument("--seed", type=int, default=0, help="seed")
    pipe.add_argument("--task-train", help="your labelled training file for the fine-tuning stage (CSV, TSV or "
                                           "JSONL with named columns, as `bertkit finetune classify` reads)")
    pipe.add_argument("--task-dev", help="your labelled dev file (same format)")
    pipe.add_argument("--text-column", default="text", help="task files: column (key) of the text (default text)")
    pipe.add_argument("--pair-column", help="task files: column (key) of a second text, for sentence pairs")
    pipe.add_argument("--label-column", default="label", help="task files: column (key) of the label (default label)")
    pipe.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                      help="auto (default): bf16 autocast where the CPU has native bf16 instructions (AVX512-BF16 "
                           "or AMX), fp32 on other CPUs; bf16 on GPUs that support it")
    pipe.set_defaults(func=cmd_pipeline)


def add_plot(verbs, help_text: str) -> None:
    plot = verbs.add_parser("plot", help=help_text,
                            description="Write PNG curves (loss, accuracy, learning rate, throughput, eval) of a run.")
    plot.add_argument("run_dir", help="run directory with metrics.jsonl")
    plot.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    plot.set_defaults(func=cmd_plot)


def add_analyze(verbs, help_text: str) -> None:
    """For each model, the mean over the tokens of the input texts of the L2 distance and the cosine distance (1 -
    cos, and the angle) between each layer's input and output embeddings; several models are drawn side by side, as
    the ALBERT paper's BERT-against-ALBERT figure. Prints a table; with --out writes OUT/layers.json and
    OUT/layers.png."""
    analyze = verbs.add_parser("analyze", help=help_text)
    analyses = analyze.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    layers = analyses.add_parser(
        "layers", help="L2 and cosine distance between each layer's input and output (ALBERT's figure 1)",
        description=add_analyze.__doc__)
    layers.add_argument("--model", nargs="+", required=True, help="model directories (any encoder, with tokenizer)")
    layers.add_argument("--input", required=True, help="text file, one text per line (blank lines skipped)")
    layers.add_argument("--out", help="output directory for layers.json and layers.png (default: print only)")
    layers.add_argument("--name", nargs="+", help="legend names, one per --model (default: the run folder names)")
    layers.add_argument("--max-seq-length", type=int, default=128, help="tokens per text, special ones included "
                                                                        "(default 128)")
    layers.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    layers.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    layers.set_defaults(func=cmd_analyze_layers)


def add_card(verbs, help_text: str) -> None:
    """Read the cards of several sweeps (`bertkit finetune --seeds ...` directories, recomputed from their runs'
    results.json; a single run directory counts as a card of one run) and print one table: rows = models or variants
    (a sweep's --name, or NAME=DIR here), columns = task: metric, cells = median [q1, q3] (min-max, n). --out also
    writes card.json, card.md and card.png there."""
    card = verbs.add_parser("card", help=help_text, description=add_card.__doc__)
    card.add_argument("run_dirs", nargs="+", metavar="[NAME=]RUN_DIR", help="sweep or run directories")
    card.add_argument("--out", help="directory for card.json, card.md and card.png")
    card.add_argument("--metric", action="append",
                      help="metric key to show (repeat; e.g. mcc, out_of_domain_dev/mcc; default: each card's "
                           "selection metric, on dev and on its extra files)")
    card.set_defaults(func=cmd_card)


PARSERS = {"pipeline": add_pipeline, "plot": add_plot, "analyze": add_analyze, "card": add_card}
