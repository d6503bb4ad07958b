"""bertkit.pipeline.evaluation: fill-mask on held-out sentences, on a randomly initialised tiny model over a corpus
whose word frequencies are known: the prompts drawn by seed, the bands that partition them, the frequency baseline,
and every shown prediction against `bertkit.inference.fill_mask` on the same sentence."""

from __future__ import annotations

import random

import pytest

from bertkit.data.prepare import prepare
from bertkit.inference import fill_mask
from bertkit.pipeline.evaluation import FREQUENCY_BANDS, fill_mask_evaluation
from bertkit.tokenizers import WordPieceTokenizer
from bertkit.training.pretrain import init_model_dir

# "the" is the most frequent word by far (twice a sentence); the others draw evenly.
WORDS = "cat dog bird sat ran on under mat log tree big small red blue happy sad home park river day".split()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluation")
    rng = random.Random(0)
    documents = ["\n".join("the " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))) + " the end."
                           for _ in range(rng.randint(2, 4))) for _ in range(120)]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    tokenizer = WordPieceTokenizer.train([corpus.read_text(encoding="utf-8")], vocab_size=80, show_progress=False)
    tokenizer.save(root / "tokenizer")
    prepare([str(corpus)], root / "tokenizer", root / "data", eval_fraction=0.2, progress=False, seed=0)
    init_model_dir(root / "model", root / "tokenizer", preset="tiny", seed=0)
    return root / "model", root / "data"


def test_bands_partition_the_prompts_and_the_baseline_is_the_most_frequent_word(dirs):
    got = fill_mask_evaluation(*dirs, prompts=50, examples=50, seed=0)
    assert got["prompts"] == 50 == len(got["examples"])
    assert got["baseline_word"] == "the"
    answers = [e["answer"] for e in got["examples"]]
    assert got["baseline_accuracy"] == sum(a == "the" for a in answers) / 50
    assert [b["band"] for b in got["bands"]] == [name for name, _, _ in FREQUENCY_BANDS]
    assert sum(b["prompts"] for b in got["bands"]) == 50
    for band in got["bands"]:
        members = [e for e in got["examples"] if e["band"] == band["band"]]
        assert band["prompts"] == len(members)
        if members:
            assert band["top1_accuracy"] == sum(e["correct"] for e in members) / len(members)
            assert band["top1_accuracy"] <= band["top5_accuracy"]
    assert got["top1_accuracy"] == sum(e["correct"] for e in got["examples"]) / 50
    # Every word of this corpus is among its 100 most frequent: no rare prompt.
    assert got["rare_prompts"] == 0 and got["rare_top1_accuracy"] is None


def test_the_draw_follows_the_seed(dirs):
    first = fill_mask_evaluation(*dirs, prompts=20, examples=20, seed=1)
    assert fill_mask_evaluation(*dirs, prompts=20, examples=20, seed=1) == first
    assert fill_mask_evaluation(*dirs, prompts=20, examples=20, seed=2)["examples"] != first["examples"]
    assert all(e["prompt"].count("[MASK]") == 1 for e in first["examples"])


def test_predictions_match_fill_mask_on_the_same_sentence(dirs):
    model_dir, _ = dirs
    got = fill_mask_evaluation(*dirs, prompts=12, examples=12, seed=0)
    for example in got["examples"]:
        reference = fill_mask(model_dir, example["prompt"], top_k=5)[0]
        assert [t for t, _ in example["candidates"]] == [c["token"] for c in reference]
        # Batched with padding here, alone there: the same probabilities to float32 rounding (4 decimals kept).
        assert [p for _, p in example["candidates"]] == pytest.approx([c["probability"] for c in reference],
                                                                      abs=1e-4)
        assert example["correct"] == (example["candidates"][0][0] == example["answer"])
