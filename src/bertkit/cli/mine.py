"""`bertkit mine`: hard negatives for (query, positive) pairs, for `finetune embed` and `finetune rerank`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertkit.cli.options import add_config_options, given_fields
from bertkit.io import lock_directory
from bertkit.mine import MineConfig, config_fields, mine_hard_negatives


def cmd_mine(args: argparse.Namespace) -> None:
    config = MineConfig(**given_fields(args, config_fields()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with lock_directory(out.parent, name=f".{out.name}.lock"):
        report = mine_hard_negatives(args.model, args.pairs, out, args.corpus, config, args.anchor_column,
                                     args.positive_column, args.corpus_column)
    print(json.dumps(report))


def add_mine(verbs, help_text: str) -> None:
    """For each (query, positive) pair, the corpus texts the embedding model ranks closest to the query, outside a
    rank window and a margin below the positive's score (sentence-transformers' mine_hard_negatives rules), written
    as anchor, positive, negative_1 ... negative_k in the format of --out's suffix (.tsv, .csv, .jsonl) for
    `finetune embed` and `finetune rerank`."""
    mine = verbs.add_parser("mine", help=help_text, description=add_mine.__doc__)
    mine.add_argument("--model", required=True, help="embedding model directory (its pooling and prompts), or the "
                                                     "URL of a running `bertkit serve` (http://host:port)")
    mine.add_argument("--pairs", required=True, help="(query, positive) pairs: any table `finetune embed` reads")
    mine.add_argument("--corpus", help="corpus: a .txt file (one text a line) or a table (default: the positives)")
    mine.add_argument("--out", required=True, help="the table to write: .tsv, .csv or .jsonl")
    mine.add_argument("--anchor-column", help="the pairs' query column (default anchor, sentence1, query, text)")
    mine.add_argument("--positive-column", help="the pairs' positive column (default positive, sentence2, document)")
    mine.add_argument("--corpus-column", help="a corpus table's column (default text, document, positive, ...)")
    add_config_options(mine.add_argument_group("mining (MineConfig)"), config_fields())
    mine.set_defaults(func=cmd_mine)


PARSERS = {"mine": add_mine}
