"""`bertkit <verb>`: the command-line face of the Python API. Parses arguments and calls library functions only.

Every verb's errors are reported as one line on stderr (`bertkit: error: ...`) with exit status 2 for bad
input, never a traceback; `BERTKIT_DEBUG=1` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


# ------------------------------------------------------------------------------------------------------------------
# tokenizer / tokenize / fill-mask / info
# ------------------------------------------------------------------------------------------------------------------
def cmd_tokenizer_train(args: argparse.Namespace) -> None:
    from bertkit.tokenizer import WordPieceTokenizer

    tok = WordPieceTokenizer.train(args.files, vocab_size=args.vocab_size, min_frequency=args.min_frequency,
                                   lowercase=not args.cased, strip_accents=args.strip_accents,
                                   show_progress=not args.quiet)
    tok.save(args.out)
    print(f"wrote a {tok.vocab_size}-token {'cased' if args.cased else 'uncased'} vocabulary to {args.out}")


def load_tokenizer(path: str):
    """A tokenizer from a model directory, a tokenizer directory or a vocab.txt file."""
    from bertkit.tokenizer import WordPieceTokenizer

    p = Path(path)
    if p.is_dir():
        return WordPieceTokenizer.from_pretrained(p)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such model directory or vocabulary file")
    return WordPieceTokenizer.from_vocab(p)


def cmd_tokenize(args: argparse.Namespace) -> None:
    tok = load_tokenizer(args.model_or_vocab)
    if args.cased is not None:  # a bare vocab.txt carries no casing; let the user say
        from bertkit.tokenizer import WordPieceTokenizer

        tok = WordPieceTokenizer(tok.get_vocab(), lowercase=not args.cased)
    enc = tok.encode(args.text, pair=args.pair, max_length=args.max_length)
    if args.json:
        print(json.dumps({"tokens": enc.tokens, "input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids,
                          "attention_mask": enc.attention_mask, "offsets": enc.offsets, "word_ids": enc.word_ids},
                         ensure_ascii=False))
        return
    width = max(len(t) for t in enc.tokens)
    for token, index, ttype in zip(enc.tokens, enc.input_ids, enc.token_type_ids):
        print(f"{token:<{width}}  {index:>6}  {ttype}")


def cmd_fill_mask(args: argparse.Namespace) -> None:
    from bertkit.inference import fill_mask

    for text in args.text:
        results = fill_mask(args.model, text, top_k=args.top_k)
        if args.json:
            print(json.dumps({"text": text, "predictions": results}, ensure_ascii=False))
            continue
        print(text)
        for position, candidates in enumerate(results):
            label = f"[MASK] #{position + 1}: " if len(results) > 1 else ""
            print("  " + label + "  ".join(f"{c['token']} ({c['probability']:.3f})" for c in candidates))


def cmd_info(args: argparse.Namespace) -> None:
    from bertkit.inference import model_info

    info = model_info(args.model)
    if args.json:
        print(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k:<30} {v}")
        else:
            print(f"{key:<32} {value}")


# ------------------------------------------------------------------------------------------------------------------
# parser
# ------------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", description="BERT and its family end to end.")
    from bertkit import __version__

    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    tokenizer = verbs.add_parser("tokenizer", help="train WordPiece vocabularies")
    tverbs = tokenizer.add_subparsers(dest="tverb", metavar="ACTION", required=True)
    train = tverbs.add_parser("train", help="learn a WordPiece vocabulary from text files",
                              description="Learn a WordPiece vocabulary from corpus files (text, JSON Lines, .gz).")
    train.add_argument("--files", nargs="+", required=True, help="corpus files, directories or globs")
    train.add_argument("--vocab-size", type=int, default=30522, help="size of the vocabulary (default 30522)")
    train.add_argument("--min-frequency", type=int, default=2, help="drop merges seen fewer times (default 2)")
    train.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
    train.add_argument("--strip-accents", action=argparse.BooleanOptionalAction, default=None,
                       help="strip accents (default: when uncased)")
    train.add_argument("--out", required=True, help="directory for vocab.txt and tokenizer files")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_tokenizer_train)

    tokenize = verbs.add_parser("tokenize", help="show the tokens and ids of a text",
                                description="Print the WordPiece tokens, ids and token types of TEXT.")
    tokenize.add_argument("--model-or-vocab", required=True, help="model directory, tokenizer directory or vocab.txt")
    tokenize.add_argument("--pair", help="second text (segment B)")
    tokenize.add_argument("--max-length", type=int, help="truncate (longest first) to this many tokens")
    tokenize.add_argument("--cased", action=argparse.BooleanOptionalAction, default=None,
                          help="override the casing (a bare vocab.txt is taken as uncased)")
    tokenize.add_argument("--json", action="store_true", help="print one JSON object")
    tokenize.add_argument("text", help="the text to encode")
    tokenize.set_defaults(func=cmd_tokenize)

    fill = verbs.add_parser("fill-mask", help="predict the [MASK] tokens of a text",
                            description="Top-k predictions with probabilities for every [MASK] in each TEXT.")
    fill.add_argument("--model", required=True, help="model directory with pretraining heads")
    fill.add_argument("--top-k", type=int, default=5, help="candidates per [MASK] (default 5)")
    fill.add_argument("--json", action="store_true", help="one JSON object per text")
    fill.add_argument("text", nargs="+", help='text containing [MASK], e.g. "paris is the [MASK] of france"')
    fill.set_defaults(func=cmd_fill_mask)

    info = verbs.add_parser("info", help="show a model directory's config and size",
                            description="Print the config, parameter count and files of a model directory.")
    info.add_argument("model", help="model directory")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("bertkit: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, TypeError, KeyError) as err:
        if os.environ.get("BERTKIT_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"bertkit: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
