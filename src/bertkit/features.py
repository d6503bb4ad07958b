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

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save as save_arrays
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors
from torch import nn

from bertkit.checkpoint import LEGACY_WEIGHTS_NAME, WEIGHTS_NAME, load_state_strict
from bertkit.config import CONFIG_NAME, ConfigFile
from bertkit.io import atomic_write
from bertkit.models import ElmoModel, ModelDir, TaskOutput
from bertkit.models.layouts import host_copy
from bertkit.models.pooling import SentenceEncoder
from bertkit.models.registry import architecture_of
from bertkit.sentence import combine_windows, pooling_modes, windowed_encodings
from bertkit.tasks.run import collate
from bertkit.tokenizers.word import BILM_OPTIONS, BILM_WEIGHTS, apply_words

COMBINE = ("concat", "sum", "none")


def load_encoder(model_dir):
    """The encoder of any model directory (pretraining, task or bare; a path or a `ModelDir`), with its pooler when
    the weights have one; an ELMo directory gives its `ElmoModel` (the softmax left out)."""
    return ModelDir.open(model_dir).load("encoder")


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
                     tokenizer=None, device: str = "cpu", words: str | None = None,
                     stateful: bool = False) -> tuple[list[np.ndarray], list[list[str]]]:
    """Per-token features of every text, framed by its tokenizer (`[CLS] text [SEP]`, RoBERTa's `<s> text </s>`,
    T5's `text </s>`), truncated to max_seq_length. A T5 directory gives its encoder's hidden states (embeddings,
    then every layer, the last after the final norm, as transformers' T5EncoderModel gives them).

    Args:
        model_dir: a model directory (with its tokenizer, of any kind `bertkit.tokenizers.load_tokenizer` reads), or
            a loaded BertModel together with `tokenizer`.
        texts: N strings; an empty one gives the two special tokens.
        layers: indices into (embeddings, layer 1, ..., layer L); see the module docstring.
        combine: "concat", "sum" or "none".
        words: ELMo only: how text splits into words, "whitespace" (a released ELMo's default, as bilm-tf reads
            it) or "bert" (BERT's pre-tokenizer, bertkit's own ELMo directories' default); None: the tokenizer's.
        stateful: ELMo only: read the texts as one stream, batch_size at a time in the order given, each LSTM
            state carried from a batch's row b to the next batch's row b (bilm-tf's and AllenNLP's way; see
            `bertkit.models.elmo.ElmoModel`); False: every batch from zeros, batches sorted by length.
    Returns:
        (features, tokens): features[i] is a float32 array (T_i, D) ((T_i, len(layers), H) for "none") for the
        T_i tokens of text i, special tokens included; tokens[i] are those tokens' strings.
    """
    if isinstance(model_dir, torch.nn.Module):
        model = model_dir
        if tokenizer is None:
            raise ValueError("extract_features needs a tokenizer when given a loaded model")
    else:
        directory = ModelDir.open(model_dir)
        tokenizer = tokenizer or directory.tokenizer()  # an ELMo's with open vocabulary
        model = directory.load("encoder")
    elmo = getattr(tokenizer, "kind", None) == "word"
    apply_words(tokenizer, words)
    if elmo:
        tokenizer.open_vocabulary = True  # unknown words keep their spelling for the character encoder
    elif stateful:
        raise ValueError(f"--stateful is ELMo's (it carries LSTM states); this model's tokenizer is "
                         f"{getattr(tokenizer, 'kind', type(tokenizer).__name__)}")
    if not layers:
        raise ValueError("choose at least one layer")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    model.to(device).eval()
    T = min(max_seq_length, getattr(model.config, "max_length", max_seq_length))  # T5: relative positions, no limit
    encoded = tokenizer.encode_batch(list(texts), max_length=T)
    features: list[np.ndarray | None] = [None] * len(encoded)
    if elmo:
        model.stateful = stateful
        model.reset_states()
    for chosen, ids, mask, types in length_sorted_batches(encoded, batch_size, tokenizer.pad_id, sort=not stateful):
        hidden = encoder_hidden_states(model, ids.to(device), mask.to(device), types.to(device), tokenizer)
        combined = combine_layers(hidden, layers, combine).float().cpu().numpy()
        for row, i in enumerate(chosen):
            features[i] = combined[row, :len(encoded[i])]
    return features, [e.tokens for e in encoded]  # type: ignore[return-value]


