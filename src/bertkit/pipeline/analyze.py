"""What a trained model does inside, measured on text: `layer_distances`, the ALBERT paper's "equilibrium" figure.

Lan et al. (2019, section 3.1, figure 1) compare BERT-large and ALBERT-large by how far each layer moves its input:
for every layer l, the L2 distance and the cosine similarity (as an angle) between the layer's input and output
embeddings. ALBERT's transitions from layer to layer are much smoother than BERT's, which the paper reads as weight
sharing stabilising the network's parameters; neither distance falls to 0, so ALBERT's layers do not reach a
fixed point.

Here, per token t of every text (special tokens included, padding excluded) and layer l = 1..L, with h_0 the
embedding output (after ALBERT's E -> H projection) and h_l layer l's output:

    l2              = ||h_l(t) - h_{l-1}(t)||_2
    cosine_distance = 1 - cos(h_{l-1}(t), h_l(t))
    angle_degrees   = arccos(cos(h_{l-1}(t), h_l(t))) in degrees (the paper's y axis for the cosine panel)

each averaged over the tokens. `analyze_layers` (`bertkit analyze layers`) prints them, writes them as JSON and
draws them with `bertkit.pipeline.plots.plot_layer_distances`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import DataError
from bertkit.features import extract_features
from bertkit.io import atomic_write, writer_lock
from bertkit.models import ModelDir
from bertkit.pipeline.plots import plot_layer_distances


def read_texts(path: str | os.PathLike) -> list[str]:
    """The non-blank lines of a UTF-8 text file (one text per line), stripped; DataError naming the file when it
    holds none or is not UTF-8, FileNotFoundError when it is absent."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such input file (one text per line)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start})") from None
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise DataError(f"{path}: no text in it (one text per line; blank lines are skipped)")
    return texts


def distances(states: Sequence[np.ndarray]) -> dict[str, list[float]]:
    """Per-layer distances from hidden states.

    Args:
        states: one float array (T_i, L + 1, H) per text: its T_i tokens' embedding output and L layer outputs.
    Returns:
        {"l2", "cosine_distance", "angle_degrees"}: L floats each, layer 1 first, means over all the tokens.
    """
    stacked = np.concatenate([np.asarray(s, dtype=np.float64) for s in states], axis=0)  # (N, L + 1, H)
    x, y = stacked[:, :-1], stacked[:, 1:]  # each layer's input and output, (N, L, H)
    l2 = np.linalg.norm(y - x, axis=-1)
    norms = np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1)
    cos = np.clip((x * y).sum(-1) / np.maximum(norms, 1e-12), -1.0, 1.0)
    return {"l2": l2.mean(0).tolist(), "cosine_distance": (1.0 - cos).mean(0).tolist(),
            "angle_degrees": np.degrees(np.arccos(cos)).mean(0).tolist()}


def layer_distances(model_dir: str | os.PathLike, texts: Sequence[str], max_seq_length: int = 128,
                    batch_size: int = 32, device: str = "cpu") -> dict[str, Any]:
    """The per-layer distances (see the module docstring) of the encoder in `model_dir` on `texts`.

    Returns {"model": model_dir, "model_type", "layers": L, "tokens": tokens measured, "l2": [...],
    "cosine_distance": [...], "angle_degrees": [...]} (lists of L floats, layer 1 first).
    """
    if not texts:
        raise ValueError("layer_distances needs at least one text")
    directory = ModelDir.open(model_dir)
    model, tokenizer = directory.load("encoder"), directory.tokenizer()
    config = model.config
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers")
    states, _ = extract_features(model, texts, layers=list(range(n_layers + 1)), combine="none",
                                 batch_size=batch_size, max_seq_length=max_seq_length, tokenizer=tokenizer,
                                 device=device)
    if states[0].shape[1] != n_layers + 1:  # an architecture whose hidden states are not embeddings + L layers
        raise ValueError(f"{model_dir}: {states[0].shape[1]} hidden states for {n_layers} layers")
    result = {"model": str(model_dir), "model_type": getattr(config, "model_type", None), "layers": n_layers,
              "tokens": int(sum(s.shape[0] for s in states))}
    result.update(distances(states))
    for key in ("l2", "cosine_distance", "angle_degrees"):
        if not all(math.isfinite(v) for v in result[key]):
            raise ValueError(f"{model_dir}: the model's hidden states are not finite")
    return result


def format_table(results: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """A plain-text table: one row per layer, L2 and cosine distance (and angle) per model."""
    header = ["layer"] + [f"{name} {what}" for name in names for what in ("L2", "cos dist", "angle")]
    rows = [header]
    for layer in range(max(r["layers"] for r in results)):
        row = [str(layer + 1)]
        for r in results:
            if layer < r["layers"]:
                row += [f"{r['l2'][layer]:.3f}", f"{r['cosine_distance'][layer]:.4f}",
                        f"{r['angle_degrees'][layer]:.1f}"]
            else:
                row += ["", "", ""]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def default_names(model_dirs: Sequence[str | os.PathLike]) -> list[str]:
    """A legend name per model directory: its folder name, or the run's for a run's `model` folder."""
    names = []
    for d in model_dirs:
        path = Path(d).resolve()
        names.append(path.parent.name if path.name == "model" and path.parent.name else path.name)
    return names


def analyze_layers(model_dirs: Sequence[str | os.PathLike], input_path: str | os.PathLike,
                   out_dir: str | os.PathLike | None = None, names: Sequence[str] | None = None,
                   max_seq_length: int = 128, batch_size: int = 32, device: str = "cpu") -> dict[str, Any]:
    """`layer_distances` of each model on the texts of `input_path` (one per line).

    With `out_dir` (locked while written), writes out_dir/layers.json ({"texts": n, "models": [result, ...]}, each
    result with its "name") and out_dir/layers.png (`bertkit.pipeline.plots.plot_layer_distances`). Returns the JSON's
    content, with "table" (`format_table`) and, when written, "files".
    """
    if not model_dirs:
        raise ValueError("--model: give at least one model directory")
    names = list(names) if names else default_names(model_dirs)
    if len(names) != len(model_dirs):
        raise ValueError(f"--name: {len(names)} names for {len(model_dirs)} models; give one name per --model")
    texts = read_texts(input_path)
    results = []
    for name, model_dir in zip(names, model_dirs):
        results.append({"name": name, **layer_distances(model_dir, texts, max_seq_length, batch_size, device)})
    report: dict[str, Any] = {"input": str(input_path), "texts": len(texts), "max_seq_length": max_seq_length,
                              "models": results}
    table = format_table(results, names)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with writer_lock(out):
            atomic_write(out / "layers.json", json.dumps(report, indent=2) + "\n")
            png = plot_layer_distances(results, names, out / "layers.png")
        report["files"] = [str(out / "layers.json"), str(png)]
    report["table"] = table
    return report
