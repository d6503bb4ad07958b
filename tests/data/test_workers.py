"""bertkit.data.workers: a batch crosses from a worker process as one flat array and arrives as it left."""

import torch

from bertkit.data.workers import pack_batch, unpack_batch


def test_packed_batches_arrive_with_their_values_and_dtypes():
    # Integer fields travel narrowed (int8/16/32 by their values) and arrive widened: equal values, equal dtypes
    batch = {"input_ids": torch.tensor([[5, 30000, 2]]), "big": torch.tensor([2**40, -3]),
             "negative": torch.tensor([[-100, 7]]), "int32": torch.tensor([70000], dtype=torch.int32),
             "mask": torch.tensor([True, False]), "float": torch.tensor([0.5, -1.0]),
             "zero_one": torch.tensor([[0.0, 1.0], [1.0, 1.0]]), "minus_zero": torch.tensor([1.0, -0.0]),
             "empty": torch.zeros(0, 3, dtype=torch.int64), "_state": {"group": 3}}
    flat, layout, rest = pack_batch(batch)
    assert [wire for *_, wire in layout] == [torch.int16, torch.int64, torch.int8, torch.int32, torch.bool,
                                             torch.float32, torch.bool, torch.float32, torch.int64]
    out = unpack_batch((flat, layout, rest))
    assert list(out) == list(batch)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):  # equal bit for bit (-0.0 stays -0.0)
            assert out[key].dtype == value.dtype and out[key].shape == value.shape, key
            assert out[key].numpy().tobytes() == value.numpy().tobytes(), key
        else:
            assert out[key] == value
