"""Parity check and throughput: bertkit's WordPieceTokenizer against both reference tokenizers on WikiText-2.

Each rule set against its own reference (`--compat`, default both):

    google        bertkit as a user gets it from a bare vocab.txt (`load_tokenizer(vocab.txt)`: Google's rules, the
                  vocabulary's casing) against google-research/bert `tokenization.py` (`FullTokenizer`: the released
                  file in DATA_DIR/../ref/google-bert when present, else the transcription in
                  tests/tokenizers/google_reference.py; pairs cut as its `_truncate_seq_pair` cuts them)
    transformers  `load_tokenizer(vocab.txt, compat="transformers")` against transformers' pure-Python port,
                  `transformers.models.bert.tokenization_bert_legacy.BertTokenizerLegacy`

For both Google vocabularies (bert-base-uncased, lower-cased; bert-base-cased, cased) and every line of
`wikitext-2/wiki.test.raw` and `wiki.valid.raw` (blank ones included), it compares input_ids, token_type_ids and
attention_mask of:

    single texts   ours.encode_batch(lines)                    ref(line) (no truncation)
    pairs          ours.encode_batch(a, b, max_length=64)      ref(a, b, truncation=True, max_length=64)
                   where (a, b) are consecutive non-blank lines of a file

Throughput is measured on the single texts, alternating per (vocabulary, file) chunk: bertkit encodes the chunk,
then the reference does. bertkit runs batched on the `tokenizers` engine (which may use every core); the
reference is a Python loop: the ratio is what a user of each gets, not a per-core comparison.

    python bench/tokenizer_parity.py [--data-dir ../shared/data] [--max-length 64] [--limit N]
                                     [--compat google|transformers]

Also counted, for the record: the lines on which the two references themselves differ (`references_differ`): none
on WikiText-2, which is NFC text without words over 100 characters or private-use characters, so this check
cannot tell the rule sets apart; bench/tokenizer_rules.py's `variants` change its lines where the rules part.
Prints one JSON line per rule set; exits 1 when any encoding differs. `run(data_dir)` returns the same dict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data"
FILES = ("wiki.test.raw", "wiki.valid.raw")
VOCABS = {"uncased": ("bert-base-uncased-vocab.txt", True), "cased": ("bert-base-cased-vocab.txt", False)}
FIELDS = ("input_ids", "token_type_ids", "attention_mask")
MAX_EXAMPLES = 5


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    """Every line of a text file, without its newline ("\\n" only, so no Unicode separator splits a line)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines[:limit] if limit is not None else lines


def consecutive_pairs(lines: list[str]) -> list[tuple[int, str, str]]:
    """(1-based line number of a, a, b) for consecutive non-blank lines a, b."""
    kept = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    return [(n, a, b) for (n, a), (_, b) in zip(kept, kept[1:])]


def _mismatch(ours_tok, ref_tok, ours: dict, ref: dict, **where) -> dict | None:
    """None when all fields agree, else a short description around the first difference."""
    for field in FIELDS:
        a, b = ours[field], ref[field]
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        lo, hi = max(0, first - 3), first + 5
        example = dict(where, field=field, first_difference=first, ours_length=len(a), reference_length=len(b),
                       ours=a[lo:hi], reference=b[lo:hi])
        if field == "input_ids":
            example["ours_tokens"] = ours_tok.convert_ids_to_tokens(a[lo:hi])
            example["reference_tokens"] = ref_tok.convert_ids_to_tokens(b[lo:hi])
        return example
    return None


def _fields(encoding) -> dict:
    return {field: list(getattr(encoding, field)) for field in FIELDS}


class GoogleReference:
    """Google's `FullTokenizer` framed as its run_classifier.py frames inputs, with the call signature of
    transformers' tokenizers that `_run` uses."""

    def __init__(self, vocab_path: Path, lowercase: bool, released: Path | None = None) -> None:
        sys.path.insert(0, str(ROOT / "tests" / "tokenizers"))
        import google_reference

        self.released = released is not None and (released / "tokenization.py").is_file()
        google = google_reference.import_released(released) if self.released else google_reference
        self.tokenizer = google.FullTokenizer(str(vocab_path), do_lower_case=lowercase)
        self.inv_vocab = {i: t for t, i in self.tokenizer.vocab.items()}

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.inv_vocab[i] for i in ids]

    def __call__(self, a: str, b: str | None = None, truncation: bool = False, max_length: int | None = None,
                 **_) -> dict:
        tokens_a = self.tokenizer.tokenize(a)
        tokens_b = None if b is None else self.tokenizer.tokenize(b)
        if truncation and max_length is not None:  # run_classifier.py's _truncate_seq_pair: pop from the longer
            budget = max_length - (2 if tokens_b is None else 3)
            while len(tokens_a) + len(tokens_b or []) > budget:
                if tokens_b is None or len(tokens_a) > len(tokens_b):
                    tokens_a.pop()
                else:
                    tokens_b.pop()
        tokens = ["[CLS]", *tokens_a, "[SEP]"]
        types = [0] * len(tokens)
        if tokens_b is not None:
            tokens += [*tokens_b, "[SEP]"]
            types += [1] * (len(tokens_b) + 1)
        return {"input_ids": self.tokenizer.convert_tokens_to_ids(tokens), "token_type_ids": types,
                "attention_mask": [1] * len(tokens)}


