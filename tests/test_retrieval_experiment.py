"""bench/experiments/retrieval_squad.py runs end to end on a tiny SQuAD-layout file with a tiny model: the split
keeps articles apart, mining writes negatives from training articles only, and every figure is a valid score."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from bertkit import BertConfig, BertModel, WordPieceTokenizer
from bertkit.models.pooling import SentenceEncoder
from bertkit.sentence import SentenceConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "experiments" / "retrieval_squad.py"
WORDS = "fox dog box jugs step miles journey shells sea shore numbers words pieces river city park".split()


def _squad(path: Path, articles: int = 10) -> None:
    rng = random.Random(0)
    data = []
    for a in range(articles):
        paragraphs = []
        for _ in range(3):
            context = " ".join(rng.sample(WORDS, 8))
            questions = [" ".join(rng.sample(context.split(), 3)) for _ in range(2)]
            paragraphs.append({"context": context, "qas": [{"id": f"{a}-{i}", "question": q, "answers": []}
                                                          for i, q in enumerate(questions)]})
        data.append({"title": f"article {a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}))


def test_retrieval_experiment_on_a_tiny_file(tmp_path):
    spec = importlib.util.spec_from_file_location("retrieval_squad", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tokenizer = WordPieceTokenizer.train(texts=[" ".join(WORDS)] * 3, vocab_size=90, min_frequency=1,
                                         show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    SentenceEncoder(BertModel(config), SentenceConfig(("mean",), normalize=True)).save_pretrained(
        tmp_path / "model", tokenizer)
    _squad(tmp_path / "squad.json")
    result = script.main(["--squad", str(tmp_path / "squad.json"), "--out", str(tmp_path / "run"), "--model",
                          str(tmp_path / "model"), "--seeds", "1", "--batch-size", "8", "--learning-rate", "1e-3",
                          "--max-seq-length", "32", "--device", "cpu", "--held-out", "0.3",
                          "--train-questions", "30"])
    assert result["held_out_articles"] == 3 and result["held_out_questions"] == 18
    assert result["train_articles"] == 6  # 7 training articles, one of them picks the best epoch
    # 30 of the 6 x 3 x 2 training questions, each once; mined from every training paragraph
    trained = [json.loads(line) for line in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    training = script.split(script.split(script.read_squad(tmp_path / "squad.json"), 0.3, 0)[0], 0.1, 1)[0]
    everyone = script.pairs(training)
    assert result["train_questions"] == len(trained) == 30 and len(everyone) == 36
    assert {(r["anchor"], r["positive"]) for r in trained} <= set(everyone)
    assert len((tmp_path / "run" / "corpus.txt").read_text().splitlines()) == 18
    held = {p["context"] for a in script.split(script.read_squad(tmp_path / "squad.json"), 0.3, 0)[1]
            for p in a["paragraphs"]}
    mined = [json.loads(line) for line in (tmp_path / "run" / "mined.jsonl").read_text().splitlines()]
    assert mined and all(r["negative_1"] not in held and r["negative_1"] != r["positive"] for r in mined)
    for scores in (result["baseline"], result["in_batch"][1], result["mined"][1], result["mined"]["median"]):
        assert set(scores) == {"ndcg_at_10", "mrr_at_10"} and all(0 <= v <= 1 for v in scores.values())
        # one relevant paragraph per question: its gain 1/log2(rank + 1) is at least its reciprocal rank
        assert scores["ndcg_at_10"] >= scores["mrr_at_10"] > 0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["baseline"] == result["baseline"]
