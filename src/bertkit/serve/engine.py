"""What the server runs: a model directory's task split into "input -> rows", "rows -> outputs" and "outputs ->
answer", so that rows of many requests share one forward pass (`bertkit.serve.batching`).

An `Engine` serves one task of one model directory:

    kind          model                                  an input (JSON)                     its answer
    classify      BertForSequenceClassification          {"text", "pair"?}                   `bertkit predict --json`
    ner           BertForTokenClassification             {"text"}                            (the task families'
    squad         BertForQuestionAnswering               {"question", "context"}             `predictions`)
    swag          BertForMultipleChoice                  {"context", "choices": [...]}
    fill-mask     the pretraining (masked-LM) model      {"text"} with the mask token        `bertkit fill-mask --json`
    embeddings    the encoder of any model directory     {"text"}                            {"tokens", "embedding"}
    generate      a causal model (BertForCausalLM) or    {"text"}: the prompt                `bertkit generate --json`
                  a T5 without a task (T5ForConditionalGeneration)                           (greedy)

For the four task kinds the three steps are the task family's own (`bertkit.tasks`): `prediction_features` makes
the rows (one per input; one per window of a SQuAD passage; one per choice of a multiple-choice input),
`predictions` turns the rows' logits into exactly the objects `bertkit.tasks.finetune.predict` returns, so an answer of
the server equals `predict` on the same input. Every input is prepared and answered on its own (its own family
object, since families keep state between the two calls), so one invalid input yields one error object and never
fails its neighbours.

`forward(rows)` runs one batch: rows of any lengths, padded to the longest and handed to the model, which runs on
the real tokens only (`BertModel`'s unpadded path) with the torch backend; the ONNX backend
(`bertkit.export`) runs the exported padded graph, on rows sorted by length and cut into groups that pad little.

Generation is greedy, as `bertkit generate` at its default temperature 0: a causal model's rows of one prompt
length share `BertForCausalLM.generate` (equal lengths: no padding, each row what it computes alone up to float
rounding, cut after its first separator); a T5's rows are padded and generated together
(`bertkit.tasks.run.generate_all`), as the text-to-text task models are. A row carries its input's max_new_tokens.

Inputs longer than the model's sequence length are truncated as `predict` truncates them (SQuAD passages are
covered by windows; its question is cut to max_query_length), and the answer then carries "truncated": true.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from bertkit.export import open_session
from bertkit.inference import top_candidates
from bertkit.models.modeldir import USES, ModelDir
from bertkit.models.pooling import calibration_batches, load_dense, quantize_int8
from bertkit.sentence import SentenceConfig, combine_windows, pooling_modes, read_sentence_config, windowed_encodings
from bertkit.tasks.base import KINDS, SERVED_KINDS, default_kind, family_for, json_text
from bertkit.tasks.finetune import load_predictor
from bertkit.tasks.run import generate_all

MAX_NEW_TOKENS = 20  # tokens a generation adds at most unless a request says otherwise (`bertkit generate`'s default)
# A request's pooling: "none" (every token's vector), or one of sentence-transformers' modes in our spelling
# (`bertkit.sentence.POOLING_NAMES`); the default is the model directory's own (its 1_Pooling, or mean).
POOLINGS = ("mean", "cls", "max", "last", "weighted-mean", "mean-sqrt-len", "none")

# What one row of a forward pass gives, by the role of the task model (`TaskFamily.model_role`): a vector per
# sequence, a row per token, or one score per choice (each choice its own row).
ROW_OUTPUTS = {"sequence": "sequence", "token": "token", "qa": "token", "choice": "choice"}


def _weighted_mean(x: np.ndarray) -> np.ndarray:
    weights = np.arange(1, len(x) + 1, dtype=np.float32)
    return (x * weights[:, None]).sum(axis=0) / weights.sum()


# Each pooling mode on one text's token vectors (T, H) without padding; any other mode is lasttoken's.
_POOL_TOKENS = {"cls": lambda x: x[0], "max": lambda x: x.max(axis=0), "mean": lambda x: x.sum(axis=0) / len(x),
                "mean_sqrt_len_tokens": lambda x: x.sum(axis=0) / np.sqrt(np.float32(len(x))),
                "weightedmean": _weighted_mean}


def pool_tokens(vectors: np.ndarray, modes: tuple[str, ...]) -> np.ndarray:
    """One text's token vectors (T, H), no padding, pooled as `bertkit.models.pooling.pool` pools a padded row:
    (len(modes) * H,) float32."""
    x = vectors.astype(np.float32, copy=False)
    return np.concatenate([_POOL_TOKENS.get(mode, lambda v: v[-1])(x) for mode in modes])


# Linear layers that --quantize int8 leaves out of int8 (module-name suffixes, `quantize_int8`'s `keep`; computed in
# bf16 where the CPU has bf16 instructions, else fp32): the first three layers' FFN output projections, whose
# inputs carry BERT's largest outlier channels. On all-MiniLM-L6-v2 with 8-bit weights (a CPU with VNNI), batches
# of 4, cosine of int8 to fp32 sentence vectors, min / 1st percentile, over the 3,000 STS-B dev sentences and the
# serving benchmark's 768 SST-2 and WikiText-2 texts (none of them calibration text): two kept in bf16 0.9943 /
# 0.9969 and 0.9901 / 0.9956, three kept 0.9962 / 0.9980 and 0.9916 / 0.9971; with 7-bit weights (no VNNI) and
# two kept in fp32 0.9812 and 0.9872 (a batch shares its activation scale: one text at a time, 8-bit weights, two
# kept in fp32, the minima are 0.9951 and 0.9919). Forward speed over fp32's (CPU time, one thread, 160 of those
# texts in batches of 4, 2-core EPYC Zen 4 with AVX-512 VNNI and BF16, quiet): every Linear int8 2.24x, two kept
# in fp32 1.96x, two in bf16 2.12x, three 2.08x. Command: bench/experiments/int8_cosine.py [--keep ...].
INT8_KEEP = ("layers.0.ffn.down", "layers.1.ffn.down", "layers.2.ffn.down")


def _with_precision(model, device: str, dtype: str, quantize: str | None, calibration=None):
    """The served model in the weights' type asked for: int8 dynamic quantisation (CPU; smoothed on `calibration`
    batches where given), bf16 / fp16 on a GPU ("auto": bf16 where the GPU has it, else fp16; fp32 on a CPU)."""
    if quantize == "int8":
        return quantize_int8(model, keep=INT8_KEEP, calibration=calibration)
    on_gpu = str(device).startswith("cuda")
    if dtype == "auto":
        dtype = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_gpu else "fp32"
    if dtype != "fp32" and not on_gpu:
        raise ValueError(f"--dtype {dtype} is for GPUs; on a CPU serve fp32, or --quantize int8")
    return model.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])


class InputError(ValueError):
    """An input the engine cannot answer (a missing field, a text without the mask token): its answer is an
    error object in its place, the other inputs of the request are answered."""


@dataclass
class Row:
    """One sequence of a forward pass: token ids and types (lists of T ints) and, for fill-mask, the positions of
    the mask tokens."""

    input_ids: list[int]
    token_type_ids: list[int]
    positions: list[int] = field(default_factory=list)
    max_new_tokens: int = 0  # generate: tokens to add at most

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Prepared:
    """An input made ready: its rows and how to turn their outputs into its answer."""

    rows: list[Row]
    finish: Callable[[list[np.ndarray]], dict[str, Any]]  # the rows' outputs, in order -> the answer


# ------------------------------------------------------------------------------------------------------------------
# Backends: padded batches in, one output array per row out
# ------------------------------------------------------------------------------------------------------------------
def pad_rows(rows: list[Row], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, token_type_ids, attention_mask), each (B, T) int64 with T the longest row; padding is pad_id /
    0 / 0."""
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    types = np.zeros((len(rows), T), dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r.input_ids
        types[i, :len(r)] = r.token_type_ids
        mask[i, :len(r)] = 1
    return ids, types, mask


def _split_outputs(layout: str, out: np.ndarray, rows: list[Row]) -> list[np.ndarray]:
    """One output per row from a padded batch's output, as `bertkit.tasks.run.forward_all` cuts them: (C,) per
    sequence, (T_i, C) per token (padding cut off), (1,) per choice; fill-mask: (M_i, V) at the mask positions.
    layout: a value of ROW_OUTPUTS, or a use (fill-mask, embeddings: per token)."""
    if layout in ("sequence", "choice"):
        return [out[i] for i in range(len(rows))]
    if layout == "fill-mask":
        return [out[i, r.positions] for i, r in enumerate(rows)]
    return [out[i, :len(r)] for i, r in enumerate(rows)]


class TorchBackend:
    """The bertkit model itself: padded batches go in, the model runs them on their real tokens only. A
    text-to-text model (T5) generates instead: greedy token ids per row (`bertkit.tasks.run.generate_all`)."""

    name = "torch"

    def __init__(self, kind: str, model, pad_id: int, max_new_tokens: int | None = None,
                 eos_id: int | None = None) -> None:
        # kind: the row layout (a value of ROW_OUTPUTS) of a task model, or a use (fill-mask, embeddings, generate)
        self.kind, self.model, self.pad_id, self.max_new_tokens = kind, model, pad_id, max_new_tokens
        self.eos_id = eos_id  # generate with a causal model: the token that ends a generation
        self.device = next(model.parameters()).device

    def __call__(self, rows: list[Row]) -> list[np.ndarray]:
        if self.kind == "generate":
            with torch.no_grad():
                return self._generate(rows)
        if self.max_new_tokens is not None:
            features = [{"input_ids": r.input_ids, "token_type_ids": r.token_type_ids} for r in rows]
            with torch.no_grad():
                return generate_all(self.model, features, self.pad_id, len(rows), self.max_new_tokens)
        ids, types, mask = (torch.from_numpy(a).to(self.device) for a in pad_rows(rows, self.pad_id))
        with torch.no_grad():
            if self.kind == "choice":  # every choice its own (1-choice) row: choice counts may differ per input
                out = self.model(ids[:, None], mask[:, None], types[:, None]).logits  # (B, 1)
            elif self.kind == "fill-mask":
                at = torch.zeros_like(ids, dtype=torch.bool)  # the vocabulary projection at the masks only
                for i, r in enumerate(rows):
                    at[i, r.positions] = True
                logits = self.model(ids, mask, types, predict_at=at).prediction_logits.float()  # (N, V)
                counts = [len(r.positions) for r in rows]
                return [x.cpu().numpy() for x in torch.split(logits, counts)]
            elif self.kind == "embeddings":
                out = self.model(ids, mask, types).last_hidden_state  # (B, T, H)
            else:
                out = self.model(ids, mask, types).logits
        return _split_outputs(self.kind, out.float().cpu().numpy(), rows)

    def _generate(self, rows: list[Row]) -> list[np.ndarray]:
        """Greedy generations (the new token ids) of the rows; see the module docstring."""
        out: list[np.ndarray | None] = [None] * len(rows)
        groups: dict[tuple[int, int], list[int]] = {}
        causal = bool(getattr(self.model.config, "causal", False))  # else an encoder-decoder (T5)
        for i, r in enumerate(rows):  # causal: one group per (prompt length, max_new_tokens); T5: per max_new_tokens
            groups.setdefault((len(r) if causal else 0, r.max_new_tokens), []).append(i)
        for (length, max_new), chosen in groups.items():
            if not causal:
                features = [{"input_ids": rows[i].input_ids, "token_type_ids": rows[i].token_type_ids} for i in chosen]
                for i, ids in zip(chosen, generate_all(self.model, features, self.pad_id, len(chosen), max_new)):
                    out[i] = ids
                continue
            prompts = torch.tensor([rows[i].input_ids for i in chosen], device=self.device)
            generated = self.model.generate(prompts, max_new, eos_token_id=self.eos_id)[:, length:].cpu().numpy()
            for i, ids in zip(chosen, generated):
                ends = np.flatnonzero(ids == self.eos_id) if self.eos_id is not None else []
                out[i] = ids[:ends[0] + 1] if len(ends) else ids  # alone, it stops after its separator
        return out  # type: ignore[return-value]


class OnnxBackend:
    """An ONNX graph written by `bertkit export onnx`, run by onnxruntime on padded batches.

    The graph computes every padded position, so rows are sorted by length and cut into groups whose padding
    stays small (`max_padding` of the group's real tokens); each group is one run.
    """

    name = "onnx"
    max_padding = 0.25  # a group grows while its padded size stays within (1 + this) x its real tokens

    def __init__(self, kind: str, path: str | os.PathLike, pad_id: int, threads: int | None = None,
                 layout: str | None = None) -> None:
        self.kind, self.pad_id, self.layout = kind, pad_id, layout or kind  # layout: as TorchBackend's kind
        self.session = open_session(path, kind, threads=threads)
        self.inputs = {i.name for i in self.session.get_inputs()}

    def _run(self, rows: list[Row]) -> list[np.ndarray]:
        ids, types, mask = pad_rows(rows, self.pad_id)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        if self.layout == "choice":
            feed = {k: v[:, None] for k, v in feed.items()}  # (B, 1, T): one choice per row
        out = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]
        return _split_outputs(self.layout, np.asarray(out, dtype=np.float32), rows)

    def __call__(self, rows: list[Row]) -> list[np.ndarray]:
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        outputs: list[np.ndarray | None] = [None] * len(rows)
        group: list[int] = []
        real = 0
        for i in order + [-1]:
            n = len(rows[i]) if i >= 0 else 0
            # rows are ascending: the newcomer sets the group's width
            if group and (i < 0 or (len(group) + 1) * n > (1 + self.max_padding) * (real + n) + 16):
                for j, out in zip(group, self._run([rows[j] for j in group])):
                    outputs[j] = out
                group, real = [], 0
            if i >= 0:
                group.append(i)
                real += n
        return outputs  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------------------------
