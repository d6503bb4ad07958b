"""`bertkit tokenizer train`, `bertkit tokenize` and `bertkit prepare`: vocabularies, a text's tokens, and a corpus
tokenised into training shards."""

from __future__ import annotations

import argparse
import json
import sys

from bertkit.data.corpus import CorpusLines, iter_lines
from bertkit.data.prepare import prepare
from bertkit.tokenizers import (ByteLevelBPETokenizer, UnigramTokenizer, WordPieceTokenizer, WordTokenizer,
                                detect_tokenizer_kind, load_tokenizer)
from bertkit.tokenizers.load import TOKENIZER_KINDS


def _corpus_args(args: argparse.Namespace) -> dict:
    """How `tokenizer train` reads its files (`bertkit.data.corpus.iter_lines`)."""
    return {"format": "arrow" if args.format == "datasets" else args.format, "text_column": args.text_column,
            "document_column": args.document_column}


def cmd_tokenizer_train(args: argparse.Namespace) -> None:
    if args.kind != "wordpiece" and (args.cased or args.strip_accents is not None or args.compat is not None):
        kept = "byte-level BPE keeps the text as is" if args.kind == "bpe" else "unigram normalises with NFKC only"
        raise ValueError(f"--cased, --strip-accents and --compat are WordPiece options; {kept}")
    if args.extra_ids is not None and args.kind != "unigram":
        raise ValueError("--extra-ids is a unigram option (T5's sentinel tokens)")
    if args.kind == "word":
        tok = WordTokenizer.train(iter_lines(args.files, **_corpus_args(args)), vocab_size=args.vocab_size or 30000,
                                  min_frequency=1 if args.min_frequency is None else args.min_frequency,
                                  show_progress=not args.quiet)
        tok.save(args.out)
        print(f"wrote a {tok.vocab_size}-word vocabulary and {len(tok.chars)} characters (tokenizer.json + "
              f"word_chars.json) to {args.out}")
        return
    if args.min_frequency is not None and args.kind == "unigram":
        raise ValueError("--min-frequency is a wordpiece / bpe option; unigram prunes by likelihood")
    # file:line errors come from the corpus reader; training reads the files twice
    texts = CorpusLines(args.files, **_corpus_args(args))
    vocab_size = args.vocab_size or (32100 if args.kind == "unigram" else 30522)
    min_frequency = 2 if args.min_frequency is None else args.min_frequency
    if getattr(args, "xlnet", False) and (args.kind != "unigram" or args.extra_ids is not None):
        raise ValueError("--xlnet is a unigram option without --extra-ids (XLNet's special tokens, no sentinels)")
    if args.kind == "unigram":
        tok = UnigramTokenizer.train(texts, vocab_size=vocab_size, show_progress=not args.quiet,
                                     extra_ids=100 if args.extra_ids is None else args.extra_ids,
                                     xlnet=getattr(args, "xlnet", False))
        tok.save(args.out)
        what = "XLNet's special tokens" if getattr(args, "xlnet", False) else f"{tok.extra_ids} extra ids"
        print(f"wrote a {tok.vocab_size}-token Unigram vocabulary ({what}, tokenizer.json) to {args.out}")
        return
    if args.kind == "bpe":
        tok = ByteLevelBPETokenizer.train(texts, vocab_size=vocab_size, min_frequency=min_frequency,
                                          show_progress=not args.quiet)
        tok.save(args.out)
        print(f"wrote a {tok.vocab_size}-token byte-level BPE vocabulary (vocab.json + merges.txt) to {args.out}")
        return
    tok = WordPieceTokenizer.train(texts, vocab_size=vocab_size, min_frequency=min_frequency,
                                   lowercase=not args.cased, strip_accents=args.strip_accents,
                                   show_progress=not args.quiet, compat=args.compat or "transformers")
    tok.save(args.out)
    print(f"wrote a {tok.vocab_size}-token {'cased' if args.cased else 'uncased'} vocabulary to {args.out}")


def add_wordpiece_rule_options(parser: argparse.ArgumentParser) -> None:
    """--compat, --cased/--no-cased (or --lowercase true|false), --force-casing: how a WordPiece vocabulary is
    applied (`load_with_rules`)."""
    parser.add_argument("--compat", choices=["google", "transformers"],
                        help="WordPiece rules: google (tokenization.py; the default for a bare vocab.txt) or "
                             "transformers (BertTokenizer; the default for a directory transformers wrote)")
    casing = parser.add_mutually_exclusive_group()
    casing.add_argument("--cased", action=argparse.BooleanOptionalAction, default=None,
                        help="override the casing (a bare vocab.txt: cased when it holds capitalised pieces)")
    casing.add_argument("--lowercase", choices=["true", "false"], help="the same as --no-cased / --cased")
    parser.add_argument("--force-casing", action="store_true",
                        help="accept a casing that contradicts the vocabulary")


