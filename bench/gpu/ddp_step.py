"""Worker of the GPU suite's multi-GPU check: a few pretraining steps through bertkit's trainer, one process per
device under torchrun, each rank training on its own slice of the same global batches.

    python -m torch.distributed.run --standalone --nproc-per-node N bench/gpu/ddp_step.py \\
        --out DIR --device cuda --global-batch 8 [--steps 3]

With N processes the trainer joins the process group (NCCL on GPU, gloo on CPU) and wraps the model in
DistributedDataParallel; every loss is averaged over the global batch, so the per-step losses it writes to
DIR/metrics.jsonl (rank 0) equal those of one process given the whole global batch (`--nproc-per-node 1`).
Float32, dropout off: the two runs then compute the same function, up to the order of float sums.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `bench.gpu`


def main(argv: list[str] | None = None) -> int:
    from bertkit import BertConfig, BertForPreTraining
    from bertkit.training.objectives import MaskedLMObjective
    from bertkit.training.trainer import TrainConfig, train

    from bench.gpu.checks import Cycle, padded_batch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--global-batch", type=int, required=True, help="rows per step over all processes")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {world} processes")
    per_rank = args.global_batch // world
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    batches = []
    for step in range(args.steps):  # the same global batches in every process; this rank's rows of each
        g = torch.Generator().manual_seed(100 + step)
        lengths = tuple(int(n) for n in torch.randint(3, 17, (args.global_batch,), generator=g))
        ids, mask, types, labels, nsp = padded_batch(config, torch.device("cpu"), lengths, T=16, seed=step)
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        batches.append({"input_ids": ids[rows], "attention_mask": mask[rows], "token_type_ids": types[rows],
                        "labels": labels[rows], "next_sentence_label": nsp[rows]})
    torch.manual_seed(0)  # the same initial weights in every process (DDP also broadcasts rank 0's)
    model = BertForPreTraining(config)
    train_config = TrainConfig(max_steps=args.steps, warmup_steps=1, learning_rate=1e-3, progress=False,
                               device=args.device, precision="fp32", log_every=1, save_every=10_000)
    train(model, MaskedLMObjective(pair_task="nsp"), Cycle(batches), train_config, args.out)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
