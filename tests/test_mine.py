"""`bertkit mine`: the rank window, margins and sampling against a brute-force computation, the blockwise top-k
against a full sort, files in every format, and the whole verb against sentence-transformers' mine_hard_negatives."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertModel, WordPieceTokenizer
from bertkit.cli import main
from bertkit.mine import MineConfig, choose_negatives, mine_hard_negatives, read_corpus, top_k_blockwise, write_table
from bertkit.models.pooling import SentenceEncoder
from bertkit.sentence import SentenceConfig
from conftest import uvicorn_in_thread

pytestmark = pytest.mark.usefixtures("one_thread")


def brute_force(sims: np.ndarray, positives, config: MineConfig, rng=None):
    """The rules written out on the full (Q, N) matrix: sort every corpus text, keep the best range_max + P (P: the
    most positives of a query), drop positives and what the margins and max score remove, take the window, then
    the top or a draw."""
    out = []
    candidates = config.window_end + max(map(len, positives))
    for q, row in enumerate(sims):
        low = min(row[j] for j in positives[q])
        ranked = sorted(range(len(row)), key=lambda j: (-row[j], j))[:candidates]
        kept = [j for j in ranked if j not in positives[q]
                and (config.margin is None or row[j] <= low - config.margin)
                and (config.relative_margin is None or row[j] <= low - abs(low) * config.relative_margin)
                and (config.max_score is None or row[j] <= config.max_score)]
        window = kept[config.range_min:config.window_end]
        if len(window) < config.num_negatives:
            out.append(None)
        elif config.sampling == "top":
            out.append(window[:config.num_negatives])
        else:
            out.append([window[i] for i in sorted(rng.choice(len(window), config.num_negatives, replace=False))])
    return out


def _case(seed: int, Q: int = 12, N: int = 40):
    rng = np.random.default_rng(seed)
    sims = np.round(rng.uniform(-1, 1, size=(Q, N)), 3)  # rounded: ties occur, and break by the lower index
    positives = [sorted(rng.choice(N, size=rng.integers(1, 3), replace=False).tolist()) for _ in range(Q)]
    return sims, positives


@pytest.mark.parametrize("options", [
    dict(num_negatives=3), dict(num_negatives=2, range_min=3, range_max=9), dict(num_negatives=3, margin=0.1),
    dict(num_negatives=2, relative_margin=0.05, range_min=1), dict(num_negatives=4, max_score=0.5, range_max=30),
    dict(num_negatives=3, sampling="random", range_min=2, range_max=12, seed=4),
    dict(num_negatives=3, margin=0.0, sampling="random", seed=1),
    dict(num_negatives=12, range_max=38, margin=0.2),  # 4 to 9 of the 12 queries fall short: dropped
])
def test_rules_match_a_brute_force_computation(options):
    config = MineConfig(**options)
    for seed in range(3):
        sims, positives = _case(seed)
        k = min(config.window_end + max(map(len, positives)), sims.shape[1])
        scores, indices = top_k_blockwise(torch.tensor(sims, dtype=torch.float32), torch.eye(sims.shape[1]), k, 7)
        sims = sims.astype(np.float32)
        low = [min(sims[q, j] for j in positives[q]) for q in range(len(sims))]
        got = choose_negatives(scores.numpy(), indices.numpy(), positives, low, config,
                               np.random.default_rng(config.seed))
        expected = brute_force(sims, positives, config, np.random.default_rng(config.seed))
        assert got == expected
    if options.get("num_negatives") == 12:
        assert None in got and any(g is not None for g in got)


def test_top_k_blockwise_equals_a_full_sort_with_ties_and_a_short_corpus():
    torch.manual_seed(0)
    q, c = torch.randn(9, 4), torch.randn(23, 4)
    c[5] = c[17]  # a tie: the lower index first
    full = q @ c.T
    for block in (1, 4, 8, 100):
        s, i = top_k_blockwise(q, c, 6, block)
        order = [sorted(range(23), key=lambda j: (-float(full[r, j]), j))[:6] for r in range(9)]
        assert i.tolist() == order
        torch.testing.assert_close(s, full.gather(1, torch.tensor(order)))
    s, i = top_k_blockwise(q, c[:3], 5, 2)  # k past the corpus: -inf and -1
    assert (i[:, 3:] == -1).all() and torch.isinf(s[:, 3:]).all()


def test_files_in_every_format_round_trip(tmp_path):
    rows = [["a, \"quoted\"", "b"], ["c", "d"]]
    for suffix in (".csv", ".jsonl", ".tsv"):
        path = tmp_path / f"t{suffix}"
        write_table(path, ["anchor", "positive"], rows if suffix != ".tsv" else [["a", "b"], ["c", "d"]])
        assert read_corpus(path, "anchor") == ([r[0] for r in rows] if suffix != ".tsv" else ["a", "c"])
    with pytest.raises(ValueError, match="t2.tsv: line 2 would hold a text with a tab"):
        write_table(tmp_path / "t2.tsv", ["anchor", "positive"], [["a\tb", "c"]])
    assert not (tmp_path / "t2.tsv").exists()
    with pytest.raises(ValueError, match="to a .tsv, .csv or .jsonl file"):
        write_table(tmp_path / "t.parquet", ["a"], [["x"]])


WORDS = "the quick brown fox jumps over a lazy dog pack my box with five dozen liquor jugs sea shore shells".split()


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine")
    tokenizer = WordPieceTokenizer.train(texts=[" ".join(WORDS)] * 3, vocab_size=90, min_frequency=1,
                                         show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    SentenceEncoder(BertModel(config), SentenceConfig(modes=("mean",), normalize=True)).save_pretrained(
        root / "model", tokenizer)
    rng = np.random.default_rng(0)
    pairs = [(" ".join(rng.choice(WORDS, 4)), " ".join(rng.choice(WORDS, 5))) for _ in range(10)]
    with open(root / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows([("query", "positive"), *pairs])
    (root / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS, 6)) for _ in range(40)) + "\n")
    return root


@pytest.mark.parametrize("options", [dict(num_negatives=3), dict(num_negatives=2, range_min=2, range_max=10),
                                     dict(num_negatives=2, margin=0.02, range_max=20)])
def test_mine_equals_sentence_transformers(encoder_dir, tmp_path, options):
    config = MineConfig(**options, device="cpu")
    report = mine_hard_negatives(encoder_dir / "model", encoder_dir / "pairs.csv", tmp_path / "mined.jsonl",
                                 encoder_dir / "corpus.txt", config)
    ours = [json.loads(line) for line in (tmp_path / "mined.jsonl").read_text().splitlines()]
    assert report["rows"] == len(ours) and report["rows"] + report["dropped"] == 10
    assert _by_pair(ours) == _sentence_transformers_mined(encoder_dir, config)


def _by_pair(rows: list[dict]) -> list[dict]:
    """Rows sorted by (anchor, positive): sentence-transformers groups its rows by query."""
    return sorted(rows, key=lambda r: (r["anchor"], r["positive"]))


def _sentence_transformers_mined(encoder_dir, config: MineConfig, reranker=None) -> list[dict]:
    """sentence-transformers' mine_hard_negatives on the fixture's pairs and corpus with `config`'s rules (and the
    reranker directory as its cross_encoder), as our rows, sorted by pair."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    from sentence_transformers.util import mine_hard_negatives as st_mine

    with open(encoder_dir / "pairs.csv") as f:
        pairs = list(csv.DictReader(f))
    dataset = datasets.Dataset.from_dict({"query": [p["query"] for p in pairs],
                                          "positive": [p["positive"] for p in pairs]})
    corpus = (encoder_dir / "corpus.txt").read_text().splitlines()
    model = st.SentenceTransformer(str(encoder_dir / "model"), device="cpu")
    cross = st.CrossEncoder(str(reranker), device="cpu") if reranker is not None else None
    theirs = st_mine(dataset, model, corpus=corpus, cross_encoder=cross, num_negatives=config.num_negatives,
                     range_min=config.range_min, range_max=config.range_max, absolute_margin=config.margin,
                     relative_margin=config.relative_margin, max_score=config.max_score, output_format="n-tuple",
                     verbose=False, batch_size=8)
    return _by_pair([{"anchor": r["query"], "positive": r["positive"],
                      **{f"negative_{k}": r[f"negative_{k}"] for k in range(1, config.num_negatives + 1)}}
                     for r in theirs])


