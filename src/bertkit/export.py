"""ONNX export of a model directory's served head: `bertkit export onnx --model DIR --out model.onnx`.

The graph is the model's plain padded path (`set_fast_paths(model, unpad=False, onednn=False)`: the unpadded
layout gathers real tokens by data-dependent indices, which a static graph cannot hold), traced by
`torch.onnx.export(..., dynamo=True)` (torch.export), with dynamic batch and sequence axes (and choices for
multiple choice). What the graph computes, per served kind (`bertkit.tasks.base.SERVED_KINDS`):

    kind         inputs (int64)                                         output (float32)
    classify     input_ids, attention_mask, token_type_ids (B, T)       logits (B, num_labels)
    ner          same                                                    logits (B, T, num_labels)
    squad        same                                                    logits (B, T, 2): start, end
    swag         same, (B, C, T)                                         logits (B, C)
    fill-mask    same                                                    logits (B, T, V)
    embeddings   same                                                    last_hidden_state (B, T, H)

(A family without token types, DistilBERT, has no token_type_ids input.) The file's metadata says which kind it
serves (`bertkit_kind`), so `bertkit serve --backend onnx` refuses a graph of another head.

Families: the BERT family (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT) and ModernBERT, whose padded path (rotary
positions, additive masks for the global and the sliding-window layers) traces as it is once the model reads the
attention mask as a plain 0/1 padding mask (`bertkit.models.bert.exporting`). T5, XLNet and ELMo are refused, in
one line, with the reason the matrix's table gives (`bertkit.tasks.base.REFUSED`: T5, for one, generates token by
token, which takes an encoder graph, a decoder-step graph with its key/value cache, and the search loop outside
ONNX).

Opset 18: the oldest that the torch.export-based exporter writes, so the widest range of runtimes reads the file
(onnxruntime 1.14 and later); nothing in a BERT needs a newer operator (LayerNormalization is opset 17).

`export_onnx` checks the file before returning: onnxruntime's outputs on a batch of rows of different lengths
(padding included) must equal bertkit's own (its default fast paths) within `tolerance` at every real position.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.errors import needs_extra
from bertkit.models import ModelDir, set_fast_paths
from bertkit.tasks.base import KINDS, SERVED_KINDS, default_kind, refusal
from bertkit.tasks.finetune import load_predictor

OPSET = 18
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class _Head(torch.nn.Module):
    """The model with a plain-tensor signature: (input_ids, attention_mask, token_type_ids) -> one tensor."""

    def __init__(self, model: torch.nn.Module, kind: str) -> None:
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids, attention_mask, token_type_ids)
        if self.kind == "embeddings":
            return out.last_hidden_state  # (B, T, H)
        if self.kind == "fill-mask":
            return out.prediction_logits  # (B, T, V)
        return out.logits


def load_for_export(model_dir: str | os.PathLike, kind: str | None = None) -> tuple[torch.nn.Module, str]:
    """(the model directory's model for `kind`, the kind), loaded as the server loads it (`bertkit.serve`)."""
    directory = ModelDir.open(model_dir)
    message = refusal(directory.row.name, "export", "bertkit export onnx")  # bertkit.tasks.base.REFUSED
    if message is not None:
        raise ValueError(f"{message} ({model_dir})")
    kind = kind or default_kind(directory)
    if kind not in SERVED_KINDS:
        raise ValueError(f"unknown task {kind!r}; choose one of {', '.join(SERVED_KINDS)}")
    if kind == "generate":  # the one served kind that is no single graph
        raise ValueError(f"{model_dir}: generation is not exported: it runs token by token, which needs a graph per "
                         f"step and the search loop outside ONNX; serve it with the torch backend, or export its "
                         f"encoder with --task embeddings")
    if kind in KINDS:  # a task head, as `bertkit predict` loads it
        model = load_predictor(directory, kind).model
    else:
        model = directory.load(kind)
    # Which architectures export is their registry rows' (onnx_refusal, refused above); a row added without one is
    # traced, and the family matrix test (every row x export) runs and checks its graph.
    return model.eval(), kind


def _sample(config, kind: str, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(input_ids, attention_mask, token_type_ids) of rows with the given real lengths, padded to the longest;
    (B, 2, T) with two choices per row for swag."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    rows = [(n, c) for n in lengths for c in range(2 if kind == "swag" else 1)]
    ids = torch.full((len(rows), T), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    types = torch.zeros(len(rows), T, dtype=torch.long)
    low = min(config.pad_token_id + 1, config.vocab_size - 1)
    for i, (n, _) in enumerate(rows):
        ids[i, :n] = torch.randint(low, config.vocab_size, (n,), generator=g)
        mask[i, :n] = 1
        if getattr(config, "type_vocab_size", 1) > 1:
            types[i, n // 2:n] = 1
    if kind == "swag":
        shape = (len(lengths), 2, T)
        return ids.view(shape), mask.view(shape), types.view(shape)
    return ids, mask, types


def export_onnx(model_dir: str | os.PathLike, out: str | os.PathLike, kind: str | None = None, *,
                opset: int = OPSET, check: bool = True, tolerance: float = 1e-4) -> dict[str, Any]:
    """Write the ONNX graph of the model directory's `kind` head (None: the kind `bertkit serve` would serve).

    Returns {"out", "kind", "opset", "inputs", "output", "max_abs_diff" (the check's, None without check)}.
    Raises ValueError when the check finds a difference above `tolerance`, or for a family it does not cover.
    """
    try:
        import onnx
    except ModuleNotFoundError as err:
        raise needs_extra(err, "ONNX export needs the onnx and onnxscript packages") from None
    model, kind = load_for_export(model_dir, kind)
    config = model.config
    plain = set_fast_paths(copy.deepcopy(model), unpad=False, onednn=False).requires_grad_(False)
    head = _Head(plain, kind).eval()
    T = config.max_length
    sample = _sample(config, kind, [min(T, 8), min(T, 5)])
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", min=2, max=T)
    axes = {0: batch, 1: torch.export.Dim("choices"), 2: sequence} if kind == "swag" else {0: batch, 1: sequence}
    names = list(INPUT_NAMES)
    output = "last_hidden_state" if kind == "embeddings" else "logits"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on optional packages (torchvision) and versions
        program = torch.onnx.export(head, sample, dynamo=True, input_names=names, output_names=[output],
                                    dynamic_shapes=(axes, axes, axes), opset_version=opset, verbose=False,
                                    optimize=True)
    proto = program.model_proto
    onnx.helper.set_model_props(proto, {"bertkit_kind": kind, "bertkit_model_type": config.model_type,
                                        "bertkit_max_length": str(T)})
    tmp = out.with_name(out.name + ".tmp")
    try:
        onnx.save(proto, str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    inputs = [i.name for i in proto.graph.input]
    result = {"out": str(out), "kind": kind, "opset": opset, "inputs": inputs, "output": output,
              "max_abs_diff": None}
    if check:
        result["max_abs_diff"] = check_onnx(out, model, kind, tolerance=tolerance)
    return result


def open_session(path: str | os.PathLike, kind: str | None = None, threads: int | None = None):
    """An onnxruntime session on an exported file, refusing one whose metadata names another kind than `kind`."""
    try:
        import onnxruntime as ort
    except ModuleNotFoundError as err:
        raise needs_extra(err, "the ONNX backend needs onnxruntime") from None
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ONNX file; write one with `bertkit export onnx --model DIR --out {path}`")
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    exported = session.get_modelmeta().custom_metadata_map.get("bertkit_kind")
    if kind is not None and exported is not None and exported != kind:
        raise ValueError(f"{path} holds a {exported} graph, not {kind}; export the model's {kind} head")
    return session


def check_onnx(path: str | os.PathLike, model: torch.nn.Module, kind: str, tolerance: float = 1e-4,
               lengths: list[int] | None = None) -> float:
    """The largest absolute difference between onnxruntime on the file and bertkit's `model` (its default fast
    paths: unpadded) on rows of different lengths, at the real positions; ValueError above `tolerance`."""
    config = model.config
    T = config.max_length
    lengths = lengths or sorted({min(T, n) for n in (3, 11, 26, 47)})
    ids, mask, types = _sample(config, kind, lengths, seed=1)
    session = open_session(path, kind)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
    with torch.no_grad():
        want = _Head(model, kind).eval()(ids, mask, types).float().numpy()
    if kind in ("ner", "squad", "fill-mask", "embeddings"):  # per token: the real positions only
        real = mask.numpy().astype(bool)
        got, want = got[real], want[real]
    diff = float(np.abs(np.asarray(got, dtype=np.float64) - want).max())
    if not diff <= tolerance:
        raise ValueError(f"{path}: onnxruntime differs from bertkit by {diff:.3g} (more than {tolerance:g}) on rows "
                         f"of lengths {lengths}")
    return diff
