"""Embedding models: contrastive fine-tuning on text pairs (or triplets), evaluated by STS Spearman or retrieval.

Training files are CSV/TSV/JSONL tables of an anchor, a positive and optionally hard negatives per row. Columns:
`anchor`, `positive`, `negative` or `negative_1`, `negative_2`, ... (`bertkit mine`'s output; or `sentence1`,
`sentence2` as STS files name them) unless --text-column, --pair-column, --negative-column (one or several,
comma-separated) say otherwise. A file with a score column (--label-column, else `score` or
`label`) keeps only the rows scoring at least --min-score as positive pairs (STS-B: 4.0 of 5); without
--min-score every row is a positive pair.

The loss is sentence-transformers' MultipleNegativesRankingLoss (in-batch negatives; van den Oord et al.'s
InfoNCE): for a batch of B anchors a_i with positives p_i (and hard negatives n_i), the scores are
s_ij = scale x cos(a_i, c_j) over the candidates c = (p_1..p_B, n_1..n_B), and the loss is the cross-entropy of
picking c_i, averaged over the anchors; scale 20 as sentence-transformers' default (a temperature of 0.05). The
symmetric option adds the positives' side, cross-entropy of picking a_i among the anchors for p_i, and halves the
sum (MultipleNegativesSymmetricRankingLoss). Every text of a batch goes through the encoder in one forward pass.
Under torchrun (gather_negatives, the default) every rank's vectors are gathered: a rank's anchors are scored
against the candidates of the whole global batch, as in one process (`gather_rows`).

Dev files:
    with a score column     STS: Spearman (and Pearson) correlation of the cosine of each pair with its score
    without one             retrieval: the first column's texts are queries, the second's the corpus (its
                            distinct texts); each query's relevant document is its own row's; ranked by cosine:
                            nDCG@10, MRR@10 and recall@10
The best epoch's model is written with its sentence-transformers modules (`bertkit.models.pooling`), so
sentence-transformers and `bertkit serve` pool it as it was trained.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import DataError
from bertkit.sentence import combine_windows, pooling_modes, windowed_encodings
from bertkit.tasks.base import TaskFamily, read_predictions, register
from bertkit.tasks.classify import records
from bertkit.tasks.metrics import pearson, spearman
from bertkit.tasks.rerank import mrr_at_k, ndcg_at_k


@dataclass(frozen=True)
class TextPair:
    """One row: two texts, its hard negatives (none or several), an optional score, and its 1-based line."""

    anchor: str
    positive: str
    negatives: tuple[str, ...]
    score: float | None
    line: int


_records = records  # read_pairs' `records` argument (the JSON key) shadows the function's name there


def _pick(path, header: list[str], given: str | None, defaults: tuple[str, ...], what: str,
          optional: bool = False) -> str | None:
    """The column for `what`: the one given (which must exist), else the first default present."""
    if given is not None:
        if given not in header:
            raise DataError.at(path, 1, f"no {what} column {given!r}; the columns are {header}")
        return given
    for name in defaults:
        if name in header:
            return name
    if optional:
        return None
    raise DataError.at(path, 1, f"no {what} column ({' or '.join(defaults)}); the columns are {header}; name it with "
                                f"--{'text' if what == 'anchor' else 'pair'}-column")


def read_pairs(path, anchor: str | None = None, positive: str | None = None, negative: str | None = None,
               score: str | None = None, format: str | None = None, records: str | None = None) -> list[TextPair]:
    """Every row of a pair file (see the module docstring for the column names; format, records: as
    `bertkit.data.readers.Table`); DataError "{path}:{line}: ..." for a missing, null or non-string text or a
    score that is not a number."""
    header, rows = _records(path, format, records)
    if not header:
        raise DataError.at(path, None, "no rows")
    a = _pick(path, header, anchor, ("anchor", "sentence1", "query", "text"), "anchor")
    p = _pick(path, header, positive, ("positive", "sentence2", "document", "pair"), "positive")
    if negative is not None:  # one or several columns, comma-separated
        negatives = tuple(_pick(path, header, name.strip(), (), "negative") for name in negative.split(","))
    elif "negative" in header:
        negatives = ("negative",)
    else:  # `bertkit mine`'s and sentence-transformers' n-tuple layout: negative_1, negative_2, ...
        negatives = tuple(itertools.takewhile(lambda name: name in header,
                                              (f"negative_{k}" for k in itertools.count(1))))
    s = _pick(path, header, score, ("score", "label"), "score", optional=True)
    out = []
    for line, row in rows:
        texts = []
        for column in (a, p) + negatives:
            value = row.get(column)
            if value is None and column in row:
                raise DataError.at(path, line, f"the column {column!r} is null")
            if not isinstance(value, str):
                raise DataError.at(path, line, f"field {column!r} must be a string, got "
                                               f"{'nothing' if value is None else type(value).__name__}")
            texts.append(value)
        value = None
        if s is not None:
            raw = row.get(s)
            try:
                value = float(raw) if not isinstance(raw, bool) else math.nan
            except (TypeError, ValueError):
                value = math.nan
            if not math.isfinite(value):
                raise DataError.at(path, line, f"score {raw!r} is not a number")
        out.append(TextPair(texts[0], texts[1], tuple(texts[2:]), value, line))
    if not out:
        raise DataError.at(path, None, "no rows")
    return out


def token_budget_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices grouped into mini-batches of at most `budget` padded tokens each: the rows taken longest first
    (each chunk pads only to its own longest row), a chunk closed when (rows + 1) x its width would pass the budget.
    A row longer than the budget alone is a chunk of its own. Every index appears once."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    chunks: list[list[int]] = []
    for i in order:
        # longest first: the chunk's width is its first row's length
        if chunks and (len(chunks[-1]) + 1) * int(lengths[chunks[-1][0]]) <= budget:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def _embed_rows(model, ids, mask, types, rows: list[int], width: int):
    """Sentence vectors (len(rows), D) of the flat texts `rows` of right-padded (N, T) tensors, cut to `width`
    (the rows' longest, known on the host)."""
    pick = [t[rows, :width] if t is not None else None for t in (ids, mask, types)]
    return model(*pick).logits


def _widen(x):
    """float32 for half-precision vectors (the loss is computed in float32), float64 kept."""
    import torch

    return x if x.dtype == torch.float64 else x.float()


def _rng_state(device) -> tuple:
    import torch

    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: tuple, device) -> None:
    import torch

    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached_embeddings(model, ids, mask, types, chunks: list[list[int]], widths: list[int]):
    """Sentence vectors (N, D) of the flat right-padded texts (N, T) (`chunks` of rows, each `widths` tokens
    wide: `token_budget_chunks`), computed without keeping activations (GradCache: Gao et
    al. 2021): forward, each chunk of rows runs under no_grad; backward, each chunk runs again with grad (its
    random state restored, so dropout draws the same masks, and autocast as it was) and receives its rows of the
    vectors' gradient. The parameters' gradients equal those of one forward pass over all N rows with the same
    dropout masks; activations are held for one chunk at a time."""
    import torch

    class _Cached(torch.autograd.Function):
        @staticmethod
        def forward(ctx, anchor):
            ctx.states, parts = [], []
            for rows, width in zip(chunks, widths):
                ctx.states.append(_rng_state(ids.device))
                parts.append(_widen(_embed_rows(model, ids, mask, types, rows, width)))
            out = parts[0].new_empty(len(ids), parts[0].shape[-1])
            for rows, part in zip(chunks, parts):
                out[rows] = part
            ctx.autocast = (torch.is_autocast_enabled(ids.device.type),
                            torch.get_autocast_dtype(ids.device.type))
            return out

        @staticmethod
        def backward(ctx, grad):
            # the random state after the forward pass is kept: the chunks' replays leave it as they found it
            after = _rng_state(ids.device)
            sync = getattr(model, "no_sync", None)  # DDP: all-reduce once, with the last chunk's gradients
            enabled, dtype = ctx.autocast
            try:
                for k, (rows, width, state) in enumerate(zip(chunks, widths, ctx.states)):
                    _set_rng_state(state, ids.device)
                    context = sync() if sync is not None and k < len(chunks) - 1 else contextlib.nullcontext()
                    with context, torch.enable_grad(), torch.autocast(ids.device.type, dtype=dtype,
                                                                      enabled=enabled):
                        part = _widen(_embed_rows(model, ids, mask, types, rows, width))
                    torch.autograd.backward(part, grad[rows])
            finally:
                _set_rng_state(after, ids.device)
            return None

    anchor = torch.zeros((), device=ids.device, requires_grad=True)  # an input needing grad: backward runs
    return _Cached.apply(anchor)