def run(data_dir: str | Path | None = None, max_length: int = 64, limit: int | None = None,
        compat: str = "transformers") -> dict:
    """Check every line (and consecutive pair) of WikiText-2 test+valid with both Google vocabularies.

    limit: only the first `limit` lines of each file (a smoke run); compat: the rule set checked (see the module
    docstring). Returns the JSON-able result:
    lines / pairs (per vocabulary; each is checked with both), mismatches (over both vocabularies),
    examples (the first few mismatches), lines/s of both and ratio = bertkit / reference.
    """
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the reference warns on every truncated pair that it returns no overflow
    try:
        return _run(data_dir, max_length, limit, compat)
    finally:
        hf_logging.set_verbosity(verbosity)


def _run(data_dir: str | Path | None, max_length: int, limit: int | None, compat: str) -> dict:
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    from bertkit.tokenizers import load_tokenizer

    data_dir = Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
    paths = [data_dir / "wikitext-2" / name for name in FILES]
    vocab_paths = {name: data_dir / "vocab" / file for name, (file, _) in VOCABS.items()}
    for path in [*paths, *vocab_paths.values()]:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (the WikiText-2 and vocabulary files of {data_dir})")
    corpora = {path.name: read_lines(path, limit) for path in paths}
    pairs = {name: consecutive_pairs(lines) for name, lines in corpora.items()}

    mismatches, examples = 0, []
    per_vocab, references_differ = {}, {}
    seconds = {"bertkit": 0.0, "transformers": 0.0}
    for vocab_name, (_, lowercase) in VOCABS.items():
        # A bare vocab.txt: Google's rules by default, the casing from the vocabulary (checked here).
        ours = load_tokenizer(vocab_paths[vocab_name], compat=None if compat == "google" else compat)
        assert (ours.compat, ours.lowercase) == (compat, lowercase), (ours, vocab_name)
        legacy = BertTokenizerLegacy(str(vocab_paths[vocab_name]), do_lower_case=lowercase)
        google = GoogleReference(vocab_paths[vocab_name], lowercase, data_dir.parent / "ref" / "google-bert")
        ref, other = (google, legacy) if compat == "google" else (legacy, google)
        found = differ = 0
        for file_name, lines in corpora.items():
            # Single texts, timed: A (bertkit, batched) then B (reference, one call per line).
            start = time.perf_counter()
            ours_single = ours.encode_batch(lines)
            seconds["bertkit"] += time.perf_counter() - start
            start = time.perf_counter()
            ref_single = [ref(line, return_token_type_ids=True, return_attention_mask=True) for line in lines]
            seconds["transformers"] += time.perf_counter() - start
            for number, (line, a, b) in enumerate(zip(lines, ours_single, ref_single), start=1):
                bad = _mismatch(ours, ref, _fields(a), b, vocab=vocab_name, file=file_name, line=number, text=line)
                if bad:
                    found += 1
                    if len(examples) < MAX_EXAMPLES:
                        examples.append(bad)
                differ += other(line)["input_ids"] != b["input_ids"]
            # Pairs with longest-first truncation.
            file_pairs = pairs[file_name]
            ours_pairs = ours.encode_batch([a for _, a, _ in file_pairs], [b for _, _, b in file_pairs],
                                           max_length=max_length)
            for (number, a_text, b_text), enc in zip(file_pairs, ours_pairs):
                expected = ref(a_text, b_text, truncation=True, max_length=max_length, return_token_type_ids=True,
                               return_attention_mask=True)
                bad = _mismatch(ours, ref, _fields(enc), expected, vocab=vocab_name, file=file_name, line=number,
                                text=a_text, pair=b_text)
                if bad:
                    found += 1
                    if len(examples) < MAX_EXAMPLES:
                        examples.append(bad)
        per_vocab[vocab_name] = found
        references_differ[vocab_name] = differ
        mismatches += found

    n_lines = sum(map(len, corpora.values()))
    n_pairs = sum(map(len, pairs.values()))
    timed_lines = n_lines * len(VOCABS)
    ours_rate, ref_rate = timed_lines / seconds["bertkit"], timed_lines / seconds["transformers"]
    name = type(ref).__name__ + (("(released)" if google.released else "(transcribed)") if ref is google else "")
    return {"bench": "tokenizer_parity", "compat": compat, "reference": name, "lines": n_lines,
            "pairs": n_pairs, "vocabs": list(VOCABS), "max_length": max_length, "mismatches": mismatches,
            "mismatches_by_vocab": per_vocab, "references_differ_on_lines": references_differ,
            "examples": examples, "bertkit_lines_per_s": round(ours_rate, 1),
            "reference_lines_per_s": round(ref_rate, 1), "ratio": round(ours_rate / ref_rate, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--max-length", type=int, default=64, help="max_length of the pair encodings (default 64)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N lines of each file")
    parser.add_argument("--quick", action="store_true", help="same as --limit 500")
    parser.add_argument("--compat", choices=["google", "transformers"], action="append",
                        help="rule set to check (repeatable; default both)")
    args = parser.parse_args(argv)
    limit = args.limit if args.limit is not None else (500 if args.quick else None)
    failed = False
    for compat in args.compat or ["google", "transformers"]:
        try:
            result = run(args.data_dir, args.max_length, limit, compat)
        except FileNotFoundError as err:
            print(f"tokenizer_parity: skipped, {err}", file=sys.stderr)
            return 0
        print(json.dumps(result, ensure_ascii=False), flush=True)
        failed |= bool(result["mismatches"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