def length_sorted_batches(encoded: Sequence, batch_size: int, pad_id: int, sort: bool = True):
    """Batches of encodings sorted by length (similar lengths together: little padding; `sort=False`: in the order
    given). Yields (chosen, ids, mask, types): the encodings' indices in this batch, and (B, T) long tensors padded
    to the batch's longest, with the tokenizer's own segment ids (all 0 for one text, except XLNet's <cls>,
    segment 2)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i])) if sort else list(range(len(encoded)))
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        width = max(len(encoded[i]) for i in chosen)
        ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
        mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
        for row, i in enumerate(chosen):
            ids[row, :len(encoded[i])] = torch.tensor(encoded[i].input_ids)
            mask[row, :len(encoded[i])] = 1
            types[row, :len(encoded[i])] = torch.tensor(encoded[i].token_type_ids)
        yield chosen, ids, mask, types


def write_features(path: str | os.PathLike, features: Sequence[np.ndarray], tokens: Sequence[Sequence[str]],
                   layers: Sequence[int] = (), combine: str = "") -> list[Path]:
    """Write features in the format the suffix names (.safetensors, .npz, .npy); returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens_json = json.dumps([list(t) for t in tokens], ensure_ascii=False)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        arrays = {f"line_{i}": np.ascontiguousarray(f, dtype=np.float32) for i, f in enumerate(features)}
        # Bytes through atomic_write, not safetensors' save_file: a plain open() gives the umask's mode (not 0600).
        atomic_write(path, save_arrays(arrays, metadata={"tokens": tokens_json, "layers": json.dumps(list(layers)),
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


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first `dimensions` components of (N, D) vectors, each made a unit vector again when `normalize`
    (Matryoshka models: a prefix the model was trained to keep); unchanged for None."""
    if dimensions is None:
        return vectors
    if not 1 <= dimensions <= vectors.shape[-1]:
        raise ValueError(f"--dimensions {dimensions} must be between 1 and the model's {vectors.shape[-1]}")
    cut = vectors[..., :dimensions]
    if normalize:
        cut = cut / np.maximum(np.linalg.norm(cut, axis=-1, keepdims=True), 1e-12)
    return np.ascontiguousarray(cut, dtype=np.float32)


@torch.no_grad()
def encode_sentences(model_dir: str | os.PathLike, texts: Sequence[str], pooling: str | None = None,
                     normalize: bool | None = None, batch_size: int = 32, max_seq_length: int | None = None,
                     device: str = "cpu", prompt: str = "", dimensions: int | None = None, window: int | None = None,
                     stride: int | None = None, per_window: bool = False, dtype: torch.dtype = torch.float32):
    """One vector per text, (N, D) float32, as sentence-transformers' `encode` gives it for the directory: its own
    pooling, Dense layers and normalisation (`bertkit.models.pooling.SentenceEncoder`), or `pooling` ("cls",
    "mean", "max", "last", "weighted-mean", "mean-sqrt-len") and `normalize` instead. Texts are cut to
    max_seq_length (default: the directory's sentence-transformers length, else its positions).

    prompt: put before every text (sentence-transformers' prompts). dimensions: keep the first ones, renormalised
    when the model normalises (`truncate_dimensions`). window, stride: long texts as overlapping windows of
    `window` tokens (`windowed_encodings`, stride default half the window's text), all encoded in the same
    batches; a text's vector is the windows' mean weighted by their pieces (`bertkit.sentence.combine_windows`),
    or, with per_window, the result is (vectors (W, D), owner (W,) text index, chars (W, 2) character spans).
    dtype: the model's weights (bf16 / fp16 on a GPU); the vectors come back as float32."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    model = SentenceEncoder.from_pretrained(model_dir, modes=pooling_modes(pooling) if pooling else None,
                                            normalize=normalize).to(device=device, dtype=dtype).eval()
    tokenizer = ModelDir.open(model_dir).tokenizer()
    limit = getattr(model.config, "max_length", 512)
    if window is None:
        if per_window or stride is not None:
            raise ValueError("--per-window and --stride go with --window")
        T = min(max_seq_length or model.sentence.max_seq_length or limit, limit)
        encoded = tokenizer.encode_batch([prompt + t for t in texts], max_length=T)
    else:
        if window > limit:
            raise ValueError(f"--window {window} is more than the model's {limit} positions")
        room = window - tokenizer.num_special_tokens()
        windows = windowed_encodings(tokenizer, texts, window, stride or max(room // 2, 1), prompt)
        encoded = windows.encoded
    out = np.zeros((len(encoded), model.dimension), dtype=np.float32)
    for chosen, ids, mask, types in length_sorted_batches(encoded, batch_size, tokenizer.pad_id):
        out[chosen] = model.embed(ids.to(device), mask.to(device), types.to(device)).float().cpu().numpy()
    normalized = model.sentence.normalize
    if window is not None and per_window:
        return (truncate_dimensions(out, dimensions, normalized), np.asarray(windows.owner, dtype=np.int64),
                np.asarray(windows.chars, dtype=np.int64).reshape(-1, 2))
    if window is not None:
        owner = np.asarray(windows.owner)
        pieces = np.asarray(windows.pieces)
        out = np.stack([combine_windows(out[owner == i], pieces[owner == i], normalized)
                        for i in range(len(texts))]) if len(texts) else out
    return truncate_dimensions(out, dimensions, normalized)


def write_embeddings(path: str | os.PathLike, vectors: np.ndarray, pooling: str = "",
                     windows: tuple[np.ndarray, np.ndarray] | None = None) -> list[Path]:
    """Write (N, D) sentence vectors: .safetensors (tensor "embeddings", metadata "pooling"), .npz ("embeddings")
    or .npy (the array); returns the files written. `windows` (per-window vectors): (text index (N,), character
    spans (N, 2)) written beside them as "text" and "chars" (.safetensors or .npz only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    extra = {} if windows is None else {"text": np.ascontiguousarray(windows[0], dtype=np.int64),
                                        "chars": np.ascontiguousarray(windows[1], dtype=np.int64)}
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        atomic_write(path, save_arrays({"embeddings": vectors, **extra}, metadata={"pooling": pooling}))
    elif suffix == ".npz":
        np.savez(path, embeddings=vectors, **extra)
    elif extra:
        raise ValueError(f"{path}: per-window vectors go to a .safetensors or .npz file (with their text and "
                         f"character spans)")
    elif suffix == ".npy":
        np.save(path, vectors)
    else:
        raise ValueError(f"{path}: write embeddings to a .safetensors, .npz or .npy file")
    return [path]


def read_features(path: str | os.PathLike) -> tuple[list[np.ndarray], list[list[str]]]:
    """Read what `write_features` wrote: (per-text arrays without padding, tokens)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
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


# ------------------------------------------------------------------------------------------------------------------
# Hidden states of any encoder, the scalar mix, and task models on (frozen) encoder layers
# ------------------------------------------------------------------------------------------------------------------
def encoder_hidden_states(encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          token_type_ids: torch.Tensor | None = None, tokenizer=None) -> tuple[torch.Tensor, ...]:
    """Every layer of `encoder` for a batch: (embeddings, layer 1, ..., layer L), each (B, T, H).

    BERT family, ModernBERT: their hidden states; T5: its encoder's (no token types); ELMo: the token layer and each
    biLSTM layer, the word ids spelt in characters by `tokenizer` (a `WordTokenizer`). ValueError naming
    `hidden_states` for an encoder that gives none.
    """
    if isinstance(encoder, ElmoModel):
        if tokenizer is None or not hasattr(tokenizer, "char_ids_of"):
            raise ValueError("an ELMo encoder reads characters: give it its word tokenizer (the model directory's)")
        chars = torch.from_numpy(tokenizer.char_ids_of(input_ids.cpu().numpy())).to(input_ids.device)
        return encoder(chars, attention_mask).hidden_states
    config = getattr(encoder, "config", None)
    name = getattr(config, "model_type", None) or type(encoder).__name__
    # whether the architecture reads segments is its registry row's (T5's encoder takes none); another module: it does
    types = (token_type_ids,) if not isinstance(config, ConfigFile) or architecture_of(config).token_types else ()
    try:
        out = encoder(input_ids, attention_mask, *types, output_hidden_states=True)
    except TypeError:  # a forward without the output_hidden_states switch
        out = None
    hidden = getattr(out, "hidden_states", None)
    if not hidden:
        raise ValueError(f"the {name} encoder gives no hidden_states to read; a feature-based (--frozen) run and a "
                         f"task model on encoder layers need every layer's output")
    return tuple(hidden)


def parse_layers(spec: str | Sequence[int] | None, count: int, what: str = "--layers") -> list[int]:
    """Layer indices from "-1,-2,-3,-4", "all" (None: all) or a list, checked against the `count` hidden states
    (0 = embeddings / ELMo's token layer); ValueError naming `what` and the model's layers otherwise."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return list(range(count))
    if isinstance(spec, str):
        try:
            spec = [int(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{what} {spec!r}: give comma-separated layer indices (e.g. -1,-2,-3,-4) or all") from None
    layers = list(spec)
    if not layers:
        raise ValueError(f"{what}: choose at least one layer")
    for layer in layers:
        if not -count <= layer < count:
            raise ValueError(f"{what}: layer {layer} does not exist: the model has {count - 1} layers above its "
                             f"embeddings (indices {-count}..{count - 1}, 0 = embeddings)")
    return [layer % count for layer in layers]


class ScalarMix(nn.Module):
    """ELMo's task-specific layer weighting: gamma * sum_j softmax(s)_j * h_j over L layers (Peters et al. 2018,
    eq. 1), with s and gamma learned; with `layer_norm` each layer is first normalised over its real tokens (the
    mask) and features, as AllenNLP's ScalarMix does. Works on the layers of any model."""

    def __init__(self, num_layers: int, layer_norm: bool = False) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"a scalar mix needs at least one layer, got {num_layers}")
        self.scalars = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))
        self.layer_norm = layer_norm

    def forward(self, layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """layers: L tensors (B, T, H); mask: (B, T), 1 on real tokens (for the layer norm) -> (B, T, H)."""
        if len(layers) != len(self.scalars):
            raise ValueError(f"this scalar mix weighs {len(self.scalars)} layers, got {len(layers)}")
        weights = torch.softmax(self.scalars, dim=0)
        total = 0.0
        for w, h in zip(weights, layers):
            if self.layer_norm:
                keep = (mask if mask is not None else torch.ones(h.shape[:2], device=h.device)).ne(0)
                keep = keep[..., None].to(h.dtype)
                n = keep.sum() * h.shape[-1]
                mean = (h * keep).sum() / n
                var = (((h - mean) * keep) ** 2).sum() / n
                h = (h - mean) / torch.sqrt(var + 1e-12)
            total = total + w * h
        return self.gamma * total


TASK_MODELS = ("linear", "bilstm", "logistic")
TASK_COMBINE = ("concat", "sum", "scalar-mix")


class FeatureCache:
    """Every layer of a frozen encoder per input, computed once: {key of the input's real ids and token types:
    (T, L, H) float16}. Saved to / loaded from a .safetensors file whose metadata names the encoder (a file made by
    another model is refused)."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.rows: dict[str, torch.Tensor] = {}

    @staticmethod
    def key(ids: torch.Tensor, types: torch.Tensor | None) -> str:
        digest = hashlib.sha1(ids.cpu().numpy().astype(np.int64).tobytes())
        if types is not None:
            digest.update(types.cpu().numpy().astype(np.int64).tobytes())
        return digest.hexdigest()

    def load(self, path: Path) -> None:
        with safe_open(str(path), framework="pt") as handle:
            found = (handle.metadata() or {}).get("encoder")
            if found != self.fingerprint:
                raise ValueError(f"{path}: a feature cache of another encoder ({found}, not {self.fingerprint}); "
                                 f"give another --feature-cache file")
            self.rows.update({k: handle.get_tensor(k) for k in handle.keys()})

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, save_tensors({k: v.contiguous() for k, v in self.rows.items()},
                                metadata={"encoder": self.fingerprint}))


def encoder_fingerprint(model_dir: str | os.PathLike) -> str:
    """What identifies a model directory's encoder for a feature cache: SHA-256 of its config and weights files
    (a released ELMo's options.json and weights.hdf5)."""
    digest = hashlib.sha256()
    for name in (CONFIG_NAME, WEIGHTS_NAME, LEGACY_WEIGHTS_NAME, BILM_OPTIONS, BILM_WEIGHTS):
        path = Path(model_dir) / name
        if path.is_file():
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:24]


class FeatureTaskModel(nn.Module):
    """A task model on an encoder's layers: the chosen layers combined (concat, sum or a scalar mix) -> dropout ->
    an optional 2-layer BiLSTM -> the task head. Answers the task families as their own models do:
    `model(input_ids, attention_mask, token_type_ids).logits`, (B, C) for "sequence" (mean and max over the real
    tokens), (B, T, C) for "token", (B, T, 2) for "qa".

    task_model "logistic" (frozen, "sequence" only): the layers concatenated or summed, no dropout, mean and max
    pooled, standardised by the buffers `feature_mean` and `feature_scale` (the training rows' statistics), then the
    head: a logistic regression that `fit_logistic_head` fits to convergence instead of training. With `pairs` (a
    sentence-pair task: `build_task_model` sets it when the inputs mark a second sentence with token type 1), the
    pooled features also compare the two sentences, as InferSent's and Sentence-BERT's classifiers do: the means u
    and v over each sentence's tokens (token types 0 and 1), |u - v| and u * v beside the mean and max of the pair.

    frozen: the encoder's weights never change (no gradient, eval mode, so no dropout), and its layers are computed
    once per distinct input (`cache`); only the mix, the BiLSTM and the head train. Not frozen: the encoder trains
    with them (the BERT paper's ablation "+ BiLSTM" on a fine-tuned model), and nothing is cached.
    """

    def __init__(self, encoder: nn.Module, tokenizer, role: str, num_labels: int, num_hidden: int, width: int,
                 layers: Sequence[int], combine: str = "scalar-mix", task_model: str = "bilstm",
                 lstm_hidden: int = 256, dropout: float = 0.1, frozen: bool = True, mix_layer_norm: bool = False,
                 cache: FeatureCache | None = None, labels: Sequence[str] | None = None,
                 regression: bool = False, pairs: bool = False) -> None:
        super().__init__()
        if role not in ("sequence", "token", "qa"):
            raise ValueError(f"a task model on encoder layers does {', '.join(('sequence', 'token', 'qa'))} "
                             f"tasks, not {role!r} (multiple choice is fine-tuned whole)")
        if combine not in TASK_COMBINE:
            raise ValueError(f"--combine must be one of {', '.join(TASK_COMBINE)}, got {combine!r}")
        if task_model not in TASK_MODELS:
            raise ValueError(f"--task-model must be one of {', '.join(TASK_MODELS)}, got {task_model!r}")
        logistic = task_model == "logistic"
        if logistic and not frozen:
            raise ValueError("--task-model logistic fits a classifier on a frozen encoder: add --frozen")
        if logistic and (role != "sequence" or regression):
            raise ValueError(f"--task-model logistic fits a classifier (classify, glue classification tasks), not "
                             f"for {'regression' if regression else role + ' tasks'}")
        if logistic and combine == "scalar-mix":
            raise ValueError("--task-model logistic has no mix to learn: --combine concat or sum (default concat)")
        if pairs and not logistic:
            raise ValueError("the sentence-pair features (u, v, |u - v|, u * v) are --task-model logistic's")
        self.encoder, self.tokenizer, self.role, self.frozen = encoder, tokenizer, role, frozen
        self.config = encoder.config
        self.layers = parse_layers(list(layers), num_hidden)
        self.num_hidden, self.combine, self.task_model = num_hidden, combine, task_model
        self.num_labels, self.regression = num_labels, regression
        self.labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        self.settings = {"layers": self.layers, "combine": combine, "task_model": task_model,
                         "lstm_hidden": lstm_hidden, "frozen": frozen, "mix_layer_norm": mix_layer_norm,
                         "role": role, "num_labels": num_labels, "regression": regression, "pairs": pairs}
        self.pairs = pairs
        self.cache = cache if frozen else None
        if frozen:
            for p in self.encoder.parameters():
                p.requires_grad_(False)
            self.encoder.eval()  # from the start: the cache is filled before training begins, without dropout
        self.mix = ScalarMix(len(self.layers), mix_layer_norm) if combine == "scalar-mix" else None
        features = width * len(self.layers) if combine == "concat" else width
        self.dropout = nn.Dropout(0.0 if logistic else dropout)  # a fitted model: nothing to regularise by noise
        self.lstm = (nn.LSTM(features, lstm_hidden, num_layers=2, bidirectional=True, batch_first=True,
                             dropout=dropout) if task_model == "bilstm" else None)
        out = 2 * lstm_hidden if self.lstm is not None else features
        outputs = {"sequence": num_labels, "token": num_labels, "qa": 2}[role]
        pooled = (6 if pairs else 2) * out  # mean and max (and u, v, |u - v|, u * v for pairs)
        self.head = nn.Linear(pooled if role == "sequence" else out, outputs)
        if logistic:  # standardisation of the pooled features: saved with the head, set by fit_logistic_head
            self.register_buffer("feature_mean", torch.zeros(pooled))
            self.register_buffer("feature_scale", torch.ones(pooled))

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.encoder.eval()  # a frozen encoder never drops out: its features are fixed
        return self

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors training changes (mix, BiLSTM, head); with a frozen encoder, all but the encoder's."""
        return {k: v for k, v in self.state_dict().items() if not (self.frozen and k.startswith("encoder."))}

    def all_layers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """(B, T, L, H): every layer of the encoder; from the cache where a row is there (frozen). A frozen encoder's
        layers are read at the cache's float16 precision, cached or not, so that the model answers the same with and
        without its cache (a model directory read back for prediction has none)."""
        if self.cache is None:
            if self.frozen:
                with torch.no_grad():
                    hidden = encoder_hidden_states(self.encoder, input_ids, attention_mask, token_type_ids,
                                                   self.tokenizer)
                return torch.stack(hidden, dim=2).to(torch.float16).float()
            hidden = encoder_hidden_states(self.encoder, input_ids, attention_mask, token_type_ids, self.tokenizer)
            return torch.stack(hidden, dim=2)
        # Lengths and keys from the batch's host copies where the training loop attached them (no device read)
        ids, mask, types = (t if host_copy(t) is None else host_copy(t)
                            for t in (input_ids, attention_mask, token_type_ids))
        lengths = mask.ne(0).sum(-1).tolist()
        keys = [FeatureCache.key(ids[b, :n], None if types is None else types[b, :n]) for b, n in enumerate(lengths)]
        missing = [b for b, k in enumerate(keys) if k not in self.cache.rows]
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            width = max(lengths[b] for b in missing)
            with torch.no_grad():
                hidden = encoder_hidden_states(self.encoder, input_ids[rows, :width], attention_mask[rows, :width],
                                               None if token_type_ids is None else token_type_ids[rows, :width],
                                               self.tokenizer)
            stacked = torch.stack(hidden, dim=2).to(torch.float16).cpu()  # (M, T, L, H)
            for i, b in enumerate(missing):
                self.cache.rows[keys[b]] = stacked[i, :lengths[b]].clone()
        B, T = input_ids.shape
        first = self.cache.rows[keys[0]]
        out = torch.zeros(B, T, *first.shape[1:], dtype=torch.float32)
        for b, k in enumerate(keys):
            out[b, :lengths[b]] = self.cache.rows[k].float()
        device = input_ids.device  # to a GPU from pinned memory: a copy that waits for nothing
        return out.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else out.to(device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.task_features(input_ids, attention_mask, token_type_ids)
        if self.task_model == "logistic":
            x = (x - self.feature_mean) / self.feature_scale
        return TaskOutput(None, self.head(x))  # (B, C), (B, T, C) or (B, T, 2)

    def task_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """What the head reads: (B, 2F) for "sequence" (mean and max over the real tokens, side by side; (B, 6F)
        with `pairs`: then u, v, |u - v|, u * v, u and v the means over the tokens of token type 0 and 1), else
        (B, T, F); F = the combined layers' (or the BiLSTM's) width. Not standardised."""
        chosen = self.all_layers(input_ids, attention_mask, token_type_ids)[:, :, self.layers]  # (B, T, k, H)
        if self.combine == "concat":
            x = chosen.flatten(2)
        elif self.combine == "sum":
            x = chosen.sum(2)
        else:
            x = self.mix(list(chosen.unbind(2)), attention_mask)
        x = self.dropout(x)
        real = attention_mask.ne(0)
        if self.lstm is not None:
            lengths = real.sum(-1).clamp(min=1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            x, _ = self.lstm(packed)
            x, _ = nn.utils.rnn.pad_packed_sequence(x, batch_first=True, total_length=input_ids.shape[1])
            x = self.dropout(x)
        if self.role == "sequence":
            keep = real[..., None].to(x.dtype)
            mean = (x * keep).sum(1) / keep.sum(1).clamp(min=1)
            top = x.masked_fill(~real[..., None], float("-inf")).max(1).values
            if not self.pairs:
                return torch.cat([mean, top], dim=-1)  # (B, 2F)
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            u, v = ((x * side[..., None]).sum(1) / side.sum(1, keepdim=True).clamp(min=1)
                    for side in (real & types.eq(0), real & types.eq(1)))
            return torch.cat([mean, top, u, v, (u - v).abs(), u * v], dim=-1)  # (B, 6F)
        return x

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, directory) -> "FeatureTaskModel":
        """Read back what `save_pretrained` wrote (the encoder directory with task_model.json and .safetensors; a
        path or a `ModelDir`, which reports the settings: the loader of this model lives here, a floor above)."""
        model_dir = ModelDir.open(directory)  # what it holds is read there; the loading of this model is here
        directory, settings = model_dir.path, model_dir.task_model
        if settings is None:
            raise FileNotFoundError(f"{directory}: no task_model.json; not a task model on encoder layers")
        tokenizer = model_dir.tokenizer()
        encoder = model_dir.load("encoder").eval()
        count, width = encoder_shape(encoder, tokenizer)
        model = cls(encoder, tokenizer, settings["role"], settings["num_labels"], count, width, settings["layers"],
                    settings["combine"], settings["task_model"], settings["lstm_hidden"], 0.0, settings["frozen"],
                    settings["mix_layer_norm"], None, settings.get("labels"), settings.get("regression", False),
                    settings.get("pairs", False))
        state = {**{k: v for k, v in model.state_dict().items() if k.startswith("encoder.")},
                 **load_file(str(directory / "task_model.safetensors"))}
        load_state_strict(model, state, source=str(directory / "task_model.safetensors"))
        return model

    def save_pretrained(self, directory: str | os.PathLike, tokenizer=None) -> None:
        """The encoder as a model directory (its config.json and weights, as trained) with the task model beside it:
        task_model.safetensors (mix, BiLSTM, head) and task_model.json (the settings and labels)."""
        directory = Path(directory)
        self.encoder.save_pretrained(directory, tokenizer=tokenizer)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()
                 if not k.startswith("encoder.")}
        atomic_write(directory / "task_model.safetensors", save_tensors(state))
        atomic_write(directory / "task_model.json",
                     json.dumps({**self.settings, "labels": self.labels}, indent=2) + "\n")


def build_task_model(model_dir: str | os.PathLike, tokenizer, role: str, config, num_labels: int = 2,
                     labels: Sequence[str] | None = None, regression: bool = False,
                     train_inputs: Sequence[dict] = ()) -> tuple[FeatureTaskModel, dict]:
    """The task model a `bertkit finetune --frozen` (or `--task-model bilstm`) run trains on `model_dir`'s encoder,
    from a FinetuneConfig's frozen, layers, combine, task_model, lstm_hidden, mix_layer_norm, feature_cache and
    dropout (combine: `config.layer_combine`, its default resolved). `train_inputs`: the inputs whose layers are
    cached at once (training and dev); with --task-model logistic, a token type 1 among them (a sentence pair) turns
    the pair features on. Returns (model, facts for results.json: encoder and cache timings, "pair_features")."""
    encoder = load_encoder(model_dir)
    count, width = encoder_shape(encoder, tokenizer)
    # Frozen: every layer by default (ELMo's scalar mix of all of them); trained with the encoder: its last layer.
    layers = parse_layers(config.layers if config.layers is not None else ("all" if config.frozen else "-1"), count)
    facts: dict[str, Any] = {"encoder_layers": count, "layers": layers, "combine": config.layer_combine,
                             "task_model": config.task_model, "frozen": config.frozen,
                             "encoder_parameters": sum(p.numel() for p in encoder.parameters())}
    cache = None
    if config.frozen and (config.feature_cache or "memory") != "off":
        cache = FeatureCache(encoder_fingerprint(model_dir))
        path = None if (config.feature_cache or "memory") == "memory" else Path(config.feature_cache)
        if path is not None and path.is_file():
            started = time.perf_counter()
            cache.load(path)
            facts["feature_cache_load_s"] = round(time.perf_counter() - started, 3)
        facts["feature_cache"] = str(path) if path else "memory"
    # A logistic regression on a sentence-pair task compares the two sentences (the inputs mark the second one).
    pairs = config.task_model == "logistic" and any(1 in f.get("token_type_ids", ()) for f in train_inputs)
    facts["pair_features"] = pairs
    model = FeatureTaskModel(encoder, tokenizer, role, num_labels, count, width, layers, config.layer_combine,
                             config.task_model, config.lstm_hidden,
                             0.1 if config.dropout is None else config.dropout, config.frozen,
                             config.mix_layer_norm, cache, labels, regression, pairs)
    if cache is not None and train_inputs:
        started = time.perf_counter()
        before = len(cache.rows)
        fill_cache(model, train_inputs, tokenizer.pad_id, config.eval_batch_size)
        facts["feature_cache_fill_s"] = round(time.perf_counter() - started, 3)
        facts["feature_cache_rows_computed"] = len(cache.rows) - before
        if path is not None and len(cache.rows) > before:
            cache.save(path)
    if isinstance(encoder, ElmoModel):
        facts["char_stats"] = dict(getattr(tokenizer, "char_stats", {}))
    return model, facts


@torch.no_grad()
def encoder_shape(encoder, tokenizer) -> tuple[int, int]:
    """(number of hidden states, their width) of an encoder, from a one-token probe."""
    probe = torch.tensor([[tokenizer.cls_id if tokenizer.cls_id is not None else 0]])
    was_training = encoder.training
    hidden = encoder_hidden_states(encoder.eval(), probe, torch.ones_like(probe), torch.zeros_like(probe), tokenizer)
    encoder.train(was_training)
    return len(hidden), hidden[0].shape[-1]


def _by_length(inputs: Sequence[dict], pad_id: int, batch_size: int):
    """(indices, collated batch of their input_ids / token_type_ids / attention_mask) over `inputs`, batched by
    length (little padding)."""
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]["input_ids"]))
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        yield chosen, collate([{k: inputs[i][k] for k in ("input_ids", "token_type_ids")} for i in chosen], pad_id)


@torch.no_grad()
def fill_cache(model: FeatureTaskModel, inputs: Sequence[dict], pad_id: int, batch_size: int) -> None:
    """Run the frozen encoder once over every distinct input (batched by length) so that training only reads the
    cache."""
    distinct = list({(tuple(x["input_ids"]), tuple(x.get("token_type_ids") or ())): x for x in inputs}.values())
    for _, batch in _by_length(distinct, pad_id, batch_size):
        model.all_layers(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


# ------------------------------------------------------------------------------------------------------------------
# --task-model logistic: a logistic regression on the pooled, standardised layers, fitted to convergence
# ------------------------------------------------------------------------------------------------------------------
def fit_logistic_regression(x: torch.Tensor, y: torch.Tensor, num_classes: int, c: float,
                            weights: torch.Tensor | None = None, tolerance: float = 1e-8,
                            max_iter: int = 20_000) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """An L2-regularised multinomial logistic regression with an unpenalised intercept, fitted by L-BFGS (strong
    Wolfe line search) in float64 from zeros: until the gradient's largest entry is at most tolerance / 100, or until
    a fresh L-BFGS from the point reached lowers it no more (the loss no longer changes in float64, so no line
    search can tell a better point); converged when it is then at most `tolerance`.

    Minimises  sum_i w_i CE(W x_i + b, y_i) / N + k ||W||^2 / (2 C N),  N = sum_i w_i (w_i = 1 without
    `weights`), which is scikit-learn's LogisticRegression(C, penalty="l2") objective (C sum_i w_i CE_i + k ||W||^2
    / 2) divided by C N, so the same minimiser:
        3+ classes: k = 1, scikit-learn's multinomial fit (one row of W per class);
        2 classes:  k = 2, scikit-learn's binary fit with the same C: at the optimum W's two rows are -d/2 and d/2
                    (for a given difference d the penalty is smallest there), so k ||W||^2 / 2 = ||d||^2 / 2 and
                    P(class 1) = sigmoid(d x + b_1 - b_0): scikit-learn's coef_ is d, its intercept_ b_1 - b_0.
    The intercepts sum to 0 (each step moves them by a sum of gradients that add up to 0 over the classes).

    Args:
        x: (n, D) features; y: (n,) int64 labels in [0, num_classes); c: C > 0; weights: (n,) row multiplicities.
    Returns:
        (W (K, D), b (K,)) float64 on the CPU, and facts {"iterations", "evaluations", "loss", "gradient_max"}.
    Raises:
        RuntimeError when the gradient is still above `tolerance` at the end (or after `max_iter` iterations),
        naming C: a large C on separable data converges slowly.
    """
    x = x.detach().to("cpu", torch.float64)
    y = y.detach().to("cpu", torch.long)
    w = torch.ones(len(x), dtype=torch.float64) if weights is None else weights.detach().to("cpu", torch.float64)
    total = w.sum()
    strength = (1.0 if num_classes > 2 else 2.0) / (2.0 * c * total)  # k / (2 C N)
    weight = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    iterations = evaluations = 0
    gradient, loss = float("inf"), torch.zeros(())
    while iterations < max_iter:
        # A fresh L-BFGS from the current point: once the loss stops changing in float64 the line search stalls and
        # L-BFGS ends with the gradient still above the tolerance; a restart drops the stale curvature pairs.
        optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter - iterations,
                                      tolerance_grad=tolerance / 100, tolerance_change=0.0, history_size=20,
                                      line_search_fn="strong_wolfe")

        @torch.enable_grad()  # also when called under no_grad (fit_logistic_head)
        def objective() -> torch.Tensor:
            optimizer.zero_grad()
            ce = nn.functional.cross_entropy(x @ weight.T + bias, y, reduction="none")  # (n,)
            loss = (w * ce).sum() / total + strength * (weight * weight).sum()
            loss.backward()
            return loss

        optimizer.step(objective)
        state = optimizer.state[weight]  # LBFGS keeps its counters under its first parameter
        iterations += int(state.get("n_iter", 0))
        evaluations += int(state.get("func_evals", 0))
        loss = objective().detach()  # and the gradient at the point reached
        before, gradient = gradient, max(float(weight.grad.abs().max()), float(bias.grad.abs().max()))
        if gradient <= tolerance / 100 or not gradient < before:
            break
    if not gradient <= tolerance:
        raise RuntimeError(f"--task-model logistic: L-BFGS did not converge ({iterations} of at most "
                           f"{max_iter} iterations; largest gradient entry {gradient:.2e} > {tolerance:g}); try a "
                           f"smaller --logistic-c (now {c:g})")
    facts = {"iterations": iterations, "evaluations": evaluations,
             "loss": float(loss), "gradient_max": gradient}
    return weight.detach(), bias.detach(), facts


@torch.no_grad()
def fit_logistic_head(model: FeatureTaskModel, features: Sequence[dict], pad_id: int, batch_size: int,
                      c: float) -> dict[str, Any]:
    """Fit a --task-model logistic model's head on the training features, in place: the pooled features of the
    distinct training rows (from the frozen cache), their standardisation (`feature_mean`, `feature_scale`) and
    `fit_logistic_regression`'s weights (float32) in `model.head`.

    Each training row counts once per occurrence; a training set written k times over (every row's count a multiple
    of k, as a file that repeats a label set for passes) fits as the set once: counts are divided by their greatest
    common divisor. Standardisation: each pooled feature's mean and population (ddof 0) standard deviation over the
    rows so counted; a feature constant within float32 rounding (deviation below 1e-6 x max(1, |mean|)) keeps scale 1,
    as scikit-learn's StandardScaler keeps a constant feature unscaled. Deterministic (CPU float64 fit).
    Returns facts for results.json: rows, distinct_rows, repeats (the divisor), C, iterations, evaluations, loss,
    gradient_max, fit_s.
    """
    if model.task_model != "logistic":
        raise ValueError(f"fit_logistic_head fits a --task-model logistic model, not {model.task_model}")
    started = time.perf_counter()
    counts: dict[tuple, int] = {}  # (ids, token types, label) -> occurrences, in order of first occurrence
    for f in features:
        key = (tuple(f["input_ids"]), tuple(f["token_type_ids"]), int(f["label"]))
        counts[key] = counts.get(key, 0) + 1
    rows = [{"input_ids": list(k[0]), "token_type_ids": list(k[1])} for k in counts]
    repeats = math.gcd(*counts.values())
    weights = torch.tensor([n // repeats for n in counts.values()], dtype=torch.float64)
    labels = torch.tensor([k[2] for k in counts], dtype=torch.long)
    model.eval()
    device = model.head.weight.device
    pooled = torch.zeros(len(rows), model.head.in_features, dtype=torch.float64)
    for chosen, batch in _by_length(rows, pad_id, batch_size):
        pooled[chosen] = model.task_features(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                             batch["token_type_ids"].to(device)).double().cpu()
    total = weights.sum()
    mean = (weights[:, None] * pooled).sum(0) / total
    std = ((weights[:, None] * (pooled - mean) ** 2).sum(0) / total).sqrt()
    scale = torch.where(std < 1e-6 * mean.abs().clamp(min=1.0), torch.ones_like(std), std)
    mean32, scale32 = mean.float(), scale.float()  # what the model applies; the fit sees the same standardisation
    standardised = (pooled - mean32.double()) / scale32.double()
    weight, bias, facts = fit_logistic_regression(standardised, labels, model.num_labels, c, weights)
    model.feature_mean.copy_(mean32)
    model.feature_scale.copy_(scale32)
    model.head.weight.copy_(weight.float())
    model.head.bias.copy_(bias.float())
    return {"rows": len(features), "distinct_rows": len(rows), "repeats": repeats, "C": c, **facts,
            "fit_s": round(time.perf_counter() - started, 3)}


# ------------------------------------------------------------------------------------------------------------------
# Contextual vectors of one word in several texts
# ------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def word_similarity(model_dir: str | os.PathLike, word: str, texts: Sequence[str],
                    max_seq_length: int = 512, words: str | None = None) -> dict[str, Any]:
    """The vectors of `word` (its first occurrence, first piece) in each text at every layer, and their pairwise
    cosine similarities per layer: {"word", "texts", "tokens" (the token used in each text), "layers": [{"layer",
    "cosine": N x N, "identical": whether the vectors are exactly equal}]}. ValueError naming the text where the
    word does not occur. `words`: how an ELMo's text splits into words (see `extract_features`)."""
    directory = ModelDir.open(model_dir)
    tokenizer = directory.tokenizer(words=words)  # an ELMo's with open vocabulary
    encoder = directory.load("encoder").eval()
    positions, tokens, hidden_all = [], [], []
    for i, text in enumerate(texts):
        enc = tokenizer.encode_batch([text], max_length=max_seq_length)[0]
        pos = _word_position(enc, text, word)
        if pos is None:
            raise ValueError(f"--word {word!r} does not occur in text {i + 1} ({text!r})")
        ids = torch.tensor([enc.input_ids])
        hidden = encoder_hidden_states(encoder, ids, torch.ones_like(ids), torch.zeros_like(ids), tokenizer)
        hidden_all.append([h[0, pos].float() for h in hidden])
        tokens.append(enc.tokens[pos])
    n_layers = len(hidden_all[0]) if hidden_all else 0
    result: dict[str, Any] = {"word": word, "texts": list(texts), "tokens": tokens, "layers": []}
    for layer in range(n_layers):
        vectors = torch.stack([h[layer] for h in hidden_all])  # (N, H)
        unit = torch.nn.functional.normalize(vectors, dim=-1)
        result["layers"].append({"layer": layer, "cosine": (unit @ unit.T).tolist(),
                                 "identical": bool(all(torch.equal(vectors[0], v) for v in vectors[1:]))})
    return result


def _word_position(enc, text: str, word: str) -> int | None:
    """Index in an encoding of `text` of the first token of the first whole-word occurrence of `word`
    (case-insensitive), None when absent or cut off."""
    match = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, flags=re.IGNORECASE)
    if match is None:
        return None
    for i, (seq, (start, end)) in enumerate(zip(enc.sequence_ids, enc.offsets)):
        if seq == 0 and start <= match.start() < max(end, start + 1):
            return i
    return None