def in_batch_loss(emb, scale: float, symmetric: bool, own: tuple[int, int] | None = None):
    """The in-batch cross-entropy of (B, C, D) embeddings summed over the B anchors (see the module docstring);
    `own` = (start, count): only the anchors (and, symmetric, the positives) of those rows, against every row's
    candidates (a rank's share of the gathered batch: `gather_rows`)."""
    import torch
    import torch.nn.functional as F

    start, count = own if own is not None else (0, emb.shape[0])
    emb = F.normalize(emb, p=2, dim=-1)  # cosine, whatever the model's own normalisation
    anchors = emb[:, 0]  # (B, D)
    mine = anchors[start:start + count] if own is not None else anchors
    candidates = emb[:, 1:].transpose(0, 1).reshape(-1, emb.shape[-1])  # (B * (C-1), D): positives, negatives
    scores = scale * mine @ candidates.T  # (count, B * (C-1))
    target = torch.arange(start, start + count, device=emb.device)
    loss = F.cross_entropy(scores, target, reduction="sum")
    if symmetric:
        positives = emb[start:start + count, 1] if own is not None else emb[:, 1]
        backward = scale * positives @ anchors.T  # (count, B): each positive against every anchor
        loss = (loss + F.cross_entropy(backward, target, reduction="sum")) / 2
    return loss


