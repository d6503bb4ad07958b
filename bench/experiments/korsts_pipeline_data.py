"""A Korean corpus and a Korean sentence-pair task from KorSTS, for `make run ARGS="--corpus ... --task-train ..."`.

    python bench/experiments/korsts_pipeline_data.py --out runs/korsts-data
    PYTHONPATH=src python -m bertkit.cli pipeline --out runs/korsts --corpus runs/korsts-data/corpus.txt \
        --task-train runs/korsts-data/train.jsonl --task-dev runs/korsts-data/dev.jsonl \
        --text-column sentence1 --pair-column sentence2 --label-column label

KorSTS (Ham et al. 2020, CC BY-SA 4.0; ../shared/data/korsts) scores 5,749 training and 1,500 dev sentence pairs
from 0 (unrelated) to 5 (same meaning). The task: three classes by score band, "different" below 2, "related"
from 2 to below 4, "equivalent" from 4. The corpus: every sentence of the training pairs, once, one per line, in
documents of 10 consecutive sentences (Google's format, a blank line between documents); the dev pairs' sentences
are left out of it, so neither model has seen them, and the training sentences are in it without their labels, as
the built-in task does.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

DATA = Path("../shared/data/korsts")  # from the project root, as the other experiments
BANDS = ((2.0, "different"), (4.0, "related"), (float("inf"), "equivalent"))


def label(score: float) -> str:
    return next(name for top, name in BANDS if score < top)


def read_pairs(path: Path) -> list[dict]:
    """KorSTS rows: {"sentence1", "sentence2", "score", "label"}; QUOTE_NONE, as the file has bare quotes."""
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [{"sentence1": r["sentence1"].strip(), "sentence2": r["sentence2"].strip(), "score": float(r["score"]),
             "label": label(float(r["score"]))} for r in rows if r.get("sentence2")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help=f"the KorSTS folder (default {DATA})")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    train, dev = read_pairs(args.data / "sts-train.tsv"), read_pairs(args.data / "sts-dev.tsv")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        with open(args.out / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for r in rows:
                handle.write(json.dumps(r, ensure_ascii=False) + "\n")
    held_out = {s for r in dev for s in (r["sentence1"], r["sentence2"])}
    sentences = list(dict.fromkeys(s for r in train for s in (r["sentence1"], r["sentence2"]) if s not in held_out))
    documents = ["\n".join(sentences[i:i + 10]) for i in range(0, len(sentences), 10)]
    (args.out / "corpus.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    counts = {split: {b: sum(r["label"] == b for r in rows) for _, b in BANDS}
              for split, rows in (("train", train), ("dev", dev))}
    print(json.dumps({"train": len(train), "dev": len(dev), "corpus_sentences": len(sentences),
                      "corpus_bytes": (args.out / "corpus.txt").stat().st_size, "labels": counts}, ensure_ascii=False))


if __name__ == "__main__":
    main()
