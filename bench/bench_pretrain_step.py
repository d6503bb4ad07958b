"""Benchmark: one full pretraining step of bertkit's BertForPreTraining against transformers', on identical weights.

A step is what a trainer does per batch: zero the gradients, forward with MLM labels and NSP labels, backward,
AdamW step (fused, both sides). bertkit is timed as its trainer runs it ("bertkit", `ratio`): padding dropped
before the encoder (unpadded attention), one fused QKV matmul, the vocabulary projection only at the masked
positions (same loss); and once more with the dense MLM logits transformers computes ("bertkit_dense_mlm",
`ratio_dense_mlm`), to separate the encoder's speed from the head's. Train mode (dropout 0.1 on, as in real
pretraining), fp32 (or `--dtype bf16`: autocast on both sides), torch's default thread count. bertkit's model is
initialised from a seed, written with `save_pretrained` and loaded by transformers' `from_pretrained` (its
default attention implementation); both get the same batch and the same AdamW settings, and their eval-mode
outputs are checked to agree before anything is timed.

Batches (bench/common.py `make_batch`): `dense`, every row `seq_len` real tokens; `varlen`, real lengths
uniform in [16, seq_len] padded to seq_len (attention_mask 0). MLM labels at 15% of the real non-special
positions, random NSP labels. Tokens/s counts real tokens only.

MFU = model FLOPs per step / step time / measured matmul peak of the same dtype (same run), with model FLOPs per
real token of a sequence of real length T:  6 x (non-embedding parameters + H x V)  +  12 x L x H x T
(the MLM decoder H x V is counted at every position, as the dense computation does; see common.model_flops).

Prints one JSON line per (preset, seq_len, batch kind); ratio = bertkit / transformers tokens/s (> 1: bertkit
is faster).

    python bench/bench_pretrain_step.py [--preset mini base] [--seq-len 128 512] [--batch dense varlen]
                                        [--batch-size N] [--iters N] [--warmup N] [--dtype fp32|bf16]
                                        [--compile] [--quick]
"""

from __future__ import annotations

import sys

import torch

from bertkit.models.kernels import linear_choice

try:  # `python bench/bench_pretrain_step.py` puts bench/ on sys.path; `bench.` when imported from the repo root
    from bench.common import (PeakMeter, add_mfu, batch_size_for, check_same_function, compile_pair, log,
                              make_batch, model_bench_main, model_flops, model_pair, peak_dtype, precision, rates,
                              time_alternating)
except ImportError:
    from common import (PeakMeter, add_mfu, batch_size_for, check_same_function, compile_pair, log, make_batch,
                        model_bench_main, model_flops, model_pair, peak_dtype, precision, rates, time_alternating)

# Rows per batch at seq_len 128 (scaled by 128 / seq_len for longer ones): a step of a few seconds on 2 CPU cores,
# with enough tokens that the per-step costs independent of the batch (AdamW over every parameter, the dense
# gradient of the word embeddings) stay a small part of it, as in real pretraining.
DEFAULT_BATCH_SIZE = {"tiny": 64, "mini": 16, "small": 8, "medium": 8, "base": 8, "large": 4}
# The same optimizer on both sides: BERT's AdamW settings, weight decay on every parameter (cost is what matters).
# The fused kernel (one pass over memory per parameter) is what bertkit's trainer uses; both sides get it.
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=True)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch, dtype: str,
               sparse: bool = False) -> None:
    """zero_grad, forward with both pretraining losses, backward, AdamW step: one pretraining step.

    sparse: bertkit's training path, the vocabulary projection only at the masked positions (same loss).
    """
    optimizer.zero_grad(set_to_none=True)
    extra = {"predict_at": batch.labels != -100} if sparse else {}
    with precision(dtype):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    token_type_ids=batch.token_type_ids, labels=batch.labels, next_sentence_label=batch.nsp_labels,
                    **extra)
    out.loss.backward()
    optimizer.step()


def run(presets, seq_lens, kinds, batch_size, iters, warmup, peak_seconds, seed=0, dtype="fp32",
        compile=False) -> list[dict]:
    """Benchmark every (preset, seq_len, kind); one result dict each, in that order.

    The matmul peak is measured for `peak_seconds` first and for a quarter of that after each configuration;
    MFU uses the best of those samples, so every record is completed only at the end.
    """
    meter = PeakMeter(peak_dtype(dtype))
    log(f"measuring the {dtype} matmul peak for {peak_seconds:g} s ...")
    log(f"peak {meter.measure(peak_seconds):.1f} GFLOP/s with {torch.get_num_threads()} threads")
    results = []  # (record, model FLOPs per step)
    for preset in presets:
        config, ours, peer = model_pair(preset, pretraining=True, seed=seed)
        # Before any step: once trained (different dropout draws), the two copies' weights drift apart.
        check_same_function(ours, peer, make_batch("varlen", 2, max(seq_lens), seed=seed), pretraining=True)
        if compile:
            compile_pair(ours, peer)
        optimizers = {"bertkit": torch.optim.AdamW(ours.parameters(), **ADAMW),
                      "transformers": torch.optim.AdamW(peer.parameters(), **ADAMW)}
        ours.train(), peer.train()
        for seq_len in seq_lens:
            for kind in kinds:
                rows = batch_size_for(DEFAULT_BATCH_SIZE, preset, seq_len, batch_size)
                batch = make_batch(kind, rows, seq_len, seed=seed, vocab_size=config.vocab_size)
                log(f"pretrain_step {preset} T={seq_len} {kind} B={rows} {dtype}: {warmup} warm-up + {iters} "
                    f"timed rounds")
                times = time_alternating({
                    "transformers": lambda: train_step(peer, optimizers["transformers"], batch, dtype),
                    "bertkit": lambda: train_step(ours, optimizers["bertkit"], batch, dtype, sparse=True),
                    "bertkit_dense_mlm": lambda: train_step(ours, optimizers["bertkit"], batch, dtype),
                }, iters=iters, warmup=warmup)
                record = {"bench": "pretrain_step", "preset": preset, "seq_len": seq_len, "batch": kind,
                          "batch_size": rows, "dtype": dtype, "compile": compile}
                record.update(rates(times, batch.real_tokens, "tokens_per_s", "step_s"))
                record.update(real_tokens=batch.real_tokens, threads=torch.get_num_threads(), iters=iters,
                              cpu_linear=linear_choice())  # the float32 CPU matmul kernel bertkit chose here
                results.append((record, model_flops(config, batch.lengths, training=True)))
                meter.measure(peak_seconds / 4)
        del ours, peer, optimizers
    return [add_mfu(record, flops, meter.gflops) for record, flops in results]


def main(argv: list[str] | None = None) -> int:
    return model_bench_main(run, __doc__.splitlines()[0], default_iters=5, default_warmup=1, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