def gather_rows(emb, group=None) -> tuple[Any, tuple[int, int]]:
    """Every rank's (B_r, C, D) embeddings, concatenated in rank order, the gradient flowing back to each rank's
    own rows (torch.distributed.nn's all_gather: a rank receives the sum of every rank's gradient for its rows),
    and this rank's (start, count) in it. Ranks may hold different B_r (the global batch split unevenly): the
    counts are exchanged first, on the host (`group`: a gloo group; None: the default one), and every rank's rows
    are padded to the largest for the gather."""
    import torch
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_gather

    rank, world = dist.get_rank(), dist.get_world_size()
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([emb.shape[0]]), group=group)
    counts = [int(c) for c in counts]
    most = max(counts)
    padded = torch.cat([emb, emb.new_zeros(most - emb.shape[0], *emb.shape[1:])]) if emb.shape[0] < most else emb
    parts = all_gather(padded)
    rows = torch.cat([part[:n] for part, n in zip(parts, counts)])
    return rows, (sum(counts[:rank]), counts[rank])


class MultipleNegativesRankingLoss:
    """Trainer task: in-batch negatives (see the module docstring). The batch's input_ids are (B, C, T): C = 2
    (anchor, positive) or C > 2 (with hard negatives).

    matryoshka_dims: train every prefix of the vector too (Kusupati et al. 2022, sentence-transformers'
    MatryoshkaLoss with weights 1): the loss is the sum over the dims d of the in-batch loss of the first d
    components (renormalised). mini_batch_size N: GradCache (`cached_embeddings`) with chunks of at most N x W
    padded tokens, W the batch's widest text: the same loss and gradients, activations held for one chunk."""

    def __init__(self, scale: float = 20.0, symmetric: bool = False, matryoshka_dims: Sequence[int] = (),
                 mini_batch_size: int | None = None, gather: bool = True) -> None:
        self.scale, self.symmetric = scale, symmetric
        self.matryoshka_dims = tuple(sorted(matryoshka_dims, reverse=True))
        self.mini_batch_size = mini_batch_size
        self.gather = gather
        self._host_group: Any = None  # the gloo group that exchanges the ranks' row counts (made on first use)

    def _gathered(self, emb):
        """(every rank's rows, this rank's (start, count)) under torchrun with gather; else (emb, None)."""
        import torch.distributed as dist

        if not (self.gather and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return emb, None
        if self._host_group is None:  # counts travel on the host: a gloo group beside NCCL's
            self._host_group = (dist.group.WORLD if dist.get_backend() == "gloo"
                                else dist.new_group(backend="gloo"))
        return gather_rows(emb, self._host_group)

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"mnrl_loss": float(batch["windows" if "windows" in batch else "input_ids"].shape[0])}

    def embeddings(self, model, batch):
        """(B, C, D) float32 (float64 for a float64 model) sentence vectors of the batch, cached per chunk when
        mini_batch_size is set; with windows (a (R, T) batch of every text's windows, `collate`'s "windows"), each
        text's vector pooled from its windows' (`pool_windows`)."""
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        windows = batch.get("windows")
        if self.mini_batch_size is None and windows is None:
            return _widen(model(ids, mask, types).logits)
        if windows is None:
            B, C, T = ids.shape
            flat = [t.reshape(B * C, T) if t is not None else None for t in (ids, mask, types)]
        else:
            (B, C), flat = windows.shape, [ids, mask, types]
        if self.mini_batch_size is None:
            vectors = _widen(model(*flat).logits)
        else:
            lengths = host_lengths(mask)  # one per flat row
            chunks = token_budget_chunks(lengths, self.mini_batch_size * max(lengths))
            widths = [lengths[rows[0]] for rows in chunks]  # longest first
            vectors = cached_embeddings(model, *flat, chunks, widths)
        if windows is not None:
            vectors = pool_windows(vectors, host_values(windows), host_values(batch["window_pieces"]))
        return vectors.view(B, C, -1)

    def __call__(self, model, batch):
        from bertkit.models.layouts import host_count  # torch-free module: only the loss needs torch

        emb = self.embeddings(model, batch)  # (B, C, D)
        B = emb.shape[0]
        emb, own = self._gathered(emb)  # under torchrun: every rank's rows, this rank's anchors
        if self.matryoshka_dims:
            if self.matryoshka_dims[0] > emb.shape[-1]:
                raise ValueError(f"--matryoshka-dims {self.matryoshka_dims[0]} is more than the model's "
                                 f"{emb.shape[-1]} dimensions")
            loss = sum(in_batch_loss(emb[..., :d], self.scale, self.symmetric, own) for d in self.matryoshka_dims)
        else:
            loss = in_batch_loss(emb, self.scale, self.symmetric, own)
        return {"mnrl_loss": (loss, host_count(B, loss.device))}


