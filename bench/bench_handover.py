"""What a DataLoader worker's hand-over costs: batches per second from one worker process that yields ready-made
batches, as five tensors (a BERT batch's fields, each its own shared-memory segment) against one tensor holding
the same numbers (one segment, what bertkit's workers hand over since the stream packs each batch).

    python bench/bench_handover.py                      # (16, 128) int64 fields, 3 interleaved rounds of 3 s
    python bench/bench_handover.py --rows 64 --seconds 5 --rounds 5

Making the rows costs nothing here (the worker yields the same tensors again), so the rate is the hand-over's
alone: creating the segments, sending their descriptors over the socket, mapping them in the main process.
Prints one JSON line: the median batches/s of each form over the rounds, every round's figure, and the ratio.
"""
import argparse
import json
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, IterableDataset

FIELDS = 5  # input_ids, token_type_ids, attention_mask, labels, next_sentence_label: the fields of a BERT batch


class ReadyBatches(IterableDataset):
    """An endless stream of the same batch: a dict of FIELDS (rows, length) tensors, or one (FIELDS, rows,
    length) tensor."""

    def __init__(self, rows: int, length: int, packed: bool):
        self.rows, self.length, self.packed = rows, length, packed

    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        block = torch.randint(0, 30522, (FIELDS, self.rows, self.length), generator=generator)
        batch = block if self.packed else {f"field{i}": block[i].clone() for i in range(FIELDS)}
        while True:
            yield batch


def rate(rows: int, length: int, packed: bool, seconds: float) -> float:
    """Batches per second handed over by one worker after its first batch, over `seconds` of wall time."""
    loader = DataLoader(ReadyBatches(rows, length, packed), batch_size=None, num_workers=1, prefetch_factor=4)
    stream = iter(loader)
    next(stream)  # the worker's start is not the hand-over's cost
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(stream)
        count += 1
    elapsed = time.perf_counter() - start
    del stream  # ends the worker
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per form and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (five tensors, then one, each)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = {"five_tensors": [], "one_tensor": []}
    for _ in range(args.rounds):
        rounds["five_tensors"].append(rate(args.rows, args.length, False, args.seconds))
        rounds["one_tensor"].append(rate(args.rows, args.length, True, args.seconds))
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    print(json.dumps({"rows": args.rows, "length": args.length, "fields": FIELDS, "load_average": os.getloadavg(),
                      **{f"{name}_batches_per_s": round(value, 1) for name, value in medians.items()},
                      "rounds": {name: [round(v, 1) for v in values] for name, values in rounds.items()},
                      "one_over_five": round(medians["one_tensor"] / medians["five_tensors"], 2)}))


if __name__ == "__main__":
    main()
