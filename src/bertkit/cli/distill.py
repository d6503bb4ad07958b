"""`bertkit distill {mlm, glue, classify, ner, init-student}`: a teacher into a smaller student."""

from __future__ import annotations

import argparse

from bertkit.cli.finetune import add_kind_options, finetune_config
from bertkit.cli.options import add_config_options, given_fields, print_summary, print_train_result
from bertkit.cli.pretrain import add_pretrain_options, pretrain_epilog, recipe_overrides
from bertkit.config import PRESETS
from bertkit.tasks.base import FEATURE_MODEL_OPTIONS
from bertkit.training.distill import DistillConfig, distill_mlm, distill_task, init_student
from bertkit.training.distill import config_fields as distill_fields
from bertkit.training.pretrain import DEFAULT_RECIPE, resolve_config


def _distill_config(args: argparse.Namespace):
    return DistillConfig(**given_fields(args, distill_fields()))


def cmd_distill_mlm(args: argparse.Namespace, extra: list[str]) -> None:
    distill = _distill_config(args)  # before the recipe: a bad loss weight is reported first
    config = resolve_config(args.config, recipe_overrides(args, extra))
    print_train_result(distill_mlm(args.teacher, args.data, args.out, config, distill, student_dir=args.student,
                                   resume=args.resume), args.out)


def cmd_distill_task(args: argparse.Namespace) -> None:
    config = finetune_config(args)
    results = distill_task(args.kind, args.teacher, args.train, args.dev, args.out, config, _distill_config(args),
                           student_dir=args.student, transfer_path=args.transfer, resume=args.resume)
    print_summary({k: results.get(k) for k in ("kind", "task", "metric", "best", "teacher", "student",
                                               "train_examples", "transfer_examples", "steps")}, args.out)


def cmd_distill_init_student(args: argparse.Namespace) -> None:
    path = init_student(args.source, args.out, layers=args.layers, preset=args.preset, seed=args.seed)
    print(f"wrote a student cut from {args.source} to {path}")


def _add_distill_options(parser: argparse.ArgumentParser) -> None:
    """One --option per DistillConfig field."""
    add_config_options(parser.add_argument_group("distillation settings (DistillConfig)"), distill_fields(),
                       metavars={"student_layers_from_teacher": "LIST"})


def add_distill(verbs, help_text: str) -> None:
    """`bertkit distill {mlm, glue, classify, ner, init-student}`."""
    distill = verbs.add_parser(
        "distill", help=help_text,
        description="Knowledge distillation: the student learns the teacher's softened predictions (cross-entropy "
                    "at temperature T, times T^2), optionally its logits (MSE) and hidden states (MSE, through a "
                    "learned projection when the widths differ), plus the gold labels; each loss has a weight. "
                    "Writes OUT/model (the student, a model directory transformers loads) and OUT/results.json.")
    kinds = distill.add_subparsers(dest="distill_kind", metavar="KIND", required=True)

    def student_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--teacher", required=True, help="the teacher's model directory (bertkit's or transformers')")
        p.add_argument("--out", required=True, help="run directory (model, results.json, metrics, checkpoints)")
        p.add_argument("--student", help="the student's starting model directory (same vocabulary as the "
                                         "teacher); or use --student-preset / --student-layers-from-teacher")
        p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")

    mlm = kinds.add_parser("mlm", help="MLM distillation on prepared pretraining shards",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=pretrain_epilog(),
                           description="Distil an MLM teacher into a student on `bertkit prepare` shards: both see "
                                       "the same masked batches; the teacher's MLM logits at the masked positions "
                                       "are the soft targets, the masked tokens the hard ones. The recipe fields "
                                       "set the data and the optimiser (model fields: the student's config when "
                                       "it is built from the teacher's).")
    student_options(mlm)
    mlm.add_argument("--data", required=True, help="directory written by `bertkit prepare` (teacher's tokenizer)")
    mlm.add_argument("--config", help=f"recipe: a YAML file or a built-in name (data and train sections; default: "
                                      f"{DEFAULT_RECIPE})")
    add_pretrain_options(mlm)
    _add_distill_options(mlm)
    mlm.set_defaults(func=cmd_distill_mlm, takes_extra=True)

    for kind, what in (("glue", "a GLUE task (--task)"), ("classify", "your CSV / TSV / JSONL classification or "
                                                                       "regression files"),
                       ("ner", "CoNLL named-entity files")):
        task = kinds.add_parser(kind, help=f"distil a teacher fine-tuned on {what}",
                                description=f"Distil a teacher fine-tuned on {what} into a student with the same "
                                            f"head: hard and soft losses on the training file, soft losses only on "
                                            f"the --transfer examples; dev evaluated every epoch with the task's "
                                            f"metric, the best epoch kept as OUT/model. Fine-tuning settings as for "
                                            f"`bertkit finetune {kind}`.")
        student_options(task)
        task.add_argument("--train", required=True, help="labelled training file")
        task.add_argument("--dev", required=True, help="development file, evaluated every epoch")
        task.add_argument("--transfer", help="unlabelled transfer set: a .txt file (one text per line; "
                                             "text<TAB>pair for pair tasks; NER: sentences), or a file in the "
                                             "task's format whose labels are ignored")
        task.add_argument("--quiet", action="store_true", help="no progress bar")
        _add_distill_options(task)
        add_kind_options(task, kind, skip=FEATURE_MODEL_OPTIONS)  # the student trains whole
        task.set_defaults(func=cmd_distill_task, kind=kind)

    init = kinds.add_parser("init-student", help="write a student cut from a model directory",
                            description="Write a smaller model directory cut from SOURCE: its config at --preset "
                                        "size and/or with the --layers copied from it (DistilBERT's "
                                        "initialisation), with its tokenizer. Give it as --student to several runs "
                                        "(a baseline without the teacher, a distilled one) to start them alike.")
    init.add_argument("--from", dest="source", required=True, help="model directory to cut the student from")
    init.add_argument("--layers", help="its layers to keep, 0-based, e.g. 0,2,4")
    init.add_argument("--preset", choices=list(PRESETS),
                      help="size preset of the student (the layers must then fit its widths)")
    init.add_argument("--seed", type=int, default=0, help="seed of whatever starts fresh (default 0)")
    init.add_argument("--out", required=True, help="model directory to write")
    init.set_defaults(func=cmd_distill_init_student)


PARSERS = {"distill": add_distill}