def pool_windows(vectors, windows: Sequence[int], pieces: Sequence[int]):
    """(N, D) text vectors from the (R, D) vectors of their windows, the n-th text's `windows[n]` consecutive
    rows holding `pieces` text pieces each: the windows' mean weighted by their pieces, as
    `bertkit.sentence.combine_windows` (unnormalised: the loss takes the cosine); a one-window text's vector is
    its window's, bit for bit. The gradient flows into every window."""
    import torch

    owner, weights, start = [], [], 0
    for n, count in enumerate(windows):
        share = pieces[start:start + count]
        total = max(sum(share), 1)
        owner += [n] * count
        weights += [1.0] if count == 1 else [k / total for k in share]
        start += count
    owner_t = torch.tensor(owner, device=vectors.device)
    weights_t = torch.tensor(weights, dtype=vectors.dtype, device=vectors.device)
    return vectors.new_zeros(len(windows), vectors.shape[-1]).index_add_(0, owner_t, vectors * weights_t[:, None])


def on_host(x):
    """x's host copy when the loader left one (reading it reads nothing from the device), else x."""
    from bertkit.models.layouts import host_copy  # torch-free module: only the loss needs torch

    host = host_copy(x)
    return host if host is not None else x


def host_values(x) -> list[int]:
    """An integer tensor's values, flattened, `on_host`."""
    return [int(n) for n in on_host(x).reshape(-1).tolist()]


def host_lengths(mask) -> list[int]:
    """Real tokens per text of an attention mask (..., T), flattened, `on_host`."""
    return [int(n) for n in on_host(mask).ne(0).sum(-1).reshape(-1).tolist()]


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (N, D) and (N, D) -> (N,), in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


def retrieval_metrics(queries: np.ndarray, corpus: np.ndarray, relevant: Sequence[set[int]],
                      k: int = 10) -> tuple[dict[str, float], np.ndarray]:
    """nDCG@k, MRR@k and recall@k of ranking `corpus` (M, D) by cosine for each query (N, D); relevant[q] = the
    corpus rows relevant to query q (binary gains). Returns the metrics and the (N, k) top indices."""
    q = queries / np.maximum(np.linalg.norm(queries, axis=-1, keepdims=True), 1e-12)
    c = corpus / np.maximum(np.linalg.norm(corpus, axis=-1, keepdims=True), 1e-12)
    sims = q.astype(np.float64) @ c.astype(np.float64).T  # (N, M)
    order = np.argsort(-sims, axis=1, kind="stable")
    ranked = []
    recall = 0.0
    for i, rel in enumerate(relevant):
        # the full ranking's gains, so the ideal DCG counts every relevant document
        gains = [1.0 if j in rel else 0.0 for j in order[i]]
        ranked.append(gains)
        recall += sum(gains[:k]) / max(len(rel), 1)
    top = order[:, :k]
    return ({f"ndcg_at_{k}": ndcg_at_k(ranked, k), f"mrr_at_{k}": mrr_at_k(ranked, k),
             f"recall_at_{k}": recall / max(len(relevant), 1)}, top)


