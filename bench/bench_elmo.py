"""Benchmark: one ELMo language-model training step, bertkit's `ElmoLanguageModel` against a plain PyTorch reference
written the obvious way (nn.Embedding + nn.Conv1d + highway + projection, one torch.nn.LSTM per direction and layer
with the backward direction run on `torch.flip`ped input, residual from the second layer on, nn.Linear softmax), on
identical weights and batches.

A step: zero_grad, forward over a window of T + 1 words (the forward LSTMs read words 0..T-1 and predict 1..T, the
backward ones read T..1 and predict T-1..0), the two summed cross-entropies over the full softmax divided by the
word count, backward, AdamW. The losses of both sides are checked to agree before timing; then warm-up and
interleaved timed rounds (bench/common.py `time_alternating`); ratio = bertkit / reference words per second (> 1:
bertkit faster). Rows are full windows (no padding), as the pretraining stream makes them.

    python bench/bench_elmo.py [--preset tiny mini] [--batch-size 32] [--window 20] [--vocab 20000]
                               [--iters 5] [--warmup 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

try:  # `python bench/bench_elmo.py` puts bench/ on sys.path; `bench.` when imported from the repo root
    from bench.common import emit, log, machine, median, time_alternating
except ImportError:
    from common import emit, log, machine, median, time_alternating

from bertkit.config import ElmoConfig
from bertkit.models import ElmoLanguageModel


class ReferenceLM(nn.Module):
    """The same biLM in plain torch modules (its parameters in the order of ElmoLanguageModel's)."""

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.char_vocab_size, config.char_embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(config.char_embedding_dim, n, w) for w, n in config.filters)
        self.highways = nn.ModuleList(nn.Linear(config.cnn_dim, 2 * config.cnn_dim) for _ in range(config.num_highway))
        self.projection = nn.Linear(config.cnn_dim, config.projection_dim)
        proj = config.projection_dim if config.projection_dim < config.lstm_dim else 0

        def lstm() -> nn.LSTM:
            return nn.LSTM(config.projection_dim, config.lstm_dim, batch_first=True, proj_size=proj)

        self.forward_lstms = nn.ModuleList(lstm() for _ in range(config.num_layers))
        self.backward_lstms = nn.ModuleList(lstm() for _ in range(config.num_layers))
        self.softmax = nn.Linear(config.projection_dim, config.vocab_size)

    def tokens(self, chars: torch.Tensor) -> torch.Tensor:
        B, T, W = chars.shape
        x = self.embedding(chars.view(B * T, W)).transpose(1, 2)
        h = F.relu(torch.cat([conv(x).max(-1).values for conv in self.convs], -1))
        for highway in self.highways:
            transform, gate = highway(h).chunk(2, -1)
            gate = torch.sigmoid(gate)
            h = gate * h + (1 - gate) * F.relu(transform)
        return self.projection(h).view(B, T, -1)

    @staticmethod
    def run(lstms: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        for k, lstm in enumerate(lstms):
            out, _ = lstm(x)
            x = out + x if k > 0 else out
        return x

    def forward(self, chars: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        tokens = self.tokens(chars)
        fwd = self.run(self.forward_lstms, tokens[:, :-1])
        bwd = self.run(self.backward_lstms, tokens[:, 1:].flip(1)).flip(1)
        V = self.softmax.out_features
        loss = F.cross_entropy(self.softmax(fwd).reshape(-1, V), ids[:, 1:].reshape(-1), reduction="sum")
        loss = loss + F.cross_entropy(self.softmax(bwd).reshape(-1, V), ids[:, :-1].reshape(-1), reduction="sum")
        return loss / (2 * ids[:, 1:].numel())


def pair(config: ElmoConfig, device: str) -> tuple[ElmoLanguageModel, ReferenceLM]:
    torch.manual_seed(0)
    ours = ElmoLanguageModel(config)
    ref = ReferenceLM(config)
    theirs = list(ref.state_dict().items())
    mine = list(ours.state_dict().items())
    assert len(theirs) == len(mine)
    ref.load_state_dict({name: value for (name, _), (_, value) in zip(theirs, mine)})
    return ours.to(device).train(), ref.to(device).train()


def step_fn(model, loss_of, optimizer):
    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        optimizer.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return float(loss.detach())
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["mini"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=20000)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    for preset in args.preset:
        config = ElmoConfig.preset(preset, vocab_size=args.vocab, dropout=0.0)
        ours, ref = pair(config, args.device)
        g = torch.Generator().manual_seed(1)
        chars = torch.randint(6, config.char_vocab_size, (args.batch_size, args.window + 1,
                                                           config.max_characters), generator=g)
        chars[..., 12:] = 0  # words of up to 10 characters between their marks
        ids = torch.randint(0, args.vocab, (args.batch_size, args.window + 1), generator=g)
        chars, ids = chars.to(args.device), ids.to(args.device)

        def ours_loss() -> torch.Tensor:
            out = ours(chars, ids)
            return (out.forward_loss + out.backward_loss) / (out.forward_count + out.backward_count)

        with torch.no_grad():
            a, b = float(ours_loss()), float(ref(chars, ids))
        assert abs(a - b) < 1e-4 * max(1.0, abs(b)), f"the two models disagree: {a} vs {b}"
        log(f"{preset}: losses agree ({a:.5f}); timing {args.iters} rounds")
        times = time_alternating({
            "bertkit": step_fn(ours, ours_loss, torch.optim.AdamW(ours.parameters(), lr=1e-4)),
            "reference": step_fn(ref, lambda: ref(chars, ids), torch.optim.AdamW(ref.parameters(), lr=1e-4)),
        }, args.iters, args.warmup)
        words = args.batch_size * args.window * 2  # predictions per step, both directions
        t_ours, t_ref = median(times["bertkit"]), median(times["reference"])
        emit({"bench": "elmo_lm_step", "preset": preset, "batch_size": args.batch_size, "window": args.window,
              "vocab": args.vocab, "parameters": sum(p.numel() for p in ours.parameters()),
              "bertkit_predictions_per_s": round(words / t_ours, 1),
              "reference_predictions_per_s": round(words / t_ref, 1), "ratio": round(t_ref / t_ours, 3),
              "ratio_best": round(min(times["reference"]) / min(times["bertkit"]), 3),
              "bertkit_s": round(t_ours, 4), "reference_s": round(t_ref, 4), "device": args.device, **machine()})


if __name__ == "__main__":
    main()
