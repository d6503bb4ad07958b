"""What reproducible vocabulary training costs: bertkit's WordPiece and Unigram training against the bare
`tokenizers` trainers (the same normaliser, pre-tokenizer and settings), interleaved in one process, on WikiText-2.

Each round trains every side once on the same lines (a fresh generator each time, as `iter_lines` gives them) and
records its time and a hash of the vocabulary it wrote (tokens in id order). Prints one JSON line per kind: median
seconds, bertkit / bare time ratio, and how many different vocabularies each side gave over the rounds (bertkit: 1).

    python bench/bench_tokenizer_train.py --data ../shared/data --rounds 4 --vocab-size 8000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, log, median  # noqa: E402

from bertkit.tokenizers import UnigramTokenizer, WordPieceTokenizer  # noqa: E402
from bertkit.tokenizers.unigram import SPACE, SPECIAL_TOKENS as T5_SPECIALS, t5_normalizer  # noqa: E402
from bertkit.tokenizers.wordpiece import SPECIAL_TOKENS  # noqa: E402


def digest(tokens: list[str]) -> str:
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()[:12]


def bare_wordpiece(lines: list[str], vocab_size: int) -> str:
    engine = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    engine.normalizer = WordPieceTokenizer._normalizer(True, True)
    engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                        limit_alphabet=1000, continuing_subword_prefix="##", show_progress=False)
    engine.train_from_iterator(iter(lines), trainer=trainer)
    vocab = engine.get_vocab()
    return digest(sorted(vocab, key=vocab.get))


def ours_wordpiece(lines: list[str], vocab_size: int) -> str:
    tok = WordPieceTokenizer.train(iter(lines), vocab_size=vocab_size, show_progress=False)
    return digest([tok.id_to_token(i) for i in range(tok.vocab_size)])


def bare_unigram(lines: list[str], vocab_size: int) -> str:
    engine = Tokenizer(models.Unigram())
    engine.normalizer = t5_normalizer()
    engine.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(T5_SPECIALS), unk_token="<unk>",
                                      show_progress=False)
    engine.train_from_iterator(iter(lines), trainer=trainer)
    return digest([f"{p}\t{s!r}" for p, s in json.loads(engine.to_str())["model"]["vocab"]])


def ours_unigram(lines: list[str], vocab_size: int) -> str:
    tok = UnigramTokenizer.train(iter(lines), vocab_size=vocab_size, extra_ids=0, show_progress=False)
    return digest([f"{p}\t{s!r}" for p, s in json.loads(tok.backend.to_str())["model"]["vocab"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data", help="folder holding wikitext-2/wiki.{valid,test}.raw")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--kinds", nargs="+", default=["wordpiece", "unigram"], choices=["wordpiece", "unigram"])
    args = parser.parse_args()
    files = [Path(args.data) / "wikitext-2" / f"wiki.{split}.raw" for split in ("valid", "test")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        sys.exit(f"bench_tokenizer_train: no such file: {', '.join(missing)} (--data: the shared data folder)")
    lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    sides = {"wordpiece": (bare_wordpiece, ours_wordpiece), "unigram": (bare_unigram, ours_unigram)}
    for kind in args.kinds:
        times: dict[str, list[float]] = {"bare": [], "bertkit": []}
        vocabularies: dict[str, set[str]] = {"bare": set(), "bertkit": set()}
        for round_ in range(args.rounds):
            for name, fn in zip(("bare", "bertkit"), sides[kind]):
                start = time.perf_counter()
                vocabularies[name].add(fn(lines, args.vocab_size))
                times[name].append(time.perf_counter() - start)
            log(f"{kind} round {round_ + 1}/{args.rounds}: bare {times['bare'][-1]:.2f} s, "
                f"bertkit {times['bertkit'][-1]:.2f} s")
        emit({"kind": kind, "lines": len(lines), "text_mb": round(sum(map(len, lines)) / 1e6, 2),
              "vocab_size": args.vocab_size, "rounds": args.rounds,
              "bare_s": round(median(times["bare"]), 3), "bertkit_s": round(median(times["bertkit"]), 3),
              "time_ratio": round(median(times["bertkit"]) / median(times["bare"]), 3),
              "distinct_vocabularies": {name: len(v) for name, v in vocabularies.items()}})


if __name__ == "__main__":
    main()
