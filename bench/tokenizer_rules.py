"""What the WordPiece rule set and the casing detection change, against Google's `tokenization.py`.

    python bench/tokenizer_rules.py [--data-dir ../shared/data]

Prints one JSON line:
    casing   on the non-blank lines of WikiText-2 test + valid, with Google's cased vocabulary, the lines whose ids
             differ from Google's FullTokenizer(do_lower_case=False): for a bare vocab.txt read as before the
             detection (lower-cased, transformers' rules) and as now (`load_tokenizer(vocab.txt)`)
    strings  on decomposed (NFD) text and words of 101-200 characters, for each vocabulary (its own casing) and each
             rule set, how many strings differ from Google's FullTokenizer
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data"
STRINGS = (unicodedata.normalize("NFD", "Café résumé naïve Ångström"), unicodedata.normalize("NFD", "Ελληνικά ΆΈΉ"),
           "x" * 150, "word " + "ab" * 90)


def run(data_dir: Path) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "tokenizers"))
    sys.path.insert(0, str(ROOT / "bench"))
    import google_reference as google
    from tokenizer_parity import FILES, read_lines

    from bertkit.tokenizers import WordPieceTokenizer, load_tokenizer

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
    return {"bench": "tokenizer_rules", "casing": casing, "strings": strings, "of_strings": len(STRINGS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    try:
        result = run(args.data_dir)
    except FileNotFoundError as err:
        print(f"tokenizer_rules: skipped, {err}", file=sys.stderr)
        return 0
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
