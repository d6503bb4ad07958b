"""`bertkit <verb>`: the command-line face of the Python API. Parses arguments and calls library functions only.

Each verb (or group of verbs) is a module here holding its parser builder and its handler: tokenizer (tokenizer,
tokenize, prepare), inference (fill-mask, generate, info, similarity), pretrain (pretrain, init, extend-context),
pipeline (pipeline, plot, analyze, card), finetune (finetune, evaluate, predict), features, distill, mine, serve
(serve, export). Every verb's errors are reported as one line on stderr (`bertkit: error: ...`) with exit status 2
for bad input, never a traceback; `BERTKIT_DEBUG=1` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from bertkit import __version__
from bertkit.errors import missing_extra

# verb -> (the module of bertkit.cli that builds its parser and runs it, the verb's line in `bertkit --help`)
VERBS: dict[str, tuple[str, str]] = {
    "tokenizer": ("tokenizer", "train WordPiece, byte-level BPE or Unigram vocabularies"),
    "tokenize": ("tokenizer", "show the tokens and ids of a text"),
    "fill-mask": ("inference", "predict the [MASK] tokens of a text"),
    "generate": ("inference", "continue texts with a causal model, or answer them with T5"),
    "info": ("inference", "show a model directory's config and size"),
    "prepare": ("tokenizer", "tokenise a corpus into training shards"),
    "pretrain": ("pretrain", "pretrain a BERT on prepared shards"),
    "pipeline": ("pipeline", "everything: corpus -> vocabulary -> shards -> pretraining -> fine-tuning -> "
                             "evaluation -> report"),
    "init": ("pretrain", "write a randomly initialised model directory"),
    "extend-context": ("pretrain", "make a model directory take longer inputs"),
    "plot": ("pipeline", "draw a run's training curves as PNG"),
    "analyze": ("pipeline", "measure what trained models do inside"),
    "finetune": ("finetune", "fine-tune a model on GLUE, a CSV/TSV/JSONL table, NER, SQuAD or SWAG"),
    "card": ("pipeline", "merge result cards into one table and a dot-and-whisker PNG"),
    "evaluate": ("finetune", "score a predictions file against a labelled data file"),
    "predict": ("finetune", "predict with a fine-tuned model directory"),
    "features": ("features", "per-token vectors from chosen hidden layers (feature-based BERT)"),
    "similarity": ("inference", "one word's contextual vectors in several texts, compared layer by layer"),
    "distill": ("distill", "distil a teacher into a smaller student (MLM pretraining or a fine-tuned task)"),
    "mine": ("mine", "hard negatives for (query, positive) pairs from a corpus"),
    "serve": ("serve", "serve a model directory over HTTP, batching concurrent requests"),
    "export": ("serve", "export a model directory (ONNX)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `bertkit` parser: every verb's (the CLI reference, the tests), or with `only` the full parser of that
    verb and a one-line entry for each other, which is all that parsing one command line needs."""
    parser = argparse.ArgumentParser(prog="bertkit", description="BERT and its family end to end.")
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, (module, help_text) in VERBS.items():
        if only is not None and verb != only:
            verbs.add_parser(verb, help=help_text)
            continue
        # The one place where the CLI imports late: a verb's module imports its drivers (torch, the models) at its
        # top, so it is imported only when that verb is parsed; `bertkit --help` and each verb start without the
        # others' imports.
        importlib.import_module(f"bertkit.cli.{module}").PARSERS[verb](verbs, help_text)
    return parser


def _verb_of(argv: list[str]) -> str | None:
    """The verb of a command line: its first word that is not an option (`bertkit` itself takes only -h and
    --version, neither with a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_verb_of(given) or "")
    args, extra = parser.parse_known_args(given)
    takes_extra = getattr(args, "takes_extra", False)
    if extra and not takes_extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if takes_extra:
            args.func(args, extra)
        else:
            args.func(args)
    except KeyboardInterrupt:
        print("bertkit: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, TypeError, KeyError, ArithmeticError, ImportError) as err:  # a diverged loss too
        if os.environ.get("BERTKIT_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"bertkit: error: {missing_extra(err, _verb_words(args, given)) or message}", file=sys.stderr)
        return 2
    return 0


def _verb_words(args: argparse.Namespace, given: list[str]) -> str:
    """What the user ran, for messages: "finetune ner", "export onnx", "serve"."""
    words = [args.verb]
    following = given[given.index(args.verb) + 1:] if args.verb in given else []
    sub = [getattr(args, k, None) for k in ("tverb", "format", "distill_kind", "analysis", "kind")]
    if following and following[0] in sub:
        words.append(following[0])
    return " ".join(words)
