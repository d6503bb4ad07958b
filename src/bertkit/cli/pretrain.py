"""`bertkit pretrain`, `init` and `extend-context`: a model directory made, pretrained, or made to take longer
inputs; the recipe options that `distill mlm` shares."""

from __future__ import annotations

import argparse
import json

from bertkit.cli.options import print_train_result
from bertkit.models.registry import ARCHITECTURES, architecture, config_classes
from bertkit.training.pretrain import (DEFAULT_RECIPE, extend_context, field_help, init_like, init_model_dir,
                                       pretrain, recipe_names, resolve_config)


FIELD = "field_"  # the argparse dest prefix of a generated recipe option (`--max-steps` -> field_max_steps)


def parse_overrides(extra: list[str]) -> dict[str, str]:
    """`--key value` / `--key=value` pairs left over by argparse -> {key: value} (dashes become underscores)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(extra):
        item = extra[i]
        if not item.startswith("--") or len(item) < 3:
            raise ValueError(f"unexpected argument {item!r}; settings are given as --field value")
        key, eq, value = item[2:].partition("=")
        if not eq:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise ValueError(f"--{key} needs a value")
            value = extra[i + 1]
            i += 1
        out[key.replace("-", "_")] = value
        i += 1
    return out


def recipe_overrides(args: argparse.Namespace, extra: list[str]) -> dict:
    """The recipe settings of a command line: the generated --field options and --section.field pairs."""
    overrides = parse_overrides(extra)
    overrides.update({key[len(FIELD):]: value for key, value in vars(args).items()
                      if key.startswith(FIELD) and value is not None})
    return overrides


def cmd_pretrain(args: argparse.Namespace, extra: list[str]) -> None:
    overrides = recipe_overrides(args, extra)
    if args.preset is not None:
        overrides["preset"] = args.preset
    config = resolve_config(args.config, overrides)
    print_train_result(pretrain(args.data, args.out, config, resume=args.resume, init_from=args.init_from,
                                verify_data=args.verify), args.out)


def cmd_init(args: argparse.Namespace) -> None:
    if args.like is not None:
        path = init_like(args.out, args.like, seed=args.seed)
        print(f"wrote a randomly initialised copy of {args.like}'s architecture (and tokenizer) to {path}")
        return
    if args.tokenizer is None:
        raise ValueError("bertkit init needs --tokenizer (or --like MODEL_DIR to copy an architecture)")
    path = init_model_dir(args.out, args.tokenizer, preset=args.preset, seed=args.seed, model_type=args.model_type)
    name = architecture(args.model_type).label
    print(f"wrote a randomly initialised {args.preset} {name} to {path}")


def cmd_extend_context(args: argparse.Namespace) -> None:
    print(json.dumps(extend_context(args.model, args.max_position_embeddings, args.out, method=args.method,
                                    global_rope_theta=args.global_rope_theta)))


def add_pretrain_options(parser: argparse.ArgumentParser) -> None:
    """One --option per recipe field (data, train and every architecture's model fields: `field_help`, the single
    source of truth), a string that `resolve_config` converts to the field's type; default None = the recipe's.
    The epilog lists them by section with the values that run."""
    names = dict.fromkeys(name for rows in field_help().values() for name, _, _ in rows)
    for name in names:  # a field several architectures share is one option: the chosen architecture reads it
        parser.add_argument(f"--{name.replace('_', '-')}", dest=FIELD + name, metavar="V", help=argparse.SUPPRESS)


def _preset_help() -> str:
    return "model size, a preset of the recipe's architecture: " + "; ".join(
        f"{cls.model_types()[0]}: {', '.join(cls.PRESETS)}" for cls in config_classes())


def pretrain_epilog() -> str:
    lines = [f"built-in recipes: {', '.join(recipe_names())}", "",
             "every field below can be set as --field value (or --section.field value):"]
    for section, rows in field_help().items():
        lines.append(f"  [{section}]")
        for name, default, text in rows:
            flag = name.replace("_", "-")
            lines.append(f"    --{flag:<30} {text} (default {default})")
    return "\n".join(lines)


def add_pretrain(verbs, help_text: str) -> None:
    pre = verbs.add_parser("pretrain", help=help_text, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=pretrain_epilog(),
                           description="Pretrain with MLM+NSP (or the ALBERT / RoBERTa objectives). Launch with "
                                       "torchrun for several processes or machines.")
    pre.add_argument("--data", required=True, help="directory written by `bertkit prepare`")
    pre.add_argument("--out", required=True, help="run directory (metrics, checkpoints, model)")
    pre.add_argument("--config", help=f"recipe: a YAML file or a built-in name (default: {DEFAULT_RECIPE}, "
                                      f"whose data and train values the list below shows)")
    pre.add_argument("--preset", help=_preset_help())
    add_pretrain_options(pre)
    pre.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    pre.add_argument("--init-from", help="start from this model directory's weights (e.g. phase 2 at length 512)")
    pre.add_argument("--verify", action="store_true",
                     help="check every shard file's SHA-256 before training (by default the index files are "
                          "checked at open and each shard's token files just before its first use)")
    pre.set_defaults(func=cmd_pretrain, takes_extra=True)


def add_init(verbs, help_text: str) -> None:
    """Write a model with its architecture's initialisation, as it pretrains (BERT: a BertForPreTraining;
    ModernBERT: its masked LM; T5: the encoder-decoder; ...), and the given tokenizer (a from-scratch baseline, a
    start for pretraining, a student)."""
    init = verbs.add_parser("init", help=help_text, description=add_init.__doc__)
    init.add_argument("--tokenizer",
                      help="tokenizer or model directory (any kind: vocab.txt, vocab.json + merges.txt, "
                           "tokenizer.json), or a vocab file")
    init.add_argument("--like", metavar="MODEL_DIR",
                      help="copy this model directory's architecture (config.json) and tokenizer, with fresh "
                           "random weights (--seed); --tokenizer, --preset and --model-type are then not used")
    init.add_argument("--model-type", choices=list(ARCHITECTURES), default="bert",
                      help="architecture, a row of the architecture table (default bert; elmo: a word tokenizer)")
    init.add_argument("--preset", default="mini",
                      choices=list(dict.fromkeys(p for row in ARCHITECTURES.values() for p in row.presets)),
                      help="model size (default mini; each architecture's own presets)")
    init.add_argument("--seed", type=int, default=0, help="initialisation seed")
    init.add_argument("--out", required=True, help="model directory to write")
    init.set_defaults(func=cmd_init)


def add_extend_context(verbs, help_text: str) -> None:
    """Write MODEL as a directory that takes inputs of N tokens, for continued pretraining at that length (bertkit
    pretrain --init-from OUT --max-seq-length N). BERT family: the learned position table grows to N rows, by
    copying the learned rows one after another (the first rows stay as they are; Longformer's way) or by linear
    interpolation (the learned table stretched over N positions); every other tensor, head and tokenizer file is
    kept. ModernBERT (rotary positions): config.json only, and --global-rope-theta."""
    ext = verbs.add_parser("extend-context", help=help_text, description=add_extend_context.__doc__)
    ext.add_argument("--model", required=True, help="model directory to extend")
    ext.add_argument("--max-position-embeddings", type=int, required=True, metavar="N",
                     help="the longest input the new directory takes, in tokens")
    ext.add_argument("--method", choices=["copy", "interpolate"], default="copy",
                     help="how the position table grows: copy (default) or interpolate")
    ext.add_argument("--global-rope-theta", type=float,
                     help="ModernBERT: the global layers' rotary base in the new directory (the paper: 160000 for "
                          "8192 tokens)")
    ext.add_argument("--out", required=True, help="new model directory (must not exist or be empty)")
    ext.set_defaults(func=cmd_extend_context)


PARSERS = {"pretrain": add_pretrain, "init": add_init, "extend-context": add_extend_context}