def test_mine_cli_and_finetune_embed_reads_the_negatives(encoder_dir, tmp_path, capsys):
    from bertkit.tasks.embed import read_pairs

    out = tmp_path / "mined.tsv"
    assert main(["mine", "--model", str(encoder_dir / "model"), "--pairs", str(encoder_dir / "pairs.csv"),
                 "--corpus", str(encoder_dir / "corpus.txt"), "--out", str(out), "--num-negatives", "2",
                 "--device", "cpu"]) in (0, None)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["rows"] == 10 and out.read_text().splitlines()[0] == "anchor\tpositive\tnegative_1\tnegative_2"
    rows = read_pairs(out)
    assert len(rows) == 10 and all(len(r.negatives) == 2 for r in rows)
    one = read_pairs(out, negative="negative_2")
    assert [r.negatives for r in one] == [(r.negatives[1],) for r in rows]
    both = read_pairs(out, negative="negative_2,negative_1")
    assert [r.negatives for r in both] == [r.negatives[::-1] for r in rows]
    assert main(["mine", "--model", str(encoder_dir / "model"), "--pairs", str(encoder_dir / "pairs.csv"),
                 "--out", str(tmp_path / "x.tsv"), "--range-min", "5", "--range-max", "6"]) != 0
    assert "leaves fewer than num_negatives" in capsys.readouterr().err


