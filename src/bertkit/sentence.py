"""The sentence-transformers directory format: how an embedding model turns token vectors into one vector.

A sentence-transformers directory is a model directory plus a pipeline of modules listed in `modules.json`:

    modules.json                 [{"idx", "name", "path", "type"}, ...] in order: Transformer, Pooling, (Dense...),
                                 (Normalize)
    sentence_bert_config.json    the Transformer module: max_seq_length, do_lower_case
    1_Pooling/config.json        the pooling mode(s): legacy booleans `pooling_mode_cls_token`, ... (what TEI and
                                 sentence-transformers 2.x read) or sentence-transformers 5+'s `pooling_mode`
    2_Dense/config.json          in_features, out_features, bias, activation_function; weights in
                                 2_Dense/model.safetensors (`linear.weight`, `linear.bias`)
    2_Normalize/                 L2 normalisation (no settings)
    config_sentence_transformers.json   prompts, default_prompt_name, similarity_fn_name; bertkit adds
                                 `matryoshka_dims` (the prefixes an embedding was trained to keep; sentence-
                                 transformers reads the keys it knows and passes over this one)

`read_sentence_config` reads such a directory into a `SentenceConfig`; `sentence_files` gives the files that
describe one, written by `bertkit.models.pooling.SentenceEncoder.save_pretrained` beside the weights in the
legacy spelling every reader understands (sentence-transformers 2.x to 6.x and text-embeddings-inference read
`pooling_mode_*`; 5+ also reads `pooling_mode`, which is written too). A plain model directory (no modules.json)
has no sentence configuration: the caller chooses (sentence-transformers itself guesses mean pooling, without
normalisation).

Long inputs (`window_spans`, `combine_windows`): a text longer than the model's length is cut into overlapping
windows of pieces, each framed by the special tokens and encoded as its own row; its vector is the mean of the
windows' vectors weighted by their pieces (renormalised when the model normalises), or one vector per window.

Floor: beside checkpoint.py (json and numpy, no torch): the pooling itself is `bertkit.models.pooling`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bertkit.config import CONFIG_NAME
from bertkit.io import read_json, read_json_object

MODULES_FILE = "modules.json"
# sentence-transformers' pooling modes, in the order it concatenates several of them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Our short names for the command line and the server -> sentence-transformers' mode names.
POOLING_NAMES = {"cls": "cls", "mean": "mean", "max": "max", "last": "lasttoken", "lasttoken": "lasttoken",
                 "weighted-mean": "weightedmean", "weightedmean": "weightedmean",
                 "mean-sqrt-len": "mean_sqrt_len_tokens", "mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
_LEGACY_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
                "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
# Dense activations we compute (sentence-transformers stores the class path); anything else is refused.
ACTIVATIONS = {"torch.nn.modules.activation.Tanh": "tanh", "torch.nn.modules.linear.Identity": "identity",
               "torch.nn.Tanh": "tanh", "torch.nn.Identity": "identity"}
_ACTIVATION_PATHS = {"tanh": "torch.nn.modules.activation.Tanh", "identity": "torch.nn.modules.linear.Identity"}


@dataclass(frozen=True)
class DenseSpec:
    """One Dense module: a linear map of the sentence vector, then its activation."""

    path: str  # its folder inside the model directory ("2_Dense")
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "tanh"  # tanh or identity


@dataclass(frozen=True)
class SentenceConfig:
    """How an embedding model pools: what modules.json and its modules' files say."""

    modes: tuple[str, ...] = ("mean",)  # pooling modes (POOLING_MODES), concatenated in that order when several
    normalize: bool = False  # L2-normalise the sentence vector (a Normalize module)
    max_seq_length: int | None = None  # tokens per input (sentence_bert_config.json); None: the model's positions
    do_lower_case: bool = False  # sentence_bert_config.json: lower-case before tokenising (the tokenizer decides)
    include_prompt: bool = True  # the pooling counts a prompt's tokens
    dense: tuple[DenseSpec, ...] = ()  # Dense modules after the pooling, in order
    prompts: dict[str, str] = field(default_factory=dict)  # name -> prefix text (query, document, ...)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    matryoshka_dims: tuple[int, ...] = ()  # prefixes of the vector trained to stand alone (largest first)

    def __post_init__(self) -> None:
        if not self.modes:
            raise ValueError("SentenceConfig.modes: give at least one pooling mode")
        for mode in self.modes:
            if mode not in POOLING_MODES:
                raise ValueError(f"unknown pooling mode {mode!r}; choose one of {', '.join(POOLING_MODES)}")
        if any(not isinstance(d, int) or d < 1 for d in self.matryoshka_dims):
            raise ValueError(f"matryoshka_dims must be positive integers, got {self.matryoshka_dims!r}")
        if self.max_seq_length is not None and self.max_seq_length < 1:
            raise ValueError(f"max_seq_length must be positive, got {self.max_seq_length}")

    @property
    def pooling(self) -> str:
        """The pooling modes as one string ("mean", "cls+max")."""
        return "+".join(self.modes)


