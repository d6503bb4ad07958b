"""What the WordPiece rule set and the casing detection change, against Google's `tokenization.py`.

    python bench/tokenizer_rules.py [--data-dir ../shared/data] [--ref-dir DATA_DIR/../ref] [--limit N]

Google's reference is its released tokenization.py (REF_DIR/google-bert, imported with its stand-ins by
tests/tokenizers/google_reference.py's `import_released`); without that folder, the transcription in
tests/tokenizers/google_reference.py (the `reference` field says which). Prints one JSON line:
    casing    on the non-blank lines of WikiText-2 test + valid, with Google's cased vocabulary, the lines whose ids
              differ from Google's FullTokenizer(do_lower_case=False): for a bare vocab.txt read as before the
              detection (lower-cased, transformers' rules) and as now (`load_tokenizer(vocab.txt)`)
    strings   on decomposed (NFD) text and words of 101-200 characters, for each vocabulary (its own casing) and
              each rule set, how many strings differ from Google's FullTokenizer
    variants  WikiText-2 as it stands is NFC text without words over 100 characters or private-use characters, so
              the two references agree on every line of it and a parity check on it cannot tell the rule sets
              apart. Three variants of its non-blank lines, each line changed where the rule sets part:
                  nfd          the line in NFD (only the lines NFD changes)
                  long_word    its first word of 3+ letters repeated to 150 characters (Google pieces it,
                               transformers' rules make it [UNK])
                  private_use  U+E000 after the first letter of its first word of 3+ letters (Google keeps the
                               character, transformers' rules drop it)
              For each variant and vocabulary: lines (the first --limit changed lines), references_differ (Google's
              FullTokenizer vs transformers' BertTokenizerLegacy), google_mismatches (bertkit's google rules vs
              Google's) and transformers_mismatches (bertkit's transformers rules vs BertTokenizerLegacy)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data"
WORD = re.compile(r"\b[^\W\d_]{3,}\b")  # a word of 3+ letters


def _long_word(line: str) -> str | None:
    found = WORD.search(line)
    if found is None:
        return None
    word = found.group()
    return line[:found.start()] + (word * (150 // len(word) + 1))[:150] + line[found.end():]


def _private_use(line: str) -> str | None:
    found = WORD.search(line)
    return None if found is None else line[:found.start() + 1] + "\ue000" + line[found.start() + 1:]


VARIANTS = {"nfd": lambda line: unicodedata.normalize("NFD", line), "long_word": _long_word,
            "private_use": _private_use}
STRINGS = (unicodedata.normalize("NFD", "Café résumé naïve Ångström"), unicodedata.normalize("NFD", "Ελληνικά ΆΈΉ"),
           "x" * 150, "word " + "ab" * 90)


def run(data_dir: Path, ref_dir: Path | None = None, limit: int | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "tokenizers"))
    sys.path.insert(0, str(ROOT / "bench"))
    import google_reference
    from tokenizer_parity import FILES, read_lines

    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    from bertkit.tokenizers import WordPieceTokenizer, load_tokenizer

    released = (ref_dir or data_dir.parent / "ref") / "google-bert"
    google = google_reference.import_released(released) if (released / "tokenization.py").is_file() \
        else google_reference

    vocab = {name: data_dir / "vocab" / f"bert-base-{name}-vocab.txt" for name in ("cased", "uncased")}
    paths = [data_dir / "wikitext-2" / name for name in FILES]
    for path in [*paths, *vocab.values()]:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found")
    lines = [line for path in paths for line in read_lines(path) if line.strip()]
    ref = google.FullTokenizer(str(vocab["cased"]), do_lower_case=False)
    want = [ref.convert_tokens_to_ids(ref.tokenize(line)) for line in lines]
    before = WordPieceTokenizer.from_vocab(vocab["cased"], lowercase=True, compat="transformers", force_casing=True)
    now = load_tokenizer(vocab["cased"])
    casing = {"lines": len(lines)}
    for name, tok in (("before", before), ("now", now)):
        casing[name] = sum(a != b for a, b in zip(tok.encode_plain(lines), want))
    strings = {}
    for name, path in vocab.items():
        ref = google.FullTokenizer(str(path), do_lower_case=name == "uncased")
        for compat in ("google", "transformers"):
            tok = load_tokenizer(path, compat=compat)
            strings[f"{name}/{compat}"] = sum(tok.tokenize(s) != ref.tokenize(s) for s in STRINGS)
    variants = {}
    for variant, change in VARIANTS.items():
        changed = [new for new, line in zip(map(change, lines), lines) if new is not None and new != line][:limit]
        for name, path in vocab.items():
            lowercase = name == "uncased"
            ref = google.FullTokenizer(str(path), do_lower_case=lowercase)
            legacy = BertTokenizerLegacy(str(path), do_lower_case=lowercase)
            want_google = [ref.convert_tokens_to_ids(ref.tokenize(line)) for line in changed]
            want_legacy = [legacy.convert_tokens_to_ids(legacy.tokenize(line)) for line in changed]
            google_rules, transformers_rules = load_tokenizer(path), load_tokenizer(path, compat="transformers")
            variants[f"{variant}/{name}"] = {
                "lines": len(changed),
                "references_differ": sum(a != b for a, b in zip(want_google, want_legacy)),
                "google_mismatches": sum(a != b for a, b in zip(google_rules.encode_plain(changed), want_google)),
                "transformers_mismatches": sum(a != b for a, b in zip(transformers_rules.encode_plain(changed),
                                                                      want_legacy))}
    return {"bench": "tokenizer_rules", "reference": "released" if google is not google_reference else
            "transcription", "casing": casing, "strings": strings, "of_strings": len(STRINGS), "variants": variants}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--ref-dir", type=Path, default=None,
                        help="holds google-bert/tokenization.py (default: DATA_DIR/../ref)")
    parser.add_argument("--limit", type=int, default=None,
                        help="variants: only the first N changed lines of each (default: all)")
    args = parser.parse_args(argv)
    try:
        result = run(args.data_dir, args.ref_dir, args.limit)
    except FileNotFoundError as err:
        print(f"tokenizer_rules: skipped, {err}", file=sys.stderr)
        return 0
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