def test_mine_through_a_running_server_equals_the_directory(encoder_dir, tmp_path):
    pytest.importorskip("starlette")
    from bertkit.serve import Engine, ServeConfig, create_app

    app = create_app(Engine(encoder_dir / "model"), ServeConfig(max_wait_ms=1))
    config = MineConfig(num_negatives=2, range_min=1, batch_size=7, device="cpu")
    with uvicorn_in_thread(app) as port:
        mine_hard_negatives(f"http://127.0.0.1:{port}", encoder_dir / "pairs.csv", tmp_path / "served.jsonl",
                            encoder_dir / "corpus.txt", config)
    mine_hard_negatives(encoder_dir / "model", encoder_dir / "pairs.csv", tmp_path / "local.jsonl",
                        encoder_dir / "corpus.txt", config)
    assert (tmp_path / "served.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()
    with pytest.raises(ValueError, match="no server answers"):
        mine_hard_negatives(f"http://127.0.0.1:{port}", encoder_dir / "pairs.csv", tmp_path / "x.jsonl",
                            encoder_dir / "corpus.txt", config)
    assert not (tmp_path / "x.jsonl").exists()


# ---- cross-encoder rescoring -----------------------------------------------------------------------------------

def test_rescore_ranks_by_the_new_scores_and_takes_the_lowest_positive():
    from bertkit.mine import rescore

    queries, corpus = ["q0", "q1"], ["a", "b", "c", "d"]
    table = {("q0", "a"): 0.2, ("q0", "b"): 0.9, ("q0", "c"): 0.5, ("q0", "d"): 0.7,
             ("q1", "a"): 0.4, ("q1", "b"): 0.4, ("q1", "c"): 0.1, ("q1", "d"): 0.8}
    calls = []

    def score(pairs):
        calls.append(len(pairs))
        return [table[p] for p in pairs]

    indices = np.array([[0, 1, 2, -1], [3, 1, 0, 2]])
    scores, order, low = rescore(score, queries, corpus, indices, [[1, 3], [3]])
    assert calls == [3 + 4 + 2 + 1]  # every candidate and positive, in one call
    assert order.tolist() == [[1, 2, 0, -1], [3, 1, 0, 2]]  # best first; the tie (b, a at 0.4) keeps its order
    np.testing.assert_array_equal(scores, np.array([[0.9, 0.5, 0.2, -np.inf], [0.8, 0.4, 0.4, 0.1]], np.float32))
    assert low == [pytest.approx(0.7), pytest.approx(0.8)]


@pytest.fixture(scope="module")
def reranker_dir(encoder_dir):
    """A tiny untrained reranker on the encoder's vocabulary, initialised wide (std 0.3) so that its scores spread
    (0.30-0.89, quartiles 0.57-0.73 on random pairs of these words; at BERT's 0.02 they all round to 0.499)."""
    from bertkit import BertForSequenceClassification

    tokenizer = WordPieceTokenizer.train(texts=[" ".join(WORDS)] * 3, vocab_size=90, min_frequency=1,
                                         show_progress=False)
    torch.manual_seed(1)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, initializer_range=0.3)
    model = BertForSequenceClassification(config, num_labels=1, labels=None, regression=True)
    model.save_pretrained(encoder_dir / "reranker", tokenizer)
    return encoder_dir / "reranker"