def pooling_modes(name: str) -> tuple[str, ...]:
    """"mean", "cls", "last", "max", "weighted-mean", "mean-sqrt-len" (or sentence-transformers' own spelling),
    several joined by "+" -> sentence-transformers' mode names in its concatenation order; ValueError otherwise."""
    modes = []
    for part in str(name).split("+"):
        if part.strip() not in POOLING_NAMES:
            raise ValueError(f"unknown pooling {part.strip()!r}; choose one of cls, mean, max, last, weighted-mean, "
                             f"mean-sqrt-len (several joined by +)")
        modes.append(POOLING_NAMES[part.strip()])
    return tuple(m for m in POOLING_MODES if m in modes)


def _module_kind(entry: dict, where: str) -> str:
    """transformer / pooling / dense / normalize from a modules.json type, in any sentence-transformers version's
    spelling ("sentence_transformers.models.Pooling", "...sentence_transformer.modules.pooling.Pooling")."""
    kind = str(entry.get("type", "")).rsplit(".", 1)[-1].lower()
    if kind in ("transformer", "pooling", "dense", "normalize"):
        return kind
    raise ValueError(f"{where}: module {entry.get('type')!r} is not supported; bertkit reads Transformer, Pooling, "
                     f"Dense and Normalize modules")


def _pooling_from(raw: dict) -> tuple[tuple[str, ...], bool]:
    """(modes, include_prompt) from a 1_Pooling/config.json of any version."""
    if "pooling_mode" in raw:
        given = raw["pooling_mode"]
        modes = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    else:
        modes = tuple(mode for mode, key in _LEGACY_KEYS.items() if raw.get(key)) or ("mean",)
    return tuple(m for m in POOLING_MODES if m in modes) or modes, bool(raw.get("include_prompt", True))