def detect_kind(model_dir: str | os.PathLike) -> str:
    """The kind a model directory serves by default (`bertkit.tasks.base.default_kind`)."""
    return default_kind(ModelDir.open(model_dir))


def _check_options(kind: str | None, backend: str, pooling: str | None, dtype: str, quantize: str | None,
                   device: str, top_k: int | None) -> None:
    """ValueError naming the first of the Engine's options that is not one it takes."""
    if kind is not None and kind not in SERVED_KINDS:
        raise ValueError(f"unknown task {kind!r}; choose one of {', '.join(SERVED_KINDS)}")
    if backend not in ("torch", "onnx"):
        raise ValueError(f"unknown backend {backend!r}; choose torch or onnx")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if dtype not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"unknown dtype {dtype!r}; choose auto, fp32, bf16 or fp16")
    if quantize not in (None, "int8"):
        raise ValueError(f"unknown quantization {quantize!r}; the server quantises to int8")
    if quantize and (backend != "torch" or not str(device).startswith("cpu")):
        raise ValueError("--quantize int8 is for the torch backend on a CPU")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")


class Engine:
    """One model directory's task, ready to serve; see the module docstring.

    Args:
        model_dir: the model directory (weights, config.json, tokenizer files, finetune.json for task models).
        kind: one of SERVED_KINDS; None: `detect_kind`.
        backend: "torch", or "onnx" with `onnx_path` (default MODEL_DIR/model.onnx, written by `bertkit export`).
        max_seq_length: tokens per input (default: as fine-tuned, or the model's positions; never more).
        top_k: the default number of labels (classify), n-best answers (squad; 5) or candidates (fill-mask; 5).
        pooling: embeddings: the default pooling (one of POOLINGS); None: the directory's own (its
            sentence-transformers modules: pooling, Dense layers, normalisation; mean over the tokens, special ones
            included, for a plain directory, as sentence-transformers guesses).
        device: "cpu" or a torch device for the torch backend.
        dtype: torch backend: "auto" (bf16 on a GPU that has it, else fp16 on a GPU, fp32 on a CPU), "fp32",
            "bf16" or "fp16": the weights' type.
        quantize: torch backend on a CPU: "int8" quantises every Linear layer dynamically (int8 weights,
            activations quantised per batch; `bertkit.models.pooling.quantize_int8`).
        words: an ELMo's split of text into words, "whitespace" or "bert" (None: as its tokenizer says).
    """

    def __init__(self, model_dir: str | os.PathLike, kind: str | None = None, *, backend: str = "torch",
                 onnx_path: str | os.PathLike | None = None, max_seq_length: int | None = None,
                 top_k: int | None = None, pooling: str | None = None, device: str = "cpu",
                 threads: int | None = None, dtype: str = "auto", quantize: str | None = None,
                 words: str | None = None) -> None:
        _check_options(kind, backend, pooling, dtype, quantize, device, top_k)
        directory = ModelDir.open(model_dir)
        self.model_dir = directory.path
        self.kind = kind or default_kind(directory)
        self.top_k, self.pooling, self.backend_name = top_k, pooling, backend
        self.device, self.threads = torch.device(device), threads or 1
        self.sentence, self.dense = None, []
        self.predictor = None
        # A task kind's facts (input fields, truncation, row layout) are its family's; a use's are its USES row's.
        self.task = family_for(self.kind) if self.kind in KINDS else None
        self.input_fields = self.task.input_fields if self.task is not None else USES[self.kind].input_fields
        if self.task is not None:
            model = self._load_task(directory, max_seq_length, device, words)
        else:
            model = self._load_use(directory, max_seq_length, device, words)
        if backend == "torch":
            model = self._set_precision(model, device, dtype, quantize)
        self.dtype = "int8" if quantize else {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
            next(model.parameters()).dtype, "fp32")
        self.model_config = model.config
        family = self.predictor.family() if self.predictor is not None else None
        # A text-to-text model (T5 fine-tuned on a task) answers the task's kind by generating its answer.
        self.generates = bool(getattr(family, "generates", False))
        # The label names the answers use (classify, ner; a text-to-text model's from its finetune.json).
        self.labels = None if family is None or getattr(family, "regression", False) else family.labels
        self.backend = self._make_backend(model, family, onnx_path, threads)

    def _load_task(self, directory: ModelDir, max_seq_length: int | None, device: str, words: str | None):
        """A task head: the task family's predictor, as `bertkit predict` loads it; its model."""
        self.predictor = load_predictor(directory, self.kind, max_seq_length=max_seq_length, device=device,
                                        words=words)
        self.tokenizer = self.predictor.tokenizer
        self.max_length = self.predictor.config.seq_length
        return self.predictor.model

    def _load_use(self, directory: ModelDir, max_seq_length: int | None, device: str, words: str | None):
        """A use of the directory without a task head (`bertkit.models.modeldir.USES`): its model, in eval mode on
        `device`; embeddings: the directory's sentence-transformers modules too."""
        self.tokenizer = directory.tokenizer(words=words)
        model = directory.load(self.kind)
        if self.kind == "fill-mask" and self.tokenizer.mask_id is None:
            raise ValueError(f"{self.model_dir}: its tokenizer has no mask token; serve it as embeddings")
        if self.kind == "embeddings":
            self.sentence = read_sentence_config(self.model_dir) or SentenceConfig()
            # the Dense layers as numpy (weight (out, in), bias, activation): applied per answer
            self.dense = [(layer.linear.weight.detach().float().numpy(),
                           None if layer.linear.bias is None else layer.linear.bias.detach().float().numpy(),
                           layer.activation) for layer in load_dense(self.model_dir, self.sentence)]
            if max_seq_length is None and self.sentence.max_seq_length:
                max_seq_length = self.sentence.max_seq_length  # what sentence-transformers cuts inputs to
        model = model.to(device).eval()
        limit = getattr(model.config, "max_length", 512)  # T5's relative positions: 512, its pretraining length
        self.max_length = min(max_seq_length or limit, limit)
        return model

    def _set_precision(self, model, device: str, dtype: str, quantize: str | None):
        """The torch backend's model in the weights' type asked for (`_with_precision`); int8 embeddings of a
        BERT or ModernBERT encoder (an `unpad` switch: forward(input_ids, attention_mask, types)) smoothed on
        calibration batches of the served length."""
        calibration = None
        if quantize and self.kind == "embeddings" and isinstance(getattr(model, "unpad", None), bool):
            calibration = calibration_batches(self.tokenizer, max_length=self.max_length)
        return _with_precision(model, device, dtype, quantize, calibration)

    def _make_backend(self, model, family, onnx_path, threads: int | None) -> Callable[[list[Row]], list[np.ndarray]]:
        """The backend that runs the rows: the model itself (torch) or the exported graph (onnx)."""
        layout = ROW_OUTPUTS[self.task.model_role] if self.task is not None else self.kind
        pad_id = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else 0
        if self.backend_name == "torch":
            if threads:
                torch.set_num_threads(threads)
            self.threads = torch.get_num_threads()  # in all, shared by the forward workers
            return TorchBackend(layout, model, pad_id, family.max_new_tokens if self.generates else None,
                                self.tokenizer.sep_id)
        if self.generates or self.kind == "generate":
            raise ValueError(f"{self.model_dir} generates its answers token by token, which the ONNX backend "
                             f"does not; serve it with the torch backend")
        # The torch model stays loaded: restoring a family for each input reads its labels.
        return OnnxBackend(self.kind, onnx_path or self.model_dir / "model.onnx", pad_id, threads, layout)

    # ---- forward workers -------------------------------------------------------------------------------------
    def default_workers(self) -> int:
        """Forward passes the server runs at once unless told: two for the torch backend on a CPU with two or more
        threads (each pass one thread's share: no waiting for each other inside every operation, and the next batch
        forms while one computes), else one (a GPU runs one pass at a time; onnxruntime shares one thread pool)."""
        on_cpu = self.backend_name == "torch" and self.device.type == "cpu"
        return 2 if on_cpu and self.threads >= 2 else 1

    def worker_initializer(self, workers: int) -> Callable[[], None] | None:
        """What each forward thread runs first: torch backend on a CPU, its share of the threads (at least one)."""
        if self.backend_name != "torch" or self.device.type != "cpu":
            return None
        share = max(1, self.threads // workers)
        return lambda: torch.set_num_threads(share)

    # ---- the three steps -------------------------------------------------------------------------------------
    def prepare(self, item: Any, index: int = 0, top_k: int | None = None, pooling: str | None = None,
                max_new_tokens: int | None = None, normalize: bool | None = None) -> Prepared:
        """Rows and a finisher for one input (a JSON value of the kind's fields; a bare string is {"text": ...}
        where the kind takes a text). Raises InputError for an input it cannot answer."""
        required = self.input_fields[0]
        if isinstance(item, str) and "text" in required:
            item = {"text": item}
        if not isinstance(item, dict):
            raise InputError(f"inputs[{index}] is a {type(item).__name__}; expected an object with "
                             f"{', '.join(required)}")
        top_k = top_k if top_k is not None else self.top_k
        try:  # the input as `predict` takes it: the family's reading of its fields, or a use's one text
            x = self.task.input_from_json(item) if self.task is not None else json_text(item, "text")
        except ValueError as err:
            raise InputError(f"inputs[{index}]: {err}") from None
        if self.task is not None:
            return self._prepare_task(x, top_k)
        if self.kind == "fill-mask":  # the three uses of a directory without a task head: the engine's own
            return self._prepare_fill_mask(x, top_k or 5)
        if self.kind == "embeddings":
            return self._prepare_embeddings(x, pooling or self.pooling, normalize)
        return self._prepare_generate(x, max_new_tokens or MAX_NEW_TOKENS)

    def forward(self, rows: list[Row]) -> list[np.ndarray]:
        """One forward pass over rows of any lengths: one output per row (see `_split_outputs`)."""
        return self.backend(rows)

    # ---- task kinds: the family's features and predictions ---------------------------------------------------
    def _prepare_task(self, x, top_k: int | None) -> Prepared:
        family = self.predictor.family()  # its own: families keep state between features and predictions
        try:
            features = family.prediction_features([x], self.tokenizer)
        except (ValueError, TypeError, KeyError) as err:
            raise InputError(str(err)) from None
        # A text-to-text model frames its inputs its own way (a task prefix): no truncation flag there.
        truncated = not self.generates and family.truncated(x, features, self.tokenizer)
        per_choice = self.task.model_role == "choice" and not self.generates
        if per_choice:  # one row per choice
            rows = [Row(list(ids), list(types)) for ids, types in zip(features[0]["input_ids"],
                                                                      features[0]["token_type_ids"])]
        else:
            rows = [Row(list(f["input_ids"]), list(f["token_type_ids"])) for f in features]

        def finish(outputs: list[np.ndarray]) -> dict[str, Any]:
            logits = [np.concatenate(outputs)] if per_choice else outputs
            answer = family.predictions([x], features, logits, top_k=top_k)[0]
            return {**answer, "truncated": True} if truncated else answer

        return Prepared(rows, finish)

    # ---- fill-mask and embeddings ----------------------------------------------------------------------------
    def _prepare_fill_mask(self, text: str, top_k: int) -> Prepared:
        """As `bertkit.inference.fill_mask`: the text framed and cut to the model's length, candidates for every
        mask token left; the answer is what `bertkit fill-mask --json` prints."""
        tok = self.tokenizer
        enc = tok.encode(text, max_length=self.max_length)
        positions = [i for i, t in enumerate(enc.input_ids) if t == tok.mask_id]
        if not positions:
            raise InputError(f"no {tok.id_to_token(tok.mask_id)} token in {text!r}"
                             + (" (left after truncation)" if text.count(tok.id_to_token(tok.mask_id)) else ""))
        truncated = len(enc) == self.max_length and len(tok.encode(text)) > self.max_length

        def finish(outputs: list[np.ndarray]) -> dict[str, Any]:
            probs = torch.from_numpy(outputs[0]).float().softmax(-1)  # (M, V)
            answer = {"text": text, "predictions": top_candidates(probs, top_k, tok)}
            return {**answer, "truncated": True} if truncated else answer

        return Prepared([Row(enc.input_ids, enc.token_type_ids, positions)], finish)

    def _prepare_embeddings(self, text: str, pooling: str | None, normalize: bool | None = None,
                            encoding=None, truncate: bool = True, window: tuple[int, int] | None = None) -> Prepared:
        """The last layer's vectors of the text's tokens (`bertkit.features.extract_features` with layers=[-1]),
        pooled (`sentence_vector`): {"tokens", "embedding"}, or {"tokens", "token_embeddings"} for "none".
        `encoding`: the text already encoded (a batch encoded at once); truncate False: InputError when the text
        is longer than the model's sequence length, unless `window` = (tokens, stride) covers it with overlapping
        windows (`bertkit.sentence.windowed_encodings`), one row each, pooled into one vector
        (`bertkit.sentence.combine_windows`)."""
        if pooling is not None and pooling not in POOLINGS:
            raise InputError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        enc = encoding if encoding is not None else self.tokenizer.encode(text, max_length=self.max_length)
        truncated = len(enc) == self.max_length and len(self.tokenizer.encode(text)) > self.max_length
        modes = None if pooling in (None, "none") else pooling_modes(pooling)
        if truncated and not truncate and window is not None and pooling != "none":
            return self._prepare_windows(text, modes, normalize, window)
        if truncated and not truncate:
            raise InputError(f"the input has more than {self.max_length} tokens, the model's limit; send a shorter "
                             f"one or set truncate")

        def finish(outputs: list[np.ndarray]) -> dict[str, Any]:
            vectors = outputs[0]  # (T, H)
            answer: dict[str, Any] = {"tokens": enc.tokens}
            if pooling == "none":
                answer["token_embeddings"] = vectors.tolist()
            else:
                answer["embedding"] = self.sentence_vector(vectors, modes, normalize).tolist()
            return {**answer, "truncated": True} if truncated else answer

        return Prepared([Row(enc.input_ids, [0] * len(enc.input_ids))], finish)

    def _prepare_windows(self, text: str, modes, normalize: bool | None, window: tuple[int, int]) -> Prepared:
        """A long text's windows as rows; its answer the windows' vectors pooled into one."""
        size, stride = window
        windows = windowed_encodings(self.tokenizer, [text], size, stride)
        own = modes is None or tuple(modes) == self.sentence.modes
        unit = normalize if normalize is not None else (own and self.sentence.normalize)

        def finish(outputs: list[np.ndarray]) -> dict[str, Any]:
            vectors = np.stack([self.sentence_vector(v, modes, normalize) for v in outputs])
            return {"embedding": combine_windows(vectors, windows.pieces, unit).tolist(), "windows": len(outputs)}

        return Prepared([Row(list(r.input_ids), [0] * len(r)) for r in windows.encoded], finish)

    def sentence_vector(self, vectors: np.ndarray, modes: tuple[str, ...] | None = None,
                        normalize: bool | None = None) -> np.ndarray:
        """One text's vector from its tokens' vectors (T, H) float32: pooled with `modes` (None: the directory's
        pooling, then its Dense layers), then L2-normalised when `normalize` says so (None: when the directory has
        a Normalize module and its own pooling is used)."""
        own = modes is None or tuple(modes) == self.sentence.modes
        x = pool_tokens(vectors, self.sentence.modes if modes is None else modes)
        if own:
            for weight, bias, activation in self.dense:
                x = weight @ x + (bias if bias is not None else 0.0)
                x = np.tanh(x) if activation == "tanh" else x
        elif self.dense:
            raise InputError(f"this model's Dense layers take its own pooling ({self.sentence.pooling}); leave "
                             f"'pooling' out")
        if normalize if normalize is not None else (own and self.sentence.normalize):
            x = x / max(float(np.linalg.norm(x)), 1e-12)
        return x.astype(np.float32)

    def prepare_texts(self, texts: list[Any], pooling: str | None = None, normalize: bool | None = None,
                      truncate: bool = True, window: tuple[int, int] | None = None) -> list[Prepared | str]:
        """Embeddings of many texts, tokenised in one batch: a Prepared per text, or an error message in place of
        a text that cannot be answered (not a string, too long without truncate and without `window`)."""
        good = [i for i, t in enumerate(texts) if isinstance(t, str)]
        encoded = dict(zip(good, self.tokenizer.encode_batch([texts[i] for i in good], max_length=self.max_length)))
        out: list[Prepared | str] = []
        for i, text in enumerate(texts):
            if i not in encoded:
                out.append(f"inputs[{i}] must be a string, got {type(text).__name__}")
                continue
            try:
                out.append(self._prepare_embeddings(text, pooling, normalize, encoded[i], truncate, window))
            except InputError as err:
                out.append(f"inputs[{i}]: {err}")
        return out

    def prepare_rerank(self, query: str, documents: list[str], truncate: bool = True) -> list[Prepared | str]:
        """Scores of (query, document) pairs by the cross-encoder: a Prepared per document whose answer is what
        `bertkit predict rerank` gives the pair ({"score", "logit"}), or an error message in its place."""
        out: list[Prepared | str] = []
        for i, document in enumerate(documents):
            try:
                prepared = self.prepare({"text": query, "pair": document}, i)
            except InputError as err:
                out.append(str(err))
                continue
            if not truncate:
                pair = self.tokenizer.encode_batch([query], [document])[0]
                if len(pair) > self.max_length:
                    out.append(f"documents[{i}]: the query and the document have {len(pair)} tokens, more than the "
                               f"model's {self.max_length}; send a shorter one or set truncate")
                    continue
            out.append(prepared)
        return out

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
        """Every text's tokens as text-embeddings-inference's /tokenize gives them: {"id", "text", "special",
        "start", "stop"} (character offsets into the text; special tokens at (0, 0)), cut to the model's length."""
        out = []
        for enc in self.tokenizer.encode_batch(list(texts), max_length=self.max_length):
            tokens = []
            for j, (i, token) in enumerate(zip(enc.input_ids, enc.tokens)):
                special = enc.sequence_ids[j] is None
                if special and not add_special_tokens:
                    continue
                start, stop = enc.offsets[j] if enc.offsets else (0, 0)
                tokens.append({"id": int(i), "text": token, "special": special, "start": int(start),
                               "stop": int(stop)})
            out.append(tokens)
        return out

    def _prepare_generate(self, text: str, max_new_tokens: int) -> Prepared:
        """As `bertkit.inference.generate` (greedy): a causal model's prompt framed as in training without its
        closing separator, a T5's as T5 frames it (`text </s>`), cut to the model's length; the answer is what
        `bertkit generate --json` prints, {"prompt", "continuation", "ids"}."""
        tok, causal = self.tokenizer, bool(getattr(self.model_config, "causal", False))
        ids = tok.encode(text, max_length=self.max_length).input_ids
        truncated = len(ids) == self.max_length and len(tok.encode(text)) > self.max_length
        if causal:
            ids = ids[:-1]
        pad = self.model_config.pad_token_id

        def finish(outputs: list[np.ndarray]) -> dict[str, Any]:
            new = [int(i) for i in outputs[0]]
            # T5's sentinels stay visible (<extra_id_0> cat ...): they say which span a text fills.
            shown = tok.decode(new) if causal else tok.decode([i for i in new if i != pad], skip_special_tokens=False)
            answer = {"prompt": text, "continuation": shown, "ids": new}
            return {**answer, "truncated": True} if truncated else answer

        return Prepared([Row(ids, [0] * len(ids), max_new_tokens=max_new_tokens)], finish)

    def warm_up(self) -> None:
        """One forward pass on a made-up input, so that one-time set-up costs (kernel choices, allocations) are
        not paid by the first request."""
        if self.task is not None:
            sample = self.task.sample_input
        elif self.kind == "fill-mask":  # the tokenizer's own mask token
            sample = {"text": f"warm {self.tokenizer.id_to_token(self.tokenizer.mask_id)}"}
        else:
            sample = {"text": "warm up"}
        self.forward(self.prepare(sample).rows)

    # ---- description -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What GET /v1/model answers: the kind, its input fields, labels, lengths, backend."""
        required, optional = self.input_fields
        info: dict[str, Any] = {"model": self.model_dir.name, "kind": self.kind, "backend": self.backend_name,
                                "input_fields": {"required": list(required), "optional": list(optional)},
                                "max_seq_length": self.max_length, "model_type": self.model_config.model_type,
                                "hidden_size": getattr(self.model_config, "hidden_size", None)
                                or getattr(self.model_config, "d_model", None)}
        if self.generates:
            info["text_to_text"] = True
        if self.labels is not None:
            info["labels"] = self.labels
        if self.kind == "fill-mask":
            info["mask_token"] = self.tokenizer.id_to_token(self.tokenizer.mask_id)
        if self.task is not None:
            info.update(self.task.served_facts(self.predictor.info))
        if self.kind == "embeddings":
            info["pooling"] = self.pooling or "+".join(self.sentence.modes)
            info["normalize"] = self.sentence.normalize
            info["dimension"] = int(self.dense[-1][0].shape[0]) if self.dense else \
                len(self.sentence.modes) * int(info["hidden_size"] or 0)
        info["dtype"] = self.dtype
        if self.kind == "generate":
            info["max_new_tokens"] = MAX_NEW_TOKENS
        return info


def finite(value: Any) -> Any:
    """A JSON-safe copy of an answer: infinite or NaN floats (a SQuAD 2.0 question with no valid span has infinite
    null odds) become strings "inf", "-inf", "nan", as Python's json would otherwise write invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