@register("embed")
class EmbedFamily(TaskFamily):
    """Contrastive fine-tuning of an embedding model; see the module docstring."""

    model_class_name = "SentenceEncoder"
    model_role = "embedding"
    metric_names = ("spearman", "pearson", "ndcg_at_10", "mrr_at_10", "recall_at_10")
    main_metric = "spearman"
    predicts_as = "embed"  # no `predict`: embeddings come from `bertkit features` and `bertkit serve`

    @classmethod
    def matches_architecture(cls, name: str) -> bool:
        return False  # an embedding model is a bare encoder: never told apart by its architecture

    def _columns(self) -> tuple[str | None, str | None, str | None, str | None]:
        c = self.config
        return (None if c.text_column == "text" else c.text_column, c.pair_column,
                getattr(c, "negative_column", None), None if c.label_column == "label" else c.label_column)

    def read(self, path, training: bool) -> list[TextPair]:
        rows = read_pairs(path, *self._columns(), **self.table_options())
        if training:
            low = getattr(self.config, "min_score", None)
            if low is not None:
                if rows[0].score is None:
                    raise DataError.at(path, None, "--min-score needs a score column (score, label or "
                                                   "--label-column)")
                rows = [r for r in rows if r.score >= low]
                if len(rows) < 2:
                    raise DataError.at(path, None, f"{len(rows)} row(s) score at least {low}; in-batch negatives "
                                                   f"need at least 2 pairs")
            self.stats["train_pairs"] = len(rows)
            self.stats["hard_negatives"] = len(rows[0].negatives)
        else:
            self.main_metric = "spearman" if rows[0].score is not None else "ndcg_at_10"
        return rows

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        length = self.config.seq_length
        q, d = (p or "" for p in self.prompts().values())  # sentence-transformers: the prompt, then the text
        if training:
            columns = [([e.anchor for e in examples], q), ([e.positive for e in examples], d)]
            for k in range(len(examples[0].negatives)):
                columns.append(([e.negatives[k] for e in examples], d))
            if getattr(self.config, "window", None):
                return self._windowed_training(tokenizer, columns, len(examples))
            encoded = [tokenizer.encode_batch([prompt + t for t in texts], max_length=length)
                       for texts, prompt in columns]
            return [{"input_ids": [enc[i].input_ids for enc in encoded],
                     "token_type_ids": [enc[i].token_type_ids for enc in encoded]} for i in range(len(examples))]
        if examples[0].score is not None:  # STS: both sentences of every pair, in turn
            return self._eval_rows(tokenizer, [t for e in examples for t in (e.anchor, e.positive)], "", "sts")
        corpus = list(dict.fromkeys(e.positive for e in examples))  # distinct documents, first-seen order
        return (self._eval_rows(tokenizer, [e.anchor for e in examples], q, "query")
                + self._eval_rows(tokenizer, corpus, d, "document"))

    def _stride(self, tokenizer) -> int:
        """--stride, or half the window's room for text."""
        return self.config.stride or max((self.config.window - tokenizer.num_special_tokens()) // 2, 1)

    def _windowed_training(self, tokenizer, columns: list[tuple[list[str], str]], n: int) -> list[dict[str, Any]]:
        """Training features with --window: each example's rows are the windows of its texts, column by column
        (`windowed_encodings`: a text that fits in one window is one row, encoded as without windows), with how
        many windows each text has ("windows") and each window's text pieces ("window_pieces", its weight)."""
        out: list[dict[str, Any]] = [{"input_ids": [], "token_type_ids": [], "windows": [], "window_pieces": []}
                                     for _ in range(n)]
        for texts, prompt in columns:
            rows = windowed_encodings(tokenizer, texts, self.config.window, self._stride(tokenizer), prompt)
            counts = [0] * n
            for enc, owner, pieces in zip(rows.encoded, rows.owner, rows.pieces):
                f = out[owner]
                f["input_ids"].append(list(enc.input_ids)), f["token_type_ids"].append(list(enc.token_type_ids))
                f["window_pieces"].append(pieces)
                counts[owner] += 1
            for f, count in zip(out, counts):
                f["windows"].append(count)
        return out

    def _eval_rows(self, tokenizer, texts: list[str], prompt: str, role: str) -> list[dict[str, Any]]:
        """The dev features of `texts` (with `prompt` first): one per text cut at the sequence length, or with
        --window one per window, each naming its text (`owner`) and its pieces (`bertkit.sentence`'s windows)."""
        window = getattr(self.config, "window", None)
        if not window:
            return [{"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids, "role": role}
                    for enc in tokenizer.encode_batch([prompt + t for t in texts], max_length=self.config.seq_length)]
        rows = windowed_encodings(tokenizer, texts, window, self._stride(tokenizer), prompt)
        return [{"input_ids": list(r.input_ids), "token_type_ids": list(r.token_type_ids), "role": role,
                 "owner": owner, "pieces": pieces} for r, owner, pieces in zip(rows.encoded, rows.owner, rows.pieces)]

    @staticmethod
    def _text_vectors(features, logits) -> np.ndarray:
        """One vector per dev text: the rows themselves, or each text's windows pooled (`combine_windows`; the
        cosine that follows makes normalising them moot)."""
        vectors = np.stack(logits)
        if not features or "owner" not in features[0]:
            return vectors
        groups: dict[tuple[str, int], list[int]] = {}
        for i, f in enumerate(features):
            groups.setdefault((f["role"], f["owner"]), []).append(i)
        return np.stack([combine_windows(vectors[rows], [features[i]["pieces"] for i in rows], False)
                         for rows in groups.values()])

    def model_kwargs(self) -> dict[str, Any]:
        if getattr(self.config, "dropout", None) is not None:
            raise ValueError("bertkit finetune embed: --dropout is not supported; the encoder keeps its config's")

        c = self.config
        pooling = getattr(c, "pooling", None)
        prompts = {name: text for name, text in self.prompts().items() if text is not None}
        return {"modes": pooling_modes(pooling) if pooling else None, "normalize": getattr(c, "normalize", None),
                "matryoshka_dims": (c.dims() or None) if hasattr(c, "dims") else None, "prompts": prompts or None}

    def prompts(self) -> dict[str, str | None]:
        """{"query": --query-prompt, "document": --document-prompt} (None where not given)."""
        return {"query": getattr(self.config, "query_prompt", None),
                "document": getattr(self.config, "document_prompt", None)}

    def objective(self):
        c = self.config
        return MultipleNegativesRankingLoss(getattr(c, "scale", 20.0), bool(getattr(c, "symmetric", False)),
                                            c.dims() if hasattr(c, "dims") else (),
                                            getattr(c, "mini_batch_size", None),
                                            bool(getattr(c, "gather_negatives", True)))

    def evaluate(self, examples, features, logits) -> tuple[dict[str, float], Any]:
        vectors = self._text_vectors(features, logits)
        if features and features[0].get("role") == "sts":
            cos = cosine_rows(vectors[0::2], vectors[1::2])
            gold = [e.score for e in examples]
            return {"spearman": spearman(cos, gold), "pearson": pearson(cos, gold)}, cos
        queries = vectors[:len(examples)]
        corpus_texts = list(dict.fromkeys(e.positive for e in examples))
        where = {t: i for i, t in enumerate(corpus_texts)}
        metrics, top = retrieval_metrics(queries, vectors[len(examples):], [{where[e.positive]} for e in examples])
        return metrics, top

    def write_predictions(self, out_dir: Path, examples, output) -> None:
        """STS: the cosine of each dev pair, one per line; retrieval: each query's top 10 corpus indices."""
        output = np.asarray(output)
        lines = ([f"{v:.6f}" for v in output] if output.ndim == 1
                 else [" ".join(str(int(i)) for i in row) for row in output])
        (Path(out_dir) / "dev_predictions.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        c = self.config
        return {**super().task_info(), "scale": getattr(c, "scale", 20.0),
                "symmetric": bool(getattr(c, "symmetric", False))}

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        raise ValueError("an embedding model has no predict: use `bertkit features --pooling auto` or "
                         "`bertkit serve` (/v1/embeddings)")

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        """Spearman and Pearson of a file of one cosine per line against an STS file's scores."""
        examples = read_pairs(data_path, *self._columns(), **self.table_options())
        if examples[0].score is None:
            raise DataError.at(data_path, None, "the data file has no score column")
        _, cos = read_predictions(predictions_path, examples, data_path, numbers=True)
        gold = [e.score for e in examples]
        return {"spearman": spearman(cos, gold), "pearson": pearson(cos, gold)}