def read_sentence_config(directory: str | os.PathLike) -> SentenceConfig | None:
    """The sentence configuration of a sentence-transformers directory; None without modules.json.

    Raises ValueError naming the file for a module bertkit does not compute (a CNN, an LSTM, a Dense layer with
    another activation than tanh or identity), a Transformer that is not the first module, or a broken file.
    """
    directory = Path(directory)
    modules_path = directory / MODULES_FILE
    if not modules_path.is_file():
        return None
    modules = read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{modules_path}: expected a list of module objects")
    modules = sorted(modules, key=lambda m: m.get("idx", 0))
    kinds = [_module_kind(m, str(modules_path)) for m in modules]
    if not kinds or kinds[0] != "transformer" or kinds.count("transformer") != 1:
        raise ValueError(f"{modules_path}: bertkit reads one Transformer module, first (got {kinds})")
    values: dict[str, Any] = {}
    st_config = directory / "sentence_bert_config.json"
    if st_config.is_file():
        raw = read_json_object(st_config)
        if raw.get("max_seq_length") is not None:
            values["max_seq_length"] = int(raw["max_seq_length"])
        values["do_lower_case"] = bool(raw.get("do_lower_case", False))
    tokenizer_config = directory / "tokenizer_config.json"
    if values.get("max_seq_length") is None and tokenizer_config.is_file():
        # sentence-transformers 5+ keeps the length as the tokenizer's model_max_length instead
        limit = read_json_object(tokenizer_config).get("model_max_length")
        if isinstance(limit, int) and 0 < limit < 1_000_000:
            values["max_seq_length"] = limit
    dense = []
    for entry, kind in zip(modules[1:], kinds[1:]):
        folder = directory / str(entry.get("path", ""))
        if kind == "pooling":
            if "modes" in values:
                raise ValueError(f"{modules_path}: more than one Pooling module")
            raw = read_json_object(folder / CONFIG_NAME) if (folder / CONFIG_NAME).is_file() else {}
            values["modes"], values["include_prompt"] = _pooling_from(raw)
        elif kind == "normalize":
            values["normalize"] = True
        elif kind == "dense":
            raw = read_json_object(folder / CONFIG_NAME)
            name = raw.get("activation_function", "torch.nn.modules.activation.Tanh")
            if name not in ACTIVATIONS:
                raise ValueError(f"{folder / CONFIG_NAME}: Dense activation {name!r} is not supported; bertkit "
                                 f"computes {', '.join(sorted(set(ACTIVATIONS.values())))}")
            dense.append(DenseSpec(str(entry.get("path")), int(raw["in_features"]), int(raw["out_features"]),
                                   bool(raw.get("bias", True)), ACTIVATIONS[name]))
        else:
            raise ValueError(f"{modules_path}: a second Transformer module is not supported")
        if kind != "normalize" and values.get("normalize"):
            raise ValueError(f"{modules_path}: a {kind} module after Normalize is not supported")
    values["dense"] = tuple(dense)
    extra = directory / "config_sentence_transformers.json"
    if extra.is_file():
        raw = read_json_object(extra)
        values["prompts"] = {str(k): str(v) for k, v in (raw.get("prompts") or {}).items()}
        values["default_prompt_name"] = raw.get("default_prompt_name")
        values["similarity_fn_name"] = raw.get("similarity_fn_name") or "cosine"
        dims = raw.get("matryoshka_dims") or []
        if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise ValueError(f"{extra}: matryoshka_dims must be a list of integers, got {dims!r}")
        values["matryoshka_dims"] = tuple(sorted(dims, reverse=True))
    try:
        return SentenceConfig(**values)
    except ValueError as err:
        raise ValueError(f"{directory}: {err}") from None


def sentence_files(config: SentenceConfig, hidden_size: int) -> dict[str, bytes]:
    """The files (relative path -> content) that describe `config` in a model directory of width `hidden_size`;
    the Dense weights are the caller's (`{path}/model.safetensors`)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    pooling: dict[str, Any] = {"word_embedding_dimension": hidden_size,
                               **{key: mode in config.modes for mode, key in _LEGACY_KEYS.items()},
                               "include_prompt": config.include_prompt}
    files: dict[str, Any] = {"1_Pooling/config.json": pooling}
    for spec in config.dense:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": spec.path,
                        "type": "sentence_transformers.models.Dense"})
        files[f"{spec.path}/config.json"] = {
            "in_features": spec.in_features, "out_features": spec.out_features, "bias": spec.bias,
            "activation_function": _ACTIVATION_PATHS[spec.activation]}
    if config.normalize:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        files[f"{modules[-1]['path']}/config.json"] = {}
    files["modules.json"] = modules
    st: dict[str, Any] = {"do_lower_case": config.do_lower_case}
    if config.max_seq_length is not None:
        st["max_seq_length"] = config.max_seq_length
    files["sentence_bert_config.json"] = st
    files["config_sentence_transformers.json"] = {
        "prompts": dict(config.prompts), "default_prompt_name": config.default_prompt_name,
        "similarity_fn_name": config.similarity_fn_name, "model_type": "SentenceTransformer",
        **({"matryoshka_dims": list(config.matryoshka_dims)} if config.matryoshka_dims else {})}
    return {path: (json.dumps(value, indent=2) + "\n").encode("utf-8") for path, value in files.items()}


def window_spans(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) piece ranges covering a text of `n` pieces with windows of at most `size` pieces whose starts
    are `stride` apart; the last window ends at n (it starts where the one before it plus stride, so the windows
    overlap by size - stride, and the last may be shorter). A text of at most `size` pieces is one window (0, n);
    an empty text one empty window."""
    if size < 1 or not 1 <= stride <= size:
        raise ValueError(f"window {size} and stride {stride}: need 1 <= stride <= window")
    spans = [(0, min(n, size))]
    while spans[-1][1] < n:
        start = spans[-1][0] + stride
        spans.append((start, min(n, start + size)))
    return spans


