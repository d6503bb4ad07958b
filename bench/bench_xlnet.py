"""Benchmark: XLNet permutation-LM training steps of bertkit's XLNetLMHeadModel against transformers', on identical
weights and the same permutation batches.

A step is what the trainer does per batch: zero the gradients, forward with the permutation mask and the target
mapping, cross-entropy over the predicted tokens, backward, AdamW step (fused, both sides). bertkit runs it as its
trainer does (`PermutationLMObjective`: the two-stream forward, the loss summed over the targets and divided by
their count); transformers runs `model(input_ids, token_type_ids=..., perm_mask=..., target_mapping=...,
labels=...)` and backpropagates its loss (the same number). Train mode, dropout 0.1 on both sides, fp32, torch's
default thread count. bertkit's model is initialised from a seed, written with `save_pretrained` and loaded by
transformers' `from_pretrained`; the eval-mode logits of both are checked to agree before anything is timed.

Batches are what `bertkit pretrain --objective xlnet` feeds: segments `reuse A <sep> B <sep> <cls>` of S tokens
(`--seq-len`, reuse S/4) with `--num-predict` targets each, laid out, masked and permuted by
`bertkit.data.permutation.plm_example` from random token streams. `--batches` distinct batches are cycled, the same
ones on both sides, alternated bertkit, transformers, bertkit, ... (bench/common.py `time_alternating`).

Prints one JSON line per (preset, seq_len); ratio = bertkit / transformers tokens/s (> 1: bertkit is faster), also
ratio_best from the fastest round of each batch.

    python bench/bench_xlnet.py [--preset mini] [--seq-len 128] [--batch-size N] [--num-predict N] [--batches N]
                                [--iters N] [--warmup N] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
import torch

try:  # `python bench/bench_xlnet.py` puts bench/ on sys.path; `bench.` when imported from the repository root
    from bench.common import emit, log, machine, time_alternating
except ImportError:
    from common import emit, log, machine, time_alternating

VOCAB_SIZE = 32000  # XLNet's released vocabulary
SEP, CLS, FIRST_ID = 4, 3, 9  # XLNet's <sep>, <cls>; ordinary pieces from id 9 on
DEFAULT_BATCH_SIZE = {"tiny": 32, "mini": 16, "small": 8, "base": 4, "large": 2}
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, fused=True)


def make_batches(count: int, rows: int, seq_len: int, num_predict: int, vocab_size: int, seed: int) -> list[dict]:
    """`count` permutation batches of random pieces, as the pretraining stream lays them out."""
    from bertkit.data.permutation import plm_example, split_a_b

    rng = np.random.default_rng(seed)
    reuse = seq_len // 4
    batches = []
    for _ in range(count):
        examples = []
        for _ in range(rows):
            stream = rng.integers(FIRST_ID, vocab_size, 4 * seq_len)
            start = int(rng.integers(0, 2 * seq_len))
            a, b, is_next = split_a_b(stream, start + reuse, seq_len - 3 - reuse, rng)
            starts = rng.random(seq_len) < 0.7
            examples.append(plm_example(stream[start:start + reuse], a, b, is_next, starts, SEP, CLS, num_predict,
                                        rng))
        stack = lambda name: torch.from_numpy(np.stack([getattr(e, name) for e in examples]))  # noqa: E731
        batches.append({"input_ids": stack("input_ids"), "token_type_ids": stack("token_type_ids"),
                        "perm_mask": stack("perm_mask").float(), "target_mapping": stack("target_mapping"),
                        "labels": stack("labels"), "attention_mask": torch.ones(rows, seq_len, dtype=torch.long),
                        "tokens": rows * seq_len})
    return batches


def model_pair(preset: str, vocab_size: int, seed: int):
    """(bertkit XLNetLMHeadModel, transformers' loaded from its directory) of the preset's sizes, dropout 0.1."""
    import transformers

    from bertkit.config import XLNetConfig
    from bertkit.models import XLNetLMHeadModel

    torch.manual_seed(seed)
    ours = XLNetLMHeadModel(XLNetConfig.preset(preset, vocab_size=vocab_size, dropout=0.1))
    with tempfile.TemporaryDirectory() as directory:
        ours.save_pretrained(directory)
        peer = transformers.XLNetLMHeadModel.from_pretrained(directory)
    return ours, peer


def peer_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "perm_mask", "target_mapping")}


def check_same_function(ours, peer, batch: dict, atol: float = 1e-4) -> None:
    """Eval-mode logits of the targets agree (the two are the same model before anything is timed)."""
    ours.eval(), peer.eval()
    with torch.no_grad():
        a = ours(batch["input_ids"], None, batch["token_type_ids"], perm_mask=batch["perm_mask"],
                 target_mapping=batch["target_mapping"]).logits
        b = peer(**peer_inputs(batch), use_mems=False).logits
    keep = batch["labels"] != -100
    diff = float((a[keep] - b[keep]).abs().max())
    if diff > atol:
        raise SystemExit(f"bertkit and transformers disagree before timing: max |logit diff| {diff:.2e}")
    ours.train(), peer.train()


def run(presets: list[str], seq_lens: list[int], batch_size: int | None, num_predict: int | None, count: int,
        iters: int, warmup: int, seed: int, vocab_size: int) -> None:
    from bertkit.training.objectives import PermutationLMObjective

    objective = PermutationLMObjective()
    for preset in presets:
        for seq_len in seq_lens:
            rows = batch_size or max(1, DEFAULT_BATCH_SIZE.get(preset, 4) * 128 // seq_len)
            predict = num_predict or max(1, round(seq_len * 85 / 512))  # the paper's 85 of 512
            ours, peer = model_pair(preset, vocab_size, seed)
            optimizers = {"bertkit": torch.optim.AdamW(ours.parameters(), **ADAMW),
                          "transformers": torch.optim.AdamW(peer.parameters(), **ADAMW)}
            batches = make_batches(count, rows, seq_len, predict, vocab_size, seed)
            check_same_function(ours, peer, batches[0])
            position = {"bertkit": 0, "transformers": 0}

            def step(side: str) -> None:
                batch = batches[position[side] % len(batches)]
                position[side] += 1
                optimizer = optimizers[side]
                optimizer.zero_grad(set_to_none=True)
                if side == "bertkit":
                    out = objective(ours, batch)
                    loss = out["plm_loss"][0] / out["plm_loss"][1]
                else:
                    loss = peer(**peer_inputs(batch), labels=batch["labels"], use_mems=False).loss
                loss.backward()
                optimizer.step()

            log(f"{preset} S={seq_len} P={predict}: {rows} rows x {count} batches, {warmup} warm-up and {iters} "
                f"timed rounds per batch")
            times = time_alternating({"bertkit": lambda: step("bertkit"),
                                      "transformers": lambda: step("transformers")}, iters * count, warmup * count)
            tokens = rows * seq_len * iters * count
            rate = {side: tokens / sum(times[side]) for side in times}
            best = {side: sum(min(times[side][i::count]) for i in range(count)) for side in times}
            emit({"bench": "xlnet_train_step", "preset": preset, "seq_len": seq_len, "num_predict": predict,
                  "batch_size": rows, "batches": count, "dtype": "fp32",
                  "bertkit_tokens_per_s": round(rate["bertkit"], 1),
                  "transformers_tokens_per_s": round(rate["transformers"], 1),
                  "ratio": round(rate["bertkit"] / rate["transformers"], 3),
                  "ratio_best": round(best["transformers"] / best["bertkit"], 3),
                  "iters": iters, "warmup": warmup, **machine()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["mini"], metavar="NAME",
                        help="size presets of bertkit.config.XLNetConfig.preset (default: mini; base is XLNet-Base)")
    parser.add_argument("--seq-len", nargs="+", type=int, default=[128], metavar="S", help="segment length (128)")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: per preset)")
    parser.add_argument("--num-predict", type=int, default=None,
                        help="targets per segment (default: the paper's 85 per 512 tokens)")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, cycled (default 4)")
    parser.add_argument("--iters", type=int, default=None, help="timed rounds per batch and side (default 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds per batch first (default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny preset, 1 timed round, 2 batches")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help=f"vocabulary (default {VOCAB_SIZE})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.preset = ["tiny"] if args.preset == ["mini"] else args.preset
        args.batches = min(args.batches, 2)
    iters = args.iters if args.iters is not None else (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else 1
    if iters < 1 or warmup < 0 or args.batches < 1:
        raise SystemExit("--iters and --batches must be at least 1, --warmup at least 0")
    run(args.preset, args.seq_len, args.batch_size, args.num_predict, args.batches, iters, warmup, args.seed,
        args.vocab_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
