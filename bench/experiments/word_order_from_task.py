"""A word-order task made from the sentences of an existing task's splits (as measured in
docs/getting-started/main-job.md: the docstring-package task's train/dev of a pipeline run, so that the dev
sentences were kept out of that run's pretraining).

    python bench/experiments/word_order_from_task.py OUT/task OUT_DIR

Each sentence of 6 to 40 words (punctuation dropped from the edges of the words), every second one shuffled into
another order (label "shuffled"), the others kept ("original"); seed 0. `bertkit.pipeline.task.build_word_order_task`
makes the same task from the standard library (the pipeline's built-in task before the word salad).
"""
import json, random, re, sys
from pathlib import Path
src, out = Path(sys.argv[1]), Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
def words(t):
    w = [re.sub(r"[^\w'-]", "", x) for x in t.split()]
    return [x for x in w if x]
for split in ("train", "dev"):
    rows = [json.loads(l) for l in (src / f"{split}.jsonl").read_text().splitlines()]
    res = []
    for i, r in enumerate(rows):
        w = words(r["text"])
        if not 6 <= len(w) <= 40: continue
        if i % 2:
            s = w[:]
            while s == w: rng.shuffle(s)
            res.append({"text": " ".join(s), "label": "shuffled"})
        else:
            res.append({"text": " ".join(w), "label": "original"})
    (out / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in res))
    print(split, len(res))