def combine_windows(vectors: np.ndarray, weights, normalize: bool) -> np.ndarray:
    """One vector (D,) float32 from the windows' vectors (W, D): their mean weighted by `weights` (W,) (the
    windows' pieces), L2-normalised when `normalize`. One window gives its vector unchanged."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if len(vectors) == 1:
        return vectors[0]
    w = np.asarray(weights, dtype=np.float64)
    x = (vectors.astype(np.float64) * w[:, None]).sum(0) / max(float(w.sum()), 1e-12)
    if normalize:
        x = x / max(float(np.linalg.norm(x)), 1e-12)
    return x.astype(np.float32)


@dataclass(frozen=True)
class Windows:
    """Every text's windows as rows to encode: `encoded[k]` belongs to text `owner[k]`, covers characters
    `chars[k]` = (start, end) of that text (its prompt left out) and holds `pieces[k]` of its pieces."""

    encoded: list
    owner: list[int]
    chars: list[tuple[int, int]]
    pieces: list[int]


def windowed_encodings(tokenizer, texts: Sequence[str], window: int, stride: int, prompt: str = "") -> Windows:
    """Each text (after `prompt`) as overlapping windows of at most `window` tokens, special tokens included, whose
    starts are `stride` pieces apart (`bertkit.sentence.window_spans`). A text that fits in one window is encoded
    exactly as `tokenizer.encode(prompt + text)`; a longer one repeats the prompt's pieces at the head of every
    window."""
    specials = tokenizer.num_special_tokens()
    head = tokenizer.encode_raw([prompt])[0].ids if prompt else []
    room = window - specials - len(head)
    if room < 1:
        raise ValueError(f"--window {window} leaves no room for text: the special tokens and the prompt take "
                         f"{specials + len(head)}")
    if not 1 <= stride <= room:
        raise ValueError(f"--stride {stride} must be between 1 and the window's text pieces ({room})")
    raw = tokenizer.encode_raw(list(texts))
    whole = tokenizer.encode_batch([prompt + t for t in texts], max_length=None)
    out = Windows([], [], [], [])
    for i, (text, pieces, enc) in enumerate(zip(texts, raw, whole)):
        if len(enc) <= window:  # one window: today's encoding, unchanged
            out.encoded.append(enc), out.owner.append(i), out.chars.append((0, len(text)))
            out.pieces.append(len(pieces.ids))
            continue
        for start, end in window_spans(len(pieces.ids), room, stride):
            ids, types = tokenizer.build_inputs(head + list(pieces.ids[start:end]))
            out.encoded.append(_Row(ids, types)), out.owner.append(i)
            out.chars.append((pieces.offsets[start][0], pieces.offsets[end - 1][1]))
            out.pieces.append(end - start)
    return out


@dataclass
class _Row:
    """A window's tokens, as much of an `Encoding` as `length_sorted_batches` reads."""

    input_ids: list[int]
    token_type_ids: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)
