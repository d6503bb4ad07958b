"""Benchmark: `bertkit prepare` against the corpus step of transformers' `run_mlm.py` example, on one corpus.

The peer's recipe (examples/pytorch/language-modeling/run_mlm.py, default `line_by_line=False`): read the file as
lines (the `datasets` "text" loader), tokenise them with the fast BERT tokenizer in batches of 1000 lines
(`tokenizer(texts, return_special_tokens_mask=True)`), then `group_texts`: concatenate each batch's columns and
cut them into blocks of 128 tokens, dropping the batch's remainder. `datasets` and its Arrow cache are left out,
which only flatters the peer. bertkit's side is `prepare()`: reading, sentence splitting, tokenising, writing
shards with checksums and a manifest.

Prints one JSON line. Token rates use bertkit's token count (WordPiece pieces, no special tokens) for both, so
the ratio is the time ratio; the peer's own count (with [CLS]/[SEP] per line) is reported beside it.

    python bench/bench_prepare.py [--corpus FILE] [--vocab vocab.txt] [--repeat N]

Each side runs `--repeat` times (default 3), interleaved, and its fastest run counts: the first run of either
pays one-off costs (thread pool start-up, page cache) that are not what is being compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def group_texts(examples: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """run_mlm.py's `group_texts`: concatenate every column, drop the remainder, cut into `block_size` blocks."""
    concatenated = {k: [t for row in examples[k] for t in row] for k in examples}
    total = len(concatenated[next(iter(examples))])
    total = (total // block_size) * block_size
    return {k: [v[i:i + block_size] for i in range(0, total, block_size)] for k, v in concatenated.items()}


def run_transformers(corpus: Path, vocab: Path, block_size: int, batch_lines: int) -> tuple[float, int]:
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
    start = time.perf_counter()
    with open(corpus, encoding="utf-8") as handle:
        lines = handle.read().splitlines()  # what the datasets "text" loader yields, one example per line
    tokens = 0
    for i in range(0, len(lines), batch_lines):
        encoded = tokenizer(lines[i:i + batch_lines], return_special_tokens_mask=True)
        blocks = group_texts({k: encoded[k] for k in encoded.keys()}, block_size)
        tokens += sum(map(len, blocks["input_ids"]))
    return time.perf_counter() - start, tokens


def run_bertkit(corpus: Path, vocab: Path) -> tuple[float, int]:
    from bertkit.data.prepare import prepare
    from bertkit.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_vocab(vocab, lowercase=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        manifest = prepare(corpus, tokenizer, Path(tmp) / "out", progress=False)
        elapsed = time.perf_counter() - start
    return elapsed, int(manifest.split("train")["tokens"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DATA / "wikitext-2" / "wiki.test.raw")
    parser.add_argument("--vocab", type=Path, default=DATA / "vocab" / "bert-base-uncased-vocab.txt")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-lines", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, interleaved; the fastest counts")
    args = parser.parse_args(argv)

    for path in (args.corpus, args.vocab):
        if not path.is_file():
            print(f"bench_prepare: skipped, {path} not found", file=sys.stderr)
            return 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("bench_prepare: skipped, transformers is not installed", file=sys.stderr)
        return 0
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

    peer, ours = [], []
    for _ in range(args.repeat):  # interleaved, so that a busy spell on a shared machine hits both sides
        peer.append(run_transformers(args.corpus, args.vocab, args.block_size, args.batch_lines))
        ours.append(run_bertkit(args.corpus, args.vocab))
    bertkit_s, tokens = min(ours)
    transformers_s, peer_tokens = min(peer)
    result = {"bench": "prepare", "corpus": str(args.corpus), "tokens": tokens,
              "bertkit_s": round(bertkit_s, 3), "transformers_s": round(transformers_s, 3),
              "bertkit_tokens_per_s": round(tokens / bertkit_s),
              "transformers_tokens_per_s": round(tokens / transformers_s),
              "ratio": round(transformers_s / bertkit_s, 3), "transformers_tokens": peer_tokens}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
