"""The task-family protocol and the registry that maps a fine-tuning kind to the file that implements it.

A task family is everything one kind of task needs between its files on disk and a trained model: reading the
task's files, turning examples into model inputs (the tokenizer's framing, label alignment), which task model to
build (the `BertFor...` class name) and with what labels, the loss, the official evaluation, predictions for new
inputs, and the predictions file. Each family lives in one file of `bertkit.tasks` and registers itself:

    @register("ner")
    class TaggingFamily(TaskFamily): ...

and `family_for("ner")` imports that file and returns the class. Adding a task is one file plus one line in
`TASK_MODULES` below. The drivers (`bertkit.tasks.finetune`, `bertkit.training.distill`, through `bertkit.tasks.run`) only speak
this protocol; running the model is theirs, so families see logits as numpy arrays and import no torch at import
time (the loss imports it when it runs).

The protocol, in the order a fine-tuning run calls it (the `config` is a `bertkit.tasks.run.FinetuneConfig`):

    read(path, training)                      examples (the training file first: it fixes the labels)
    features(examples, tokenizer, training)   model inputs: dicts of token-id lists (see `bertkit.tasks.run.collate`)
    model_kwargs()                            the task model's constructor arguments (labels, regression)
    objective()                               the trainer task: summed loss of a micro-batch
    evaluate(examples, features, logits)      (dev metrics, output for write_predictions); logits as
                                              `bertkit.tasks.run.forward_all` returns them, one per feature
    write_predictions(out_dir, examples, output)   the best epoch's dev predictions in the task's format
    task_info()                               what `predict` needs later, saved as MODEL/finetune.json
and for a fine-tuned model directory:
    restore(info, model)                      labels and settings back from finetune.json and the model
    prediction_features(inputs, tokenizer)    model inputs for `predict`'s inputs
    predictions(inputs, features, logits, top_k)   one dict per input
    evaluate_file(data_path, predictions_path, null_odds_path)   metrics of a predictions file

Tokenizers are used through their common interface only (`bertkit.tokenizers.base`): `encode_batch` for texts
and pairs, `encode_raw` / `encode_words` with the special ids (`cls_id`, `sep_id`, `pad_id`), `pair_separators`
and `pair_type_id` where a family frames its own inputs, so every tokenizer kind works in every family.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.config import config_from_dict
from bertkit.data.readers import MISSING, Table, field
from bertkit.errors import DataError
from bertkit.models.modeldir import SERVED_USES, architecture_role
from bertkit.models.registry import ARCHITECTURES, architecture_of, refused_cells

# kind -> the module whose family registers it: the one line a new task adds here.
TASK_MODULES = {
    "glue": "bertkit.tasks.glue",
    "classify": "bertkit.tasks.classify",
    "ner": "bertkit.tasks.ner",
    "squad": "bertkit.tasks.squad",
    "swag": "bertkit.tasks.swag",
    "embed": "bertkit.tasks.embed",
    "rerank": "bertkit.tasks.rerank",
}
KINDS = tuple(TASK_MODULES)

# kind -> the FinetuneConfig fields (`bertkit.tasks.run`) that only some kinds' runs read: `bertkit finetune KIND`
# offers these and every field that no kind names here (the ones every run reads).
FEATURE_MODEL_OPTIONS = ("frozen", "layers", "combine", "task_model", "lstm_hidden", "mix_layer_norm",
                         "feature_cache")  # a task model on the encoder's layers: sequence, token and span heads
_COLUMNS = ("text_column", "pair_column", "label_column")
TASK_OPTIONS: dict[str, tuple[str, ...]] = {
    "glue": ("task", "lm_weight", "max_target_length", *FEATURE_MODEL_OPTIONS, "logistic_c"),
    "classify": (*_COLUMNS, "regression", "lm_weight", "max_target_length", *FEATURE_MODEL_OPTIONS, "logistic_c"),
    "ner": ("column", "scheme", "tokens_column", "tags_column", *FEATURE_MODEL_OPTIONS),
    "squad": ("doc_stride", "max_query_length", "max_answer_length", "n_best_size", "max_target_length",
              *FEATURE_MODEL_OPTIONS),
    "swag": (),
    "embed": (*_COLUMNS, "negative_column", "min_score", "pooling", "normalize", "scale", "symmetric",
              "mini_batch_size", "gather_negatives", "matryoshka_dims", "window", "stride", "query_prompt",
              "document_prompt"),
    "rerank": (*_COLUMNS, *FEATURE_MODEL_OPTIONS),
}

_REGISTRY: dict[str, type["TaskFamily"]] = {}

# ------------------------------------------------------------------------------------------------------------------
# The model family x task kind matrix (docs/reference/family-matrix.md): every cell works, with transformers'
# parity where transformers has the model, except the cells of REFUSED, which are refused in one line with the
# reason its row of the architecture table (bertkit.models.registry) gives. The code that refuses reads REFUSED
# (`refusal`), and the matrix test (tests/models/test_family_matrix.py) runs every other cell of the cross product.
# ------------------------------------------------------------------------------------------------------------------
# Families as users name them ("causal": a BERT-family model with causal attention, is_decoder in config.json) ->
# how messages name them: the rows of the architecture table.
MATRIX_FAMILIES = {name: row.label for name, row in ARCHITECTURES.items()}
# The fine-tuning kinds (glue: a sentence-pair task), prediction with a fine-tuned model, and ONNX export.
MATRIX_KINDS = ("classify", "glue", "ner", "squad", "swag", "predict", "export")
# (family, kind) -> why it is refused: each architecture's row says which kinds it refuses and why.
REFUSED: dict[tuple[str, str], str] = refused_cells()


def matrix_family(raw_config: dict) -> str:
    """The matrix family of a model directory's config.json (as a dict): its row of the architecture table (its
    model_type, or "causal" for a BERT-family model with causal attention)."""
    return architecture_of(config_from_dict(raw_config)).name


def refusal(family: str, kind: str, what: str) -> str | None:
    """The one-line message with which `what` (the verb, e.g. "bertkit finetune ner") is refused for a model of
    `family` (a MATRIX_FAMILIES key or any model_type), or None where the cell works."""
    reason = REFUSED.get((family, kind))
    if reason is None:
        return None
    row = ARCHITECTURES[family]  # a refused cell is a row's
    return f"{what}: refused for {row.label} models ({row.marker}): {reason}"


def register(*kinds: str):
    """Class decorator: the family handles these kinds (each must be a key of TASK_MODULES)."""

    def decorate(cls: type["TaskFamily"]) -> type["TaskFamily"]:
        for kind in kinds:
            if kind not in TASK_MODULES:
                raise ValueError(f"task kind {kind!r} is not in TASK_MODULES (bertkit/tasks/base.py); add the line "
                                 f"{kind!r}: {cls.__module__!r} there")
            _REGISTRY[kind] = cls
        cls.kinds = tuple(kinds)
        return cls

    return decorate


def family_for(kind: str) -> type["TaskFamily"]:
    """The family class of a fine-tuning kind (glue, classify, ner, squad, swag), its module imported on demand.

    Raises ValueError naming the known kinds for an unknown one.
    """
    if kind not in TASK_MODULES:
        raise ValueError(f"unknown task kind {kind!r}; choose one of {', '.join(KINDS)}")
    importlib.import_module(TASK_MODULES[kind])
    if kind not in _REGISTRY:
        raise RuntimeError(f"{TASK_MODULES[kind]} registers no family for {kind!r} (@register({kind!r}))")
    return _REGISTRY[kind]


def prediction_kind(kind: str) -> str:
    """The kind whose family predicts for a model fine-tuned as `kind` (a GLUE model predicts as classify)."""
    return family_for(kind).predicts_as or kind


def kind_of_architectures(architectures: Sequence[str]) -> str | None:
    """The prediction kind of a model directory from its config.json architectures, in any family's spelling
    (BertForTokenClassification, RobertaForTokenClassification, ... -> "ner"); None when no family's head is there."""
    for kind in KINDS:
        family = family_for(kind)
        if family.predicts_as is None and any(family.matches_architecture(a) for a in architectures):
            return kind
    return None


