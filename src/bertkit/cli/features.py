"""`bertkit features`: per-token vectors of chosen layers, or one sentence vector per line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertkit.cli.options import add_input_table_options, add_words_option
from bertkit.data.readers import column_texts, is_table_input
from bertkit.features import encode_sentences, extract_features, write_embeddings, write_features
from bertkit.io import lock_directory
from bertkit.sentence import read_sentence_config
from bertkit.tokenizers import load_tokenizer


def _features_prompt(args: argparse.Namespace) -> str:
    """The text put before each line: --query-prompt or --document-prompt, or the directory's prompt named by
    --prompt-name (sentence-transformers' `encode(prompt_name=...)`)."""
    given = [x for x in (args.query_prompt, args.document_prompt, args.prompt_name) if x is not None]
    if len(given) > 1:
        raise ValueError("give one of --query-prompt, --document-prompt and --prompt-name")
    if args.prompt_name is None:
        return given[0] if given else ""
    sentence = read_sentence_config(args.model)
    prompts = sentence.prompts if sentence is not None else {}
    if args.prompt_name not in prompts:
        raise ValueError(f"--prompt-name {args.prompt_name!r}: {args.model} has "
                         f"{', '.join(sorted(prompts)) or 'no prompts'} (config_sentence_transformers.json)")
    return prompts[args.prompt_name]


def cmd_features(args: argparse.Namespace) -> None:
    try:
        layers = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers {args.layers!r}: give comma-separated layer indices, e.g. -1,-2,-3,-4") from None
    if is_table_input(args.input, args.format):  # one input per row: the --text-column of a table
        texts = column_texts(args.input, args.text_column or "text", args.format, args.records)
    else:
        texts = Path(args.input).read_text(encoding="utf-8").splitlines()
    out = Path(args.out)
    # Sentence vectors: a pooling asked for, or (auto) a sentence-transformers directory's own.
    pooling = args.pooling if args.pooling != "auto" else (
        "directory" if read_sentence_config(args.model) is not None else "none")
    if pooling != "none":
        with lock_directory(out.parent, name=f".{out.name}.lock"):
            vectors = encode_sentences(args.model, texts, None if pooling == "directory" else pooling,
                                       batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                                       prompt=_features_prompt(args), dimensions=args.dimensions,
                                       window=args.window, stride=args.stride, per_window=args.per_window)
            windows = vectors[1:] if args.per_window else None
            vectors = vectors[0] if args.per_window else vectors
            written = write_embeddings(out, vectors, pooling, windows)
        print(json.dumps({"lines": len(texts), "embedding_shape": list(vectors.shape), "pooling": pooling,
                          "files": [str(p) for p in written]}))
        return
    if args.window is not None or args.dimensions is not None or _features_prompt(args):
        raise ValueError("--window, --dimensions and the prompts are for sentence vectors: add --pooling")
    # One writer per output (a .npy output is three files): a second `features --out SAME` fails at once.
    tokenizer = load_tokenizer(args.model)
    with lock_directory(out.parent, name=f".{out.name}.lock"):
        features, tokens = extract_features(args.model, texts, layers=layers, combine=args.combine,
                                            batch_size=args.batch_size, max_seq_length=args.max_seq_length or 512,
                                            tokenizer=tokenizer, words=args.words, stateful=args.stateful)
        written = write_features(args.out, features, tokens, layers=layers, combine=args.combine)
    shape = list(features[0].shape[1:]) if features else []
    report = {"lines": len(features), "feature_shape": ["T", *shape], "files": [str(p) for p in written]}
    if getattr(tokenizer, "kind", None) == "word":  # ELMo: what the characters of the words had to give up
        report.update(truncated_words=tokenizer.char_stats["truncated_words"],
                      unknown_chars=tokenizer.char_stats["unknown_chars"])
    print(json.dumps(report))


def add_features(verbs, help_text: str) -> None:
    """Write each input line's per-token features (hidden states of --layers, combined) to .safetensors (tensors
    line_0, line_1, ...; tokens in the metadata), .npz (features (N, T, D) zero-padded, lengths, tokens) or .npy
    (the padded array; NAME.lengths.npy and NAME.tokens.json beside it)."""
    feat = verbs.add_parser("features", help=help_text, description=add_features.__doc__)
    feat.add_argument("--model", required=True, help="model directory (any head; the encoder is used)")
    feat.add_argument("--input", required=True, help="text file, one input per line; or a table (.parquet, .arrow, "
                                                     ".json records, .jsonl, .csv, a datasets directory), one "
                                                     "input per row")
    add_input_table_options(feat)
    feat.add_argument("--out", required=True, help="output file: .safetensors, .npz or .npy")
    feat.add_argument("--layers", default="-1,-2,-3,-4",
                      help="comma-separated layer indices, 0 = embeddings, -1 = last (default -1,-2,-3,-4)")
    feat.add_argument("--combine", choices=["concat", "sum", "none"], default="concat",
                      help="how to combine the layers (default concat)")
    feat.add_argument("--batch-size", type=int, default=32, help="lines per forward pass (default 32)")
    feat.add_argument("--max-seq-length", type=int, help="truncate to this many tokens (default 512; sentence "
                                                         "vectors: the directory's sentence-transformers length)")
    feat.add_argument("--pooling", default="auto",
                      choices=["auto", "none", "cls", "mean", "max", "last", "weighted-mean", "mean-sqrt-len"],
                      help="one vector per line (N, D) pooled so; auto (default): a sentence-transformers "
                           "directory's own pooling (Dense, Normalize), per-token features otherwise; none: per-token")
    add_words_option(feat)
    feat.add_argument("--stateful", action="store_true",
                      help="ELMo: read the lines as one stream, --batch-size lines at a time in file order, each "
                           "LSTM state carried from a batch's row to the next batch's same row (bilm-tf's and "
                           "AllenNLP's way); default: every batch from zeros")
    feat.add_argument("--query-prompt", help="sentence vectors: text put before each line (the lines are queries)")
    feat.add_argument("--document-prompt", help="sentence vectors: text put before each line (documents)")
    feat.add_argument("--prompt-name", help="sentence vectors: put the directory's prompt of this name (query, "
                                            "document) before each line")
    feat.add_argument("--dimensions", type=int, help="sentence vectors: keep the first N components, renormalised "
                                                     "when the model normalises (Matryoshka models)")
    feat.add_argument("--window", type=int, help="sentence vectors of long lines: overlapping windows of N tokens "
                                                 "(special tokens included), pooled into one vector (the windows' "
                                                 "mean weighted by their tokens)")
    feat.add_argument("--stride", type=int, help="--window: text tokens between window starts (default: half)")
    feat.add_argument("--per-window", action="store_true",
                      help="--window: one vector per window, with its line (text) and character span (chars)")
    feat.set_defaults(func=cmd_features)


PARSERS = {"features": add_features}
