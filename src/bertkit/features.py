"""Feature-based use of BERT: per-token vectors from chosen hidden layers, without fine-tuning.

The BERT paper (section 5.3, table 7) feeds the activations of a frozen BERT to a task model; for CoNLL NER the
concatenation of the last four hidden layers is within 0.3 F1 of fine-tuning the whole model. `extract_features`
returns those vectors for every token of every text; `write_features` / `read_features` store them.

Layers are indices into (embedding output, layer 1, ..., layer L), Python style: 0 is the embedding output, -1 the
last layer, so (-1, -2, -3, -4) are the last four. `combine`:
    concat  (T, len(layers) * H)  the layers side by side, in the order given
    sum     (T, H)                their sum
    none    (T, len(layers), H)   kept apart

Files (`bertkit features --out ...`), one entry per input text:
    .safetensors  tensors "line_0", "line_1", ... of shape (T_i, D) float32; metadata "tokens" = JSON list of
                  every text's token list, plus "layers" and "combine"
    .npz          "features" (N, T_max, D) float32 zero-padded, "lengths" (N,) int64, "tokens" = the JSON string
    .npy          the padded (N, T_max, D) float32 array; the lengths beside it in NAME.lengths.npy and the tokens
                  in NAME.tokens.json
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bertkit.io import atomic_write

COMBINE = ("concat", "sum", "none")


def load_encoder(model_dir: str | os.PathLike):
    """The encoder of any model directory (pretraining, task or bare), with its pooler when the weights have one."""
    from bertkit.checkpoint import WeightsMismatchError
    from bertkit.models import model_class

    encoder = model_class(model_dir, "encoder")  # BertModel, or the architecture's own (ModernBertModel)
    try:
        return encoder.from_pretrained(model_dir)
    except WeightsMismatchError as err:
        if not any(name.startswith("pooler.") for name in err.missing):
            raise
        return encoder.from_pretrained(model_dir, add_pooler=False)  # token-classification and QA models


def combine_layers(hidden_states: Sequence[torch.Tensor], layers: Sequence[int], combine: str) -> torch.Tensor:
    """(B, T, H) hidden states of the chosen layers -> (B, T, D) (concat, sum) or (B, T, len(layers), H) (none)."""
    if combine not in COMBINE:
        raise ValueError(f"combine must be one of {', '.join(COMBINE)}, got {combine!r}")
    n = len(hidden_states)
    for layer in layers:
        if not -n <= layer < n:
            raise ValueError(f"layer {layer} does not exist: the model has {n - 1} layers (indices {-n}..{n - 1}, "
                             f"0 = embeddings)")
    chosen = [hidden_states[layer] for layer in layers]
    if combine == "concat":
        return torch.cat(chosen, dim=-1)
    if combine == "sum":
        return torch.stack(chosen, dim=0).sum(dim=0)
    return torch.stack(chosen, dim=2)


@torch.no_grad()
def extract_features(model_dir, texts: Sequence[str], layers: Sequence[int] = (-1, -2, -3, -4),
                     combine: str = "concat", batch_size: int = 32, max_seq_length: int = 512,
                     tokenizer=None, device: str = "cpu") -> tuple[list[np.ndarray], list[list[str]]]:
    """Per-token features of every text, framed by its tokenizer (`[CLS] text [SEP]`, RoBERTa's `<s> text </s>`,
    T5's `text </s>`), truncated to max_seq_length. A T5 directory gives its encoder's hidden states (embeddings,
    then every layer, the last after the final norm, as transformers' T5EncoderModel gives them).

    Args:
        model_dir: a model directory (with its tokenizer, of any kind `bertkit.tokenizers.load_tokenizer` reads), or
            a loaded BertModel together with `tokenizer`.
        texts: N strings; an empty one gives the two special tokens.
        layers: indices into (embeddings, layer 1, ..., layer L); see the module docstring.
        combine: "concat", "sum" or "none".
    Returns:
        (features, tokens): features[i] is a float32 array (T_i, D) ((T_i, len(layers), H) for "none") for the
        T_i tokens of text i, special tokens included; tokens[i] are those tokens' strings.
    """
    from bertkit.tokenizers import load_tokenizer

    if isinstance(model_dir, torch.nn.Module):
        model = model_dir
        if tokenizer is None:
            raise ValueError("extract_features needs a tokenizer when given a loaded model")
    else:
        tokenizer = tokenizer or load_tokenizer(model_dir)
        model = load_encoder(model_dir)
    if not layers:
        raise ValueError("choose at least one layer")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    model.to(device).eval()
    T = min(max_seq_length, getattr(model.config, "max_length", max_seq_length))  # T5: relative positions, no limit
    seq2seq = getattr(model.config, "model_type", None) == "t5"  # T5's encoder takes no token types
    encoded = tokenizer.encode_batch(list(texts), max_length=T)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths together: little padding
    features: list[np.ndarray | None] = [None] * len(encoded)
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        width = max(len(encoded[i]) for i in chosen)
        ids = torch.full((len(chosen), width), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(chosen):
            ids[row, :len(encoded[i])] = torch.tensor(encoded[i].input_ids)
            mask[row, :len(encoded[i])] = 1
        if seq2seq:
            out = model(ids.to(device), mask.to(device), output_hidden_states=True)
        else:
            out = model(ids.to(device), mask.to(device), torch.zeros_like(ids).to(device), output_hidden_states=True)
        combined = combine_layers(out.hidden_states, layers, combine).float().cpu().numpy()
        for row, i in enumerate(chosen):
            features[i] = combined[row, :len(encoded[i])]
    return features, [e.tokens for e in encoded]  # type: ignore[return-value]


def write_features(path: str | os.PathLike, features: Sequence[np.ndarray], tokens: Sequence[Sequence[str]],
                   layers: Sequence[int] = (), combine: str = "") -> list[Path]:
    """Write features in the format the suffix names (.safetensors, .npz, .npy); returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens_json = json.dumps([list(t) for t in tokens], ensure_ascii=False)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors.numpy import save

        arrays = {f"line_{i}": np.ascontiguousarray(f, dtype=np.float32) for i, f in enumerate(features)}
        # Bytes through atomic_write, not safetensors' save_file: a plain open() gives the umask's mode (not 0600).
        atomic_write(path, save(arrays, metadata={"tokens": tokens_json, "layers": json.dumps(list(layers)),
                                                  "combine": combine, "count": str(len(features))}))
        return [path]
    if suffix not in (".npz", ".npy"):
        raise ValueError(f"{path}: write features to a .safetensors, .npz or .npy file")
    lengths = np.array([len(f) for f in features], dtype=np.int64)
    inner = features[0].shape[1:] if features else (0,)
    padded = np.zeros((len(features), int(lengths.max(initial=0)), *inner), dtype=np.float32)
    for i, f in enumerate(features):
        padded[i, :len(f)] = f
    if suffix == ".npz":
        np.savez(path, features=padded, lengths=lengths, tokens=np.array(tokens_json))
        return [path]
    stem = path.with_suffix("")
    lengths_path, tokens_path = Path(f"{stem}.lengths.npy"), Path(f"{stem}.tokens.json")
    np.save(path, padded)
    np.save(lengths_path, lengths)
    tokens_path.write_text(tokens_json + "\n", encoding="utf-8")
    return [path, lengths_path, tokens_path]


def read_features(path: str | os.PathLike) -> tuple[list[np.ndarray], list[list[str]]]:
    """Read what `write_features` wrote: (per-text arrays without padding, tokens)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            count = int(metadata.get("count", len(list(handle.keys()))))
            features = [handle.get_tensor(f"line_{i}") for i in range(count)]
        return features, json.loads(metadata.get("tokens", "[]"))
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            padded, lengths, tokens = data["features"], data["lengths"], json.loads(str(data["tokens"]))
    elif suffix == ".npy":
        stem = path.with_suffix("")
        padded = np.load(path, allow_pickle=False)
        lengths = np.load(f"{stem}.lengths.npy", allow_pickle=False)
        tokens = json.loads(Path(f"{stem}.tokens.json").read_text(encoding="utf-8"))
    else:
        raise ValueError(f"{path}: not a .safetensors, .npz or .npy features file")
    return [padded[i, :n] for i, n in enumerate(lengths.tolist())], tokens