# What a model directory is served (and exported) as: the kinds whose family predicts, and the served uses of a
# model without a task head (`bertkit.models.modeldir.USES`).
SERVED_KINDS = ("classify", "ner", "squad", "swag", *SERVED_USES, "rerank")


def default_kind(model) -> str:
    """The kind a model directory (a `bertkit.models.ModelDir`) serves and exports by default: the kind it was
    fine-tuned for (finetune.json; a GLUE model's classify, a text-to-text T5's task), else its task head's, else
    "generate" for a model that generates, "fill-mask" for a pretraining (masked-LM) checkpoint, "embeddings"."""
    trained = model.trained_kind
    if trained in KINDS and prediction_kind(trained) in SERVED_KINDS:
        return prediction_kind(trained)
    kind = kind_of_architectures(model.architectures)
    if kind is not None:
        return kind
    if model.generates:
        return "generate"
    return "fill-mask" if model.head_role in ("pretraining", "mlm") else "embeddings"


class TaskFamily:
    """What differs between task families; see the module docstring for the protocol and its order."""

    kinds: tuple[str, ...] = ()  # set by `register`
    model_class_name = ""  # the bertkit.models class of the task model (BERT family's spelling)
    # the task model's role in `bertkit.models.ROLE_CLASSES` ("sequence", "token", "qa", "choice"): the
    # class for another architecture's directory (ModernBertForTokenClassification, ...) is chosen by it
    model_role = ""
    metric_names: tuple[str, ...] = ()  # what evaluate reports (scalars), any of which may pick the best epoch
    main_metric = ""  # the default of FinetuneConfig.metric
    predicts_as: str | None = None  # another kind whose family predicts for this kind's models

    def __init__(self, config) -> None:
        self.config = config
        self.labels: list[str] | None = None  # class or tag names in id order (None: regression, QA, choice)
        self.stats: dict[str, Any] = {}  # what the readers counted, reported in results.json

    @classmethod
    def matches_architecture(cls, name: str) -> bool:
        """Whether a config.json architecture is this family's task model in any family's spelling (XLNet's span
        model is transformers' XLNetForQuestionAnsweringSimple: its XLNetForQuestionAnswering is a beam head): its
        head's role is the family's `model_role` (`bertkit.models.modeldir.architecture_role`, the one matcher)."""
        return architecture_role(name) == cls.model_role

    def table_options(self) -> dict[str, Any]:
        """How the task's files are read (`bertkit.data.readers.Table`): the config's format and JSON records key."""
        return {"format": getattr(self.config, "format", None), "records": getattr(self.config, "records", None)}

    # ---- fine-tuning -----------------------------------------------------------------------------------------
    def read(self, path, training: bool) -> list:
        raise NotImplementedError

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        raise NotImplementedError

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def objective(self):
        raise NotImplementedError

    def evaluate(self, examples, features, logits: list[np.ndarray]) -> tuple[dict[str, Any], Any]:
        raise NotImplementedError

    def write_predictions(self, out_dir: Path, examples, output) -> None:
        raise NotImplementedError

    def task_info(self) -> dict[str, Any]:
        """What goes into the model directory's finetune.json."""
        return {"kind": self.config.kind, "task": self.config.task, "max_seq_length": self.config.seq_length}

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    def restore(self, info: dict[str, Any], model) -> None:
        """Take back what prediction needs from finetune.json (`info`) and the loaded task model."""

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        raise NotImplementedError

    def predictions(self, inputs: Sequence, features, logits: list[np.ndarray],
                    top_k: int | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        raise NotImplementedError

    # ---- one input, as `bertkit serve` takes it and `bertkit predict` shows its answer ------------------------
    # The JSON fields of one input: (required, optional); all strings unless the family says otherwise.
    input_fields: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    sample_input: dict[str, Any] = {}  # a made-up input (the server's warm-up)
    input_notes: dict[str, str] = {}  # what a field holds, where its name does not say (a reranker's query)

    @classmethod
    def input_from_json(cls, item: dict[str, Any]) -> Any:
        """One input as `predict` takes it, from a JSON object of `input_fields`: the text of a single field,
        else the tuple of the fields given. ValueError naming a field that is missing or not a string."""
        required, optional = cls.input_fields
        values = [json_text(item, key) for key in required]
        values += [json_text(item, key) for key in optional if item.get(key) is not None]
        return values[0] if len(values) == 1 else tuple(values)

    @classmethod
    def inputs_from_table(cls, path, format: str | None = None, records: str | None = None,
                          columns: dict[str, str] | None = None) -> list[Any]:
        """The inputs of a table (`bertkit.data.readers`: Parquet, Arrow, a datasets directory, JSON records, CSV),
        one per record, its fields (`input_fields`) in the columns of those names or of the names `columns` maps
        them to ({"text": "sentence"}). DataError naming the file and the row for a missing or bad field."""
        columns = columns or {}
        required, optional = cls.input_fields
        table = Table(path, format, records)
        table.require(*(columns.get(k, k) for k in required))
        inputs = []
        for where, record in table.rows():
            item = {k: field(record, columns.get(k, k)) for k in (*required, *optional)}
            try:
                inputs.append(cls.input_from_json({k: v for k, v in item.items() if v is not MISSING}))
            except ValueError as err:
                raise DataError.at(path, where, str(err)) from None
        return inputs

    def truncated(self, x, features: list[dict[str, Any]], tokenizer) -> bool:
        """Whether `prediction_features([x], tokenizer)` (`features`) lost tokens of input x to the length."""
        return False

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        """One answer of `predictions` as `bertkit predict` prints it without --json."""
        return str(result)

    @classmethod
    def served_facts(cls, info: dict[str, Any]) -> dict[str, Any]:
        """What the server's model description adds for this kind, from the directory's finetune.json."""
        return {}


# ------------------------------------------------------------------------------------------------------------------
# Small helpers the families share
# ------------------------------------------------------------------------------------------------------------------
def json_text(item: dict[str, Any], key: str) -> str:
    """The string field `key` of a JSON input; ValueError naming it when it is missing or not a string."""
    value = item.get(key)
    if value is None:
        raise ValueError(f"field {key!r} is missing")
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def texts_and_pairs(inputs: Sequence) -> tuple[list[str], list[str | None]]:
    """The texts and pairs of inputs that are texts or (text, pair) tuples; ValueError when only some have a
    pair."""
    texts = [x if isinstance(x, str) else x[0] for x in inputs]
    pairs = [None if isinstance(x, str) else x[1] for x in inputs]
    if any(p is not None for p in pairs) and any(p is None for p in pairs):
        raise ValueError("give either every input a pair or none")
    return texts, pairs


def cut_at(rows: Sequence[Sequence[int]], length: int) -> bool:
    """Whether any of an input's feature rows reached `length` (only then can tokens have been cut)."""
    return any(len(row) >= length for row in rows)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, computed stably."""
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


@contextlib.contextmanager
def utf8_errors(path: str | os.PathLike):
    """Around the reading of a text file: invalid UTF-8 raises DataError "{path}:{line}: invalid UTF-8 ..." instead
    of a UnicodeDecodeError that names neither the file nor the line."""
    try:
        yield
    except UnicodeDecodeError as err:
        raise _utf8_error(path, err) from None


def _utf8_error(path: str | os.PathLike, err: UnicodeDecodeError) -> DataError:
    # The decoder's position is within some buffer: find the line by decoding the file line by line (a newline
    # byte never occurs inside a UTF-8 sequence, so each line decodes on its own).
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                return DataError.at(path, number, f"invalid UTF-8 (byte 0x{line[bad.start]:02x} at byte {bad.start} "
                                                  f"of the line); save the file as UTF-8")
    return DataError.at(path, None, f"invalid UTF-8 ({err.reason}); save the file as UTF-8")


def read_prediction_lines(path: str | os.PathLike) -> list[tuple[int, str]]:
    """(line, prediction) from a file of one prediction per line, or a GLUE submission TSV (`index<TAB>prediction`
    with a header): then the rows are put in index order and the last column is the prediction."""
    with utf8_errors(path):
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    rows = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if rows and "\t" in rows[0][1] and rows[0][1].split("\t")[0].strip().lower() in ("index", "id"):
        indexed = []
        for number, line in rows[1:]:
            fields = line.split("\t")
            try:
                indexed.append((int(fields[0]), number, fields[-1].strip()))
            except ValueError:
                raise DataError.at(path, number, f"index {fields[0]!r} is not an integer") from None
        return [(number, value) for _, number, value in sorted(indexed)]
    return [(number, line.strip()) for number, line in rows]


def read_predictions(path: str | os.PathLike, gold: Sequence, data_path,
                     numbers: bool = False) -> tuple[list[tuple[int, str]], list]:
    """The rows of a predictions file (`read_prediction_lines`), one per example of the data file (`check_count`),
    and their values: as written, or (`numbers`) as floats, DataError at the line of one that is not a number."""
    rows = read_prediction_lines(path)
    check_count(rows, gold, path, data_path)
    values: list = [value for _, value in rows]
    if numbers:
        for i, (number, value) in enumerate(rows):
            try:
                values[i] = float(value)
            except ValueError:
                raise DataError.at(path, number, f"prediction {value!r} is not a number") from None
    return rows, values


def check_count(predictions: Sequence, gold: Sequence, predictions_path, data_path) -> None:
    """Refuse a predictions file with another number of entries than the data file has examples."""
    if len(predictions) != len(gold):
        raise ValueError(f"{predictions_path}: {len(predictions)} predictions for {len(gold)} examples in "
                         f"{data_path}")