@pytest.mark.parametrize("options", [dict(num_negatives=2, margin=0.05, range_max=20),
                                     dict(num_negatives=2, max_score=0.6, range_min=1, range_max=15),
                                     dict(num_negatives=3, relative_margin=0.1, range_max=24)])
def test_mine_with_a_cross_encoder_equals_sentence_transformers(encoder_dir, reranker_dir, tmp_path, options):
    from bertkit.tasks.finetune import predict

    config = MineConfig(**options, cross_encoder=str(reranker_dir), device="cpu")
    report = mine_hard_negatives(encoder_dir / "model", encoder_dir / "pairs.csv", tmp_path / "mined.jsonl",
                                 encoder_dir / "corpus.txt", config)
    ours = [json.loads(line) for line in (tmp_path / "mined.jsonl").read_text().splitlines()]
    assert report["cross_encoder"] == str(reranker_dir) and report["rows"] == len(ours) > 0
    # the rule holds on the reranker's own scores: every negative is kept by the margins and the max score
    for row in ours:
        negatives = [row[f"negative_{k}"] for k in range(1, config.num_negatives + 1)]
        scored = [r["score"] for r in predict(reranker_dir, "rerank", [(row["anchor"], t) for t in
                                                                      [row["positive"], *negatives]])]
        assert scored[1:] == sorted(scored[1:], reverse=True)  # best first by the reranker
        for s in scored[1:]:
            assert config.margin is None or s + config.margin <= scored[0]
            assert config.relative_margin is None or s <= scored[0] - abs(scored[0]) * config.relative_margin
            assert config.max_score is None or s <= config.max_score
    assert _by_pair(ours) == _sentence_transformers_mined(encoder_dir, config, reranker_dir)


def test_reranker_scores_in_blocks_are_predict_rerank_s(reranker_dir):
    from bertkit.mine import reranker_scores
    from bertkit.tasks.finetune import predict

    rng = np.random.default_rng(3)
    pairs = [(" ".join(rng.choice(WORDS, 3)), " ".join(rng.choice(WORDS, 7))) for _ in range(11)]
    expected = [r["score"] for r in predict(reranker_dir, "rerank", pairs)]
    got = reranker_scores(reranker_dir, 4, "cpu", block=3)(pairs)  # blocks of 3 pairs, batches of 4
    # other batches pad to other widths, which moves float32 sums: measured up to 1.4e-7
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert len(got) == len(pairs)


def test_mine_cross_encoder_must_be_a_directory(encoder_dir, tmp_path, capsys):
    assert main(["mine", "--model", str(encoder_dir / "model"), "--pairs", str(encoder_dir / "pairs.csv"),
                 "--out", str(tmp_path / "x.tsv"), "--cross-encoder", str(tmp_path / "nowhere"), "--margin",
                 "0.1"]) != 0
    assert f"--cross-encoder {tmp_path / 'nowhere'}: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "x.tsv").exists()