def load_with_rules(path: str, kind: str | None, args: argparse.Namespace):
    """`load_tokenizer` with the options of `add_wordpiece_rule_options`; says on stderr, in one line, which rules
    and casing a bare vocab.txt got."""
    if args.lowercase is not None:
        args.cased = args.lowercase == "false"
    given = [name for name, value in (("--cased", args.cased), ("--compat", args.compat)) if value is not None]
    found = kind or detect_tokenizer_kind(path)
    if found != "wordpiece":
        if given:
            raise ValueError(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to a WordPiece "
                             f"vocabulary; {path} holds a {found} tokenizer, whose files decide its rules")
        return load_tokenizer(path, kind=kind)
    tok = load_tokenizer(path, kind=kind, compat=args.compat, lowercase=None if args.cased is None else not args.cased,
                         force_casing=args.force_casing)
    if tok.rules_note:
        print(tok.rules_note, file=sys.stderr)
    return tok


def cmd_tokenize(args: argparse.Namespace) -> None:
    tok = load_with_rules(args.model_or_vocab, args.tokenizer_kind, args)
    needed = tok.num_special_tokens(args.pair is not None)
    if args.max_length is not None and args.max_length < needed:
        frame = tok.build_inputs([], None if args.pair is None else [])[0]
        raise ValueError(f"--max-length {args.max_length} is too small: the special tokens alone take {needed} "
                         f"({' '.join(tok.convert_ids_to_tokens(frame))}); give at least {needed + 1} for any text")
    enc = tok.encode(args.text, pair=args.pair, max_length=args.max_length)
    if args.json:
        print(json.dumps({"tokens": enc.tokens, "input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids,
                          "attention_mask": enc.attention_mask, "offsets": enc.offsets, "word_ids": enc.word_ids,
                          "sequence_ids": enc.sequence_ids, "special_tokens_mask": enc.special_tokens_mask},
                         ensure_ascii=False))
        return
    width = max((len(t) for t in enc.tokens), default=0)
    for token, index, ttype in zip(enc.tokens, enc.input_ids, enc.token_type_ids):
        print(f"{token:<{width}}  {index:>6}  {ttype}")


def cmd_prepare(args: argparse.Namespace) -> None:
    tokenizer = load_with_rules(args.tokenizer, args.tokenizer_kind, args)
    manifest = prepare(args.corpus, tokenizer, args.out, eval_paths=args.eval_corpus,
                       eval_fraction=args.eval_fraction, format=args.format, on_bad_line=args.on_bad_line,
                       shard_tokens=args.shard_tokens, seed=args.seed, progress=not args.quiet,
                       tokenizer_kind=args.tokenizer_kind, text_column=args.text_column,
                       document_column=args.document_column)
    print(json.dumps(manifest.summary() if hasattr(manifest, "summary") else {"out": args.out}, indent=2))


_CORPUS_FORMATS = ["text", "jsonl", "wikitext", "parquet", "arrow", "datasets"]


def _add_corpus_columns(parser: argparse.ArgumentParser) -> None:
    """Where a corpus's text is in JSONL records and Parquet / Arrow / datasets tables."""
    parser.add_argument("--text-column", default="text",
                        help="JSONL key or Parquet/Arrow column of the text; a row is a document, its newlines its "
                             "line boundaries (default text)")
    parser.add_argument("--document-column",
                        help="Parquet/Arrow: consecutive rows with the same value here form one document")


