"""Candidate built-in tasks, all made from the same documentation sentences and the same train/dev split as
`bertkit.pipeline.task.build_word_order_task` (same packages, seed and sizes), so that a pipeline run's kept models
(whose pretraining left out exactly those dev sentences) can be used to screen them.

    python bench/experiments/task_candidates.py OUT_DIR [--check OUT/task/task.json]

Writes OUT_DIR/<variant>/{train,dev}.jsonl ({"text", "label"}), half of each split corrupted, for the variants:

    order       every word shuffled (the current built-in task)
    replace1    one word replaced by a word drawn by corpus frequency from the other training sentences
    replace2    two words replaced so
    replace-half  half the words replaced so
    salad       every word replaced so (words drawn by frequency, the sentence's length kept)
    swap1       one pair of adjacent (different) words swapped
    swap2       two such swaps
    local3      words shuffled inside windows of 3
    halves      the first half of the sentence joined to the second half of another sentence
    reverse     the words in reverse order
    pair-order  the sentence and its shuffle as a pair, the label saying which one is in written order

--check: fail unless the dev sentences equal a pipeline run's task.json "dev_sentences".
"""
import argparse
import json
import random
import sysconfig
from pathlib import Path

from bertkit.pipeline.task import TASK_PACKAGES, WORD_ORDER_DEV, WORD_ORDER_TRAIN, _package_sentences, plain_words, \
    shuffle_words

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--check", type=Path)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

root = Path(sysconfig.get_paths()["stdlib"])
by_package = _package_sentences(root, TASK_PACKAGES)
seen = {}
for name in TASK_PACKAGES:
    for sentence in by_package[name]:
        words = plain_words(sentence)
        if 6 <= len(words) <= 40 and len(set(words)) > 1:
            seen.setdefault(sentence, words)
rng = random.Random(args.seed)
sentences = sorted(seen)
rng.shuffle(sentences)
n_dev = min(WORD_ORDER_DEV, len(sentences) // 3)
splits = {"dev": sentences[:n_dev], "train": sentences[n_dev:n_dev + WORD_ORDER_TRAIN]}
if args.check:
    assert json.loads(args.check.read_text())["dev_sentences"] == splits["dev"], "not the run's dev sentences"
    print("dev sentences match", args.check)
pool = [w for s in splits["train"] for w in seen[s]]  # word occurrences: drawing one draws by corpus frequency
owner = [i for i, s in enumerate(splits["train"]) for _ in seen[s]]


def replace(words, k, r, own):
    out = words[:]
    for i in r.sample(range(len(words)), k):
        while True:
            j = r.randrange(len(pool))
            if owner[j] != own and pool[j].lower() != words[i].lower():
                break
        out[i] = pool[j]
    return out


def swap(words, k, r):
    out = words[:]
    for _ in range(k):
        cands = [i for i in range(len(out) - 1) if out[i].lower() != out[i + 1].lower()]
        i = r.choice(cands)
        out[i], out[i + 1] = out[i + 1], out[i]
    return out if out != words else swap(words, k, r)


def local(words, n, r):
    out = []
    for i in range(0, len(words), n):
        chunk = words[i:i + n]
        r.shuffle(chunk)
        out += chunk
    return out if out != words else local(words, n, r)


VARIANTS = {
    "order": lambda w, r, own, other: shuffle_words(w, r),
    "replace1": lambda w, r, own, other: replace(w, 1, r, own),
    "replace2": lambda w, r, own, other: replace(w, 2, r, own),
    "replace-half": lambda w, r, own, other: replace(w, len(w) // 2, r, own),
    "salad": lambda w, r, own, other: replace(w, len(w), r, own),
    "swap1": lambda w, r, own, other: swap(w, 1, r),
    "swap2": lambda w, r, own, other: swap(w, 2, r),
    "local3": lambda w, r, own, other: local(w, 3, r),
    "halves": lambda w, r, own, other: w[:len(w) // 2] + other[len(other) // 2:],
    "reverse": lambda w, r, own, other: w[::-1],
}
for name, corrupt in VARIANTS.items():
    r = random.Random(args.seed + 1)
    d = args.out / name
    d.mkdir(parents=True, exist_ok=True)
    for split, chosen in splits.items():
        bad = set(r.sample(range(len(chosen)), len(chosen) // 2))
        rows = []
        for i, sentence in enumerate(chosen):
            words = seen[sentence]
            if i in bad:
                other = seen[chosen[(i + 1) % len(chosen)]]
                own = i if split == "train" else -1
                rows.append({"text": " ".join(corrupt(words, r, own, other)), "label": "corrupted"})
            else:
                rows.append({"text": " ".join(words), "label": "original"})
        (d / f"{split}.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows))
    print(name, {s: len(c) for s, c in splits.items()})

# pair-order: the sentence and its shuffle side by side ("text", "pair"); the label says which one is in written
# order. Both sides hold the same words, so even a bag of words of each side is at chance.
r = random.Random(args.seed + 1)
d = args.out / "pair-order"
d.mkdir(parents=True, exist_ok=True)
for split, chosen in splits.items():
    first = set(r.sample(range(len(chosen)), len(chosen) // 2))
    rows = []
    for i, sentence in enumerate(chosen):
        words = seen[sentence]
        a, b = " ".join(words), " ".join(shuffle_words(words, r))
        rows.append({"text": a, "pair": b, "label": "first"} if i in first
                    else {"text": b, "pair": a, "label": "second"})
    (d / f"{split}.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows))
print("pair-order", {s: len(c) for s, c in splits.items()})
