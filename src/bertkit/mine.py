"""Hard-negative mining: for each (query, positive) pair, the corpus texts an embedding model ranks close to the
query but not too close to its positive, written as training rows for `finetune embed` and `finetune rerank`.

The rules are sentence-transformers' `mine_hard_negatives` (its documented options; our own code):

    corpus      the corpus file's texts and every positive, distinct, in first-seen order
    candidates  each distinct query's top `range_max + P` corpus texts by cosine (P: the most positives a query
                has), found block by block (queries x corpus blocks, a running top-k: never an N x N matrix)
    removed     the query's own positives; with --margin m, every candidate scoring above (its lowest positive's
                score - m); with --relative-margin r, above (that score - |that score| x r); with --max-score s,
                above s
    window      of the candidates left, best first, ranks [range_min, range_max) (0-based)
    chosen      --sampling top: the window's first num_negatives; random: num_negatives of the window drawn
                without replacement (numpy Generator seeded by --seed), then ordered by score
    rows        a pair whose query has fewer than num_negatives candidates in its window is dropped (and counted)

With --cross-encoder DIR (a reranker: `finetune rerank`'s output), the candidates and the query's positives are
scored again by it (sigmoid of its logit, the score `predict rerank` gives, as sentence-transformers' CrossEncoder
does) before the rules: the candidates are ranked by its scores (ties: the embedding model's order), and the
margins and the max score compare its scores, so a candidate it scores close to the positive (a likely unlabelled
positive) is dropped. sentence-transformers' `mine_hard_negatives` with a `cross_encoder` does the same (it rescores
only when a margin or max score is given; here --cross-encoder always does, alone it reorders the window).

range_max defaults to range_min + num_negatives (+ 10 x num_negatives when a margin or max score may remove
candidates), as sentence-transformers' does. The output has columns anchor, positive, negative_1 ...
negative_k (sentence-transformers' n-tuple layout), one row per input pair in input order, in the format of the
output's suffix (.tsv, .csv, .jsonl).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.config import field_with_help
from bertkit.errors import DataError
from bertkit.features import encode_sentences
from bertkit.io import atomic_write
from bertkit.sentence import read_sentence_config
from bertkit.tasks.classify import records
from bertkit.tasks.embed import read_pairs
from bertkit.tasks.finetune import load_predictor
from bertkit.tasks.run import model_outputs

_f = field_with_help


@dataclass(frozen=True)
class MineConfig:
    """How to mine (sentence-transformers' `mine_hard_negatives` options under the same names)."""

    num_negatives: int = _f(3, "negatives per pair (columns negative_1 ... negative_k)")
    range_min: int = _f(0, "skip the best candidates up to this rank (0-based; the very closest may be unlabelled "
                           "positives)")
    range_max: int | None = _f(None, "consider candidates up to this rank (default: range_min + num_negatives, "
                                     "+ 10 x num_negatives with a margin or max score)")
    margin: float | None = _f(None, "drop candidates scoring above the positive's cosine minus this")
    relative_margin: float | None = _f(None, "drop candidates scoring above the positive's cosine minus "
                                             "|that cosine| x this (e.g. 0.05)")
    max_score: float | None = _f(None, "drop candidates whose cosine to the query is above this")
    sampling: str = _f("top", "top (the window's best) or random (drawn from the window)")
    seed: int = _f(0, "--sampling random: the seed of the draws")
    batch_size: int = _f(64, "texts per forward pass when encoding")
    block: int = _f(4096, "queries and corpus texts per block of the cosine top-k (and pairs per block a "
                          "--cross-encoder tokenizes)")
    query_prompt: str | None = _f(None, "text put before every query (default: the directory's query prompt)")
    document_prompt: str | None = _f(None, "text put before every corpus text (default: the directory's "
                                           "document prompt)")
    max_seq_length: int | None = _f(None, "tokens per text (default: the directory's sentence-transformers length)")
    cross_encoder: str | None = _f(None, "a reranker directory (finetune rerank's output): rescore the candidates "
                                         "and positives with it; the window, margins and max score then use its "
                                         "scores")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto")
    precision: str = _f("auto", "fp32, fp16 or bf16 for encoding and scoring; auto: bf16 on a GPU that has it "
                                "(else fp16), fp32 on the CPU")

    def __post_init__(self) -> None:
        for name in ("num_negatives", "batch_size", "block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if self.range_min < 0:
            raise ValueError(f"range_min must not be negative, got {self.range_min}")
        if self.range_max is not None and self.range_max - self.range_min < self.num_negatives:
            raise ValueError(f"range_max {self.range_max} - range_min {self.range_min} leaves fewer than "
                             f"num_negatives {self.num_negatives} candidates")
        for name in ("margin", "relative_margin", "max_score"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.sampling not in ("top", "random"):
            raise ValueError(f"sampling must be top or random, got {self.sampling!r}")
        if self.precision not in ("auto", "fp32", "fp16", "bf16"):
            raise ValueError(f"precision must be auto, fp32, fp16 or bf16, got {self.precision!r}")

    @property
    def window_end(self) -> int:
        """range_max, or its default."""
        if self.range_max is not None:
            return self.range_max
        filtered = self.margin is not None or self.relative_margin is not None or self.max_score is not None
        return self.range_min + self.num_negatives * (11 if filtered else 1)


def config_fields() -> list[tuple[str, Any, Any, str]]:
    """(name, type, default, help) of every MineConfig field, for the command line."""
    hints = typing.get_type_hints(MineConfig)
    return [(f.name, hints[f.name], f.default, f.metadata.get("help", "")) for f in dataclasses.fields(MineConfig)]


# ---- the rules ---------------------------------------------------------------------------------------------------

def top_k_blockwise(queries: torch.Tensor, corpus: torch.Tensor, k: int, block: int) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    """(scores (Q, k) float32, indices (Q, k) int64) of each query's k best corpus rows by dot product, best first
    (ties: the lower index first), computed on blocks of `block` queries x `block` corpus rows with a running top-k:
    at most block x (block + k) scores exist at once. Rows past the corpus (k > N) score -inf with index -1."""
    Q, N = len(queries), len(corpus)
    scores = torch.full((Q, k), -math.inf, dtype=torch.float32, device=queries.device)
    indices = torch.full((Q, k), -1, dtype=torch.long, device=queries.device)
    for q0 in range(0, Q, block):
        best_s, best_i = scores[q0:q0 + block], indices[q0:q0 + block]
        for c0 in range(0, N, block):
            part = (queries[q0:q0 + block] @ corpus[c0:c0 + block].T).float()  # (b, c)
            ids = torch.arange(c0, c0 + part.shape[1], device=part.device).expand_as(part)
            s, i = torch.cat([best_s, part], 1), torch.cat([best_i, ids], 1)
            # a stable sort on the index first, then on the score: equal scores keep the lower index first
            order = torch.argsort(i.masked_fill(i < 0, N), dim=1, stable=True)
            s, i = s.gather(1, order), i.gather(1, order)
            order = torch.argsort(-s, dim=1, stable=True)[:, :k]
            best_s, best_i = s.gather(1, order), i.gather(1, order)
        scores[q0:q0 + block], indices[q0:q0 + block] = best_s, best_i
    return scores, indices


def choose_negatives(scores: np.ndarray, indices: np.ndarray, positives: Sequence[Sequence[int]],
                     positive_scores: Sequence[float], config: MineConfig,
                     rng: np.random.Generator) -> list[list[int] | None]:
    """The negatives of each query (corpus indices, best first), or None where its window holds fewer than
    num_negatives: the module docstring's rules applied to its candidates (`scores`, `indices` (Q, K), best
    first, index -1 = none), its positives and its lowest positive's cosine."""
    end = config.window_end
    out: list[list[int] | None] = []
    for q in range(len(scores)):
        own, low = set(positives[q]), float(positive_scores[q])
        kept = []
        for s, i in zip(scores[q].tolist(), indices[q].tolist()):
            if i < 0 or i in own:
                continue
            if config.margin is not None and s + config.margin > low:
                continue
            if config.relative_margin is not None and s > low - abs(low) * config.relative_margin:
                continue
            if config.max_score is not None and s > config.max_score:
                continue
            kept.append(i)
        window = kept[config.range_min:end]
        if len(window) < config.num_negatives:
            out.append(None)
        elif config.sampling == "top":
            out.append(window[:config.num_negatives])
        else:
            picked = sorted(rng.choice(len(window), size=config.num_negatives, replace=False).tolist())
            out.append([window[j] for j in picked])  # the window is best first: sorted positions keep that order
    return out


def rescore(score_pairs, queries: Sequence[str], corpus: Sequence[str], indices: np.ndarray,
            positives: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The candidates `indices` (Q, K) (index -1 = none) scored again by `score_pairs` (a list of (query, text)
    pairs -> their scores, in one call): (scores (Q, K) float32, best first, -inf for none; the indices in that
    order (a stable sort: ties keep the given order); each query's lowest positive score)."""
    pairs = [(queries[q], corpus[i]) for q in range(len(indices)) for i in indices[q].tolist() if i >= 0]
    pairs += [(queries[q], corpus[j]) for q in range(len(indices)) for j in positives[q]]
    values = iter(score_pairs(pairs))
    scores = np.full(indices.shape, -np.inf, dtype=np.float32)
    for q in range(len(indices)):
        for k, i in enumerate(indices[q].tolist()):
            if i >= 0:
                scores[q, k] = next(values)
    low = [min(float(np.float32(next(values))) for _ in positives[q]) for q in range(len(indices))]
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1), np.take_along_axis(indices, order, 1), low


def reranker_scores(model_dir: str | os.PathLike, batch_size: int, device: str, block: int):
    """A `rescore` scorer: the reranker directory's score (sigmoid of its logit, as `predict rerank`) of each
    (query, text) pair, the pairs tokenized `block` at a time (the model loaded once)."""
    if not Path(model_dir).is_dir():
        raise ValueError(f"--cross-encoder {model_dir}: no such directory")
    predictor = load_predictor(model_dir, "rerank", batch_size=batch_size, device=device)

    @torch.no_grad()
    def score(pairs: list[tuple[str, str]]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(pairs), block):
            chunk = pairs[start:start + block]
            family = predictor.family()
            features = family.prediction_features(chunk, predictor.tokenizer)
            logits = model_outputs(family, predictor.model, features, predictor.tokenizer.pad_id, batch_size)
            out += [p["score"] for p in family.predictions(chunk, features, logits)]
        return out

    return score


# ---- files -------------------------------------------------------------------------------------------------------

def read_corpus(path: str | os.PathLike, column: str | None = None) -> list[str]:
    """A corpus's texts: a .txt file's lines (blank lines skipped), or one column of any table the task readers
    read (`column`, else the first of text, document, positive, passage, sentence)."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    header, rows = records(path)
    names = (column,) if column else ("text", "document", "positive", "passage", "sentence")
    chosen = next((name for name in names if name in header), None)
    if chosen is None:
        raise DataError.at(path, 1, f"no corpus column ({' or '.join(names)}); the columns are {header}; name it "
                                    f"with --corpus-column")
    texts = []
    for line, row in rows:
        value = row.get(chosen)
        if not isinstance(value, str):
            raise DataError.at(path, line, f"field {chosen!r} must be a string")
        texts.append(value)
    return texts


def write_table(path: str | os.PathLike, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Rows of texts under `columns`, atomically, as .tsv (unquoted, as GLUE: a text with a tab or a line break is
    refused), .csv (quoted where needed) or .jsonl (one object per row)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        text = "".join(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n" for row in rows)
    elif suffix == ".tsv":
        for n, row in enumerate(rows, start=2):
            if any("\t" in t or "\n" in t or "\r" in t for t in row):
                raise ValueError(f"{path}: line {n} would hold a text with a tab or a line break, which a TSV file "
                                 f"cannot; write .csv or .jsonl")
        text = "".join("\t".join(row) + "\n" for row in [list(columns), *rows])
    elif suffix == ".csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        text = buffer.getvalue()
    else:
        raise ValueError(f"{path}: write the mined table to a .tsv, .csv or .jsonl file")
    atomic_write(path, text)


# ---- the verb ----------------------------------------------------------------------------------------------------

def _device_and_dtype(config: MineConfig) -> tuple[str, torch.dtype]:
    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if config.precision == "fp32" or (config.precision == "auto" and not device.startswith("cuda")):
        return device, torch.float32
    if config.precision == "auto":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if not device.startswith("cuda"):
        raise ValueError(f"--precision {config.precision} is for a GPU; on the CPU use fp32")
    return device, {"fp16": torch.float16, "bf16": torch.bfloat16}[config.precision]


def encode_remote(url: str, texts: Sequence[str], input_type: str | None, batch_size: int) -> np.ndarray:
    """(N, D) float32 vectors of `texts` from a running `bertkit serve` (or any OpenAI-style /v1/embeddings) at
    `url`, `batch_size` texts a request, base64-encoded; `input_type` asks the server for its prompt."""
    import base64
    import urllib.error
    import urllib.request

    out = []
    for start in range(0, len(texts), batch_size):
        body = {"input": list(texts[start:start + batch_size]), "encoding_format": "base64"}
        if input_type is not None:
            body["input_type"] = input_type
        request = urllib.request.Request(url.rstrip("/") + "/v1/embeddings", data=json.dumps(body).encode("utf-8"),
                                         headers={"Content-Type": "application/json", **(
                                             {"Authorization": f"Bearer {os.environ['BERTKIT_API_KEY']}"}
                                             if os.environ.get("BERTKIT_API_KEY") else {})})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                data = json.loads(response.read())["data"]
        except urllib.error.HTTPError as err:
            raise ValueError(f"{url}/v1/embeddings answered {err.code}: {err.read()[:300]!r}") from None
        except urllib.error.URLError as err:
            raise ValueError(f"{url}: no server answers ({err.reason})") from None
        out.extend(np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data)
    return np.stack(out).astype(np.float32)


def mine_hard_negatives(model_dir: str | os.PathLike, pairs_path: str | os.PathLike, out: str | os.PathLike,
                        corpus_path: str | os.PathLike | None = None, config: MineConfig = MineConfig(),
                        anchor_column: str | None = None, positive_column: str | None = None,
                        corpus_column: str | None = None) -> dict[str, Any]:
    """Mine `config.num_negatives` negatives for every pair of `pairs_path` (any table `finetune embed` reads)
    from `corpus_path` (a .txt file or a table; None: the pairs' positives) with the embedding model in
    `model_dir` (or served at that http(s) URL by `bertkit serve`: its own prompts through `input_type` unless
    the config gives prompts), and write them to `out` (see the module docstring). Returns counts for the
    report."""
    pairs = read_pairs(pairs_path, anchor_column, positive_column)
    corpus = list(dict.fromkeys((read_corpus(corpus_path, corpus_column) if corpus_path else [])
                                + [p.positive for p in pairs]))
    where = {t: i for i, t in enumerate(corpus)}
    queries = list(dict.fromkeys(p.anchor for p in pairs))
    qwhere = {t: i for i, t in enumerate(queries)}
    positives: list[list[int]] = [[] for _ in queries]
    for p in pairs:
        if where[p.positive] not in positives[qwhere[p.anchor]]:
            positives[qwhere[p.anchor]].append(where[p.positive])
    remote = str(model_dir).startswith(("http://", "https://"))
    sentence = None if remote else read_sentence_config(model_dir)
    prompts = sentence.prompts if sentence is not None else {}
    qp = config.query_prompt if config.query_prompt is not None else prompts.get("query", "")
    dp = config.document_prompt if config.document_prompt is not None else prompts.get("document", "")
    device, dtype = _device_and_dtype(config)

    def encode(texts: list[str], prompt: str, kind: str, given: str | None) -> torch.Tensor:
        if remote:  # the server puts its prompt first unless one is given here
            vectors = encode_remote(str(model_dir), [(given or "") + t for t in texts],
                                    None if given is not None else kind, config.batch_size)
        else:
            vectors = encode_sentences(model_dir, texts, batch_size=config.batch_size, prompt=prompt,
                                       max_seq_length=config.max_seq_length, device=device, dtype=dtype)
        x = torch.from_numpy(vectors).to(device)
        return torch.nn.functional.normalize(x, dim=-1).to(dtype)  # cosine

    q = encode(queries, qp, "query", config.query_prompt)
    c = encode(corpus, dp, "document", config.document_prompt)
    most = max(len(p) for p in positives)
    k = min(config.window_end + most, len(corpus))
    scores, indices = top_k_blockwise(q, c, k, config.block)
    scores, indices = scores.cpu().numpy(), indices.cpu().numpy()
    if config.cross_encoder is not None:
        scorer = reranker_scores(config.cross_encoder, config.batch_size, device, config.block)
        scores, indices, low = rescore(scorer, queries, corpus, indices, positives)
    else:
        low = [min(float((q[i].float() @ c[j].float())) for j in positives[i]) for i in range(len(queries))]
    chosen = choose_negatives(scores, indices, positives, low, config, np.random.default_rng(config.seed))
    rows = []
    for p in pairs:
        negatives = chosen[qwhere[p.anchor]]
        if negatives is not None:
            rows.append([p.anchor, p.positive] + [corpus[j] for j in negatives])
    if not rows:
        raise ValueError(f"no pair has {config.num_negatives} negatives in its window; widen --range-max or loosen "
                         f"the margin")
    columns = ["anchor", "positive"] + [f"negative_{n}" for n in range(1, config.num_negatives + 1)]
    write_table(out, columns, rows)
    return {"pairs": len(pairs), "rows": len(rows), "dropped": len(pairs) - len(rows), "queries": len(queries),
            "corpus": len(corpus), "num_negatives": config.num_negatives, "range": [config.range_min,
                                                                                   config.window_end],
            "device": device, "dtype": str(dtype).replace("torch.", ""), "cross_encoder": config.cross_encoder,
            "out": str(out)}