def add_tokenizer(verbs, help_text: str) -> None:
    """Learn a WordPiece vocabulary (BERT's; --kind bpe: RoBERTa's byte-level BPE; --kind unigram: T5's
    SentencePiece-style Unigram) from corpus files (text, JSON Lines, .gz)."""
    tokenizer = verbs.add_parser("tokenizer", help=help_text)
    tverbs = tokenizer.add_subparsers(dest="tverb", metavar="ACTION", required=True)
    train = tverbs.add_parser("train", help="learn a WordPiece (byte-level BPE, Unigram) vocabulary from text files",
                              description=add_tokenizer.__doc__)
    train.add_argument("--files", nargs="+", required=True, help="corpus files, directories or globs")
    train.add_argument("--format", choices=_CORPUS_FORMATS, help="input format (default: by extension)")
    _add_corpus_columns(train)
    train.add_argument("--kind", choices=["wordpiece", "bpe", "unigram", "word"], default="wordpiece",
                       help="wordpiece (vocab.txt, default), bpe (vocab.json + merges.txt, RoBERTa's), unigram "
                            "(tokenizer.json, T5's: <pad> </s> <unk> first, sentinels last) or word (ELMo's: "
                            "whole words by frequency + word_chars.json, the characters)")
    train.add_argument("--vocab-size", type=int, default=None,
                       help="size of the vocabulary, special tokens included (default 30522; unigram 32100, its "
                            "extra ids included)")
    train.add_argument("--min-frequency", type=int, default=None,
                       help="wordpiece / bpe: drop merges seen fewer times (default 2)")
    train.add_argument("--extra-ids", type=int, default=None,
                       help="unigram: sentinel tokens <extra_id_0>.. at the end of the vocabulary (default 100)")
    train.add_argument("--xlnet", action="store_true",
                       help="unigram: XLNet's layout (<unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop> at ids "
                            "0-8, framing `A <sep> B <sep> <cls>`, padding on the left), for --objective xlnet")
    train.add_argument("--cased", action="store_true", help="wordpiece: keep case and accents (default: uncased)")
    train.add_argument("--compat", choices=["google", "transformers"],
                       help="wordpiece: the rules saved with the vocabulary (default transformers, which "
                            "transformers' BertTokenizer also applies; google: tokenization.py's)")
    train.add_argument("--strip-accents", action=argparse.BooleanOptionalAction, default=None,
                       help="wordpiece: strip accents (default: when uncased)")
    train.add_argument("--out", required=True, help="directory for the vocabulary and tokenizer files")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_tokenizer_train)


def add_tokenize(verbs, help_text: str) -> None:
    """Print the tokens, ids and token types of TEXT (and --pair) as the tokenizer frames them for a model."""
    tokenize = verbs.add_parser("tokenize", help=help_text, description=add_tokenize.__doc__)
    tokenize.add_argument("--model-or-vocab", required=True,
                          help="model or tokenizer directory (vocab.txt, vocab.json + merges.txt, or tokenizer.json), "
                               "or a vocabulary file")
    tokenize.add_argument("--tokenizer-kind", choices=TOKENIZER_KINDS,
                          help="default: detected from the files (json reads any tokenizer.json as it stands)")
    tokenize.add_argument("--pair", help="second text (segment B)")
    tokenize.add_argument("--max-length", type=int, help="truncate (longest first) to this many tokens")
    add_wordpiece_rule_options(tokenize)
    tokenize.add_argument("--json", action="store_true", help="print one JSON object")
    tokenize.add_argument("text", help="the text to encode")
    tokenize.set_defaults(func=cmd_tokenize)


def add_prepare(verbs, help_text: str) -> None:
    """Tokenise text / JSON Lines corpora (optionally .gz) into memory-mapped token shards with sentence, document
    and word-start indexes."""
    prep = verbs.add_parser("prepare", help=help_text, description=add_prepare.__doc__)
    prep.add_argument("--corpus", nargs="+", required=True, help="files, directories or globs")
    prep.add_argument("--tokenizer", required=True,
                      help="tokenizer or model directory (vocab.txt, vocab.json + merges.txt, or tokenizer.json), "
                           "or a vocab file")
    prep.add_argument("--tokenizer-kind", choices=TOKENIZER_KINDS,
                      help="wordpiece, bpe (byte-level, RoBERTa's), unigram (T5's) or json (any tokenizer.json); "
                           "default: detected from the files")
    prep.add_argument("--out", required=True, help="data directory to write")
    held = prep.add_mutually_exclusive_group()
    held.add_argument("--eval-corpus", nargs="+", help="held-out corpus for evaluation")
    held.add_argument("--eval-fraction", type=float, default=0.0, help="hold out this fraction of documents")
    prep.add_argument("--format", choices=_CORPUS_FORMATS, help="input format (default: by extension; a directory "
                                                                "of Parquet shards or a save_to_disk directory)")
    _add_corpus_columns(prep)
    prep.add_argument("--on-bad-line", choices=["error", "skip"], default="error",
                      help="invalid UTF-8, bad JSON or empty documents: stop (default) or skip and count")
    prep.add_argument("--shard-tokens", type=int, default=2 ** 24, help="tokens per shard (default 16M)")
    prep.add_argument("--seed", type=int, default=0, help="seed of the eval-fraction choice")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    add_wordpiece_rule_options(prep)
    prep.set_defaults(func=cmd_prepare)


PARSERS = {"tokenizer": add_tokenizer, "tokenize": add_tokenize, "prepare": add_prepare}
