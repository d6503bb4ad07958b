"""Benchmark: inference with bertkit's BertModel against transformers', on identical weights.

One call is a forward pass of the bare encoder (embeddings, layers, pooler) in eval mode under `torch.no_grad()`,
fp32 (or `--dtype bf16`: autocast on both sides), torch's default thread count, on the same batches as the
pretraining benchmark: `dense` (every row `seq_len` real tokens) and `varlen` (real lengths uniform in
[16, seq_len], padded, attention_mask 0).
bertkit's model is written with `save_pretrained` and loaded by transformers' `from_pretrained` (its default
attention implementation); the outputs are checked to agree before timing.

MFU = model FLOPs / time / measured fp32 matmul peak (same run), with forward FLOPs per real token of a sequence
of real length T:  2 x (non-embedding parameters)  +  4 x L x H x T   (see common.model_flops).

Prints one JSON line per (preset, seq_len, batch kind); ratio = bertkit / transformers sequences/s (> 1: bertkit
is faster).

    python bench/bench_inference.py [--preset mini base] [--seq-len 128 512] [--batch dense varlen]
                                    [--batch-size N] [--iters N] [--warmup N] [--dtype fp32|bf16] [--compile] [--quick]
"""

from __future__ import annotations

import sys

import torch

try:  # `python bench/bench_inference.py` puts bench/ on sys.path; `bench.` when imported from the repo root
    from bench.common import (PeakMeter, add_mfu, batch_size_for, check_same_function, compile_pair, log,
                              make_batch, model_bench_main, model_flops, model_pair, peak_dtype, precision, rates,
                              time_alternating)
except ImportError:
    from common import (PeakMeter, add_mfu, batch_size_for, check_same_function, compile_pair, log, make_batch,
                        model_bench_main, model_flops, model_pair, peak_dtype, precision, rates, time_alternating)

# Rows per batch at seq_len 128 (scaled by 128 / seq_len for longer ones): a call of about a second on 2 CPU cores.
DEFAULT_BATCH_SIZE = {"tiny": 256, "mini": 64, "small": 32, "medium": 16, "base": 8, "large": 4}


@torch.no_grad()
def forward(model: torch.nn.Module, batch, dtype: str = "fp32") -> None:
    with precision(dtype):
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids)


def run(presets, seq_lens, kinds, batch_size, iters, warmup, peak_seconds, seed=0, dtype="fp32",
        compile=False) -> list[dict]:
    """Benchmark every (preset, seq_len, kind); one result dict each, in that order (MFU as in bench_pretrain_step)."""
    meter = PeakMeter(peak_dtype(dtype))
    log(f"measuring the {dtype} matmul peak for {peak_seconds:g} s ...")
    log(f"peak {meter.measure(peak_seconds):.1f} GFLOP/s with {torch.get_num_threads()} threads")
    results = []  # (record, model FLOPs per call)
    for preset in presets:
        config, ours, peer = model_pair(preset, pretraining=False, seed=seed)
        ours.eval(), peer.eval()
        if compile:
            compile_pair(ours, peer)
        for seq_len in seq_lens:
            for kind in kinds:
                rows = batch_size_for(DEFAULT_BATCH_SIZE, preset, seq_len, batch_size)
                batch = make_batch(kind, rows, seq_len, seed=seed, vocab_size=config.vocab_size)
                check_same_function(ours, peer, batch, pretraining=False)
                log(f"inference {preset} T={seq_len} {kind} B={rows}: {warmup} warm-up + {iters} timed rounds")
                times = time_alternating({"transformers": lambda: forward(peer, batch, dtype),
                                          "bertkit": lambda: forward(ours, batch, dtype)}, iters=iters, warmup=warmup)
                record = {"bench": "inference", "preset": preset, "seq_len": seq_len, "batch": kind,
                          "batch_size": rows, "dtype": dtype, "compile": compile}
                record.update(rates(times, rows, "sequences_per_s", "call_s"))
                record.update(rates(times, batch.real_tokens, "tokens_per_s", None))
                record.update(real_tokens=batch.real_tokens, threads=torch.get_num_threads(), iters=iters)
                results.append((record, model_flops(config, batch.lengths, training=False, mlm_head=False)))
                meter.measure(peak_seconds / 4)
        del ours, peer
    return [add_mfu(record, flops, meter.gflops) for record, flops in results]


def main(argv: list[str] | None = None) -> int:
    return model_bench_main(run, __doc__.splitlines()[0], default_iters=7, default_warmup=2, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
