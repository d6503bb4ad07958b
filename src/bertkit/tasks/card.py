"""Result cards: several fine-tuning runs of one setting summarised with honest error bars, and tables of cards.

Fine-tuning a small dataset is noisy: the BERT paper reruns its small GLUE tasks with several restarts and picks
the learning rate on dev (2e-5, 3e-5, 5e-5). A card is what such a sweep leaves behind:

    SWEEP/seed1/ ... SWEEP/seedN/                 one full run directory per seed (results.json, model/, ...)
    SWEEP/lr2e-05/seed1/ ...                      the same under one folder per learning rate, with a grid
    SWEEP/card.json, SWEEP/card.md                the card

A card holds, for every setting (learning rate) and every metric (the dev metrics of each run's best epoch, and
`FILE/metric` for each extra evaluation file), the per-run values and their statistics (`summarize`: n, median,
mean, standard deviation, min, max, first and third quartiles, IQR), the setting chosen (the highest median of
the run's selection metric), the training throughput (tokens/s, examples/s), the wall time, and for a
classifier the runs' confusion matrices summed (rows = gold, columns = predicted; dev and each extra file).
Every number is recomputed from the runs' own results.json by `card_from_runs`, so a card can be rebuilt (or
checked) at any time.

`merge_cards` lays several cards out as one table (rows: models or variants; columns: task and metric), which
`bertkit card` writes as card.json + card.md and draws with `bertkit.pipeline.plots.plot_card`. No torch here: a card is
arithmetic over JSON files.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import DataError
from bertkit.io import atomic_write

CARD_JSON = "card.json"
CARD_MD = "card.md"
RESULTS = "results.json"
PAPER_LR_GRID = (2e-5, 3e-5, 5e-5)  # BERT, appendix A.3 (with 5e-5 the default of a single run)
# How the numbers of a card are computed (written into every card).
STATISTICS = ("over the runs of the chosen setting: median, q1, q3 by numpy.percentile (linear interpolation, R's type "
              "7); iqr = q3 - q1; std with n - 1")
# Keys of a best-epoch record that are positions, not metrics.
_NOT_METRICS = ("epoch", "step")


# ------------------------------------------------------------------------------------------------------------------
# Parsing what the command line gives
# ------------------------------------------------------------------------------------------------------------------
def parse_seeds(text: str) -> list[int]:
    """"1,2,3" or "1-5" (or a mix: "1-3,7") -> [1, 2, 3, ...]; ValueError naming --seeds on anything else."""
    seeds: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        span = re.fullmatch(r"(\d+)-(\d+)", part)
        if span and int(span[1]) <= int(span[2]):
            seeds.extend(range(int(span[1]), int(span[2]) + 1))
        elif re.fullmatch(r"\d+", part):
            seeds.append(int(part))
        else:
            raise ValueError(f"--seeds {text!r}: give seeds (integers from 0) separated by commas (1,2,3) or a "
                             f"range (1-5)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: a seed is repeated")
    return seeds


def parse_grid(text: str | None) -> list[float]:
    """Learning rates: "paper" or "" -> the paper's 2e-5, 3e-5, 5e-5; else comma-separated positive numbers."""
    if text is None or str(text).strip() in ("", "paper"):
        return list(PAPER_LR_GRID)
    try:
        rates = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--lr-grid {text!r}: give learning rates separated by commas (2e-5,3e-5,5e-5)") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates) or len(set(rates)) != len(rates):
        raise ValueError(f"--lr-grid {text!r}: learning rates must be distinct positive numbers")
    return rates


def run_dir_name(seed: int, learning_rate: float | None = None) -> str:
    """seed{S}, or lr{LR:g}/seed{S} within a learning-rate grid."""
    return f"seed{seed}" if learning_rate is None else f"lr{learning_rate:g}/seed{seed}"


# ------------------------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------------------------
def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, median, mean, std (sample, ddof=1; 0 for one value), min, max, q1, q3 and iqr = q3 - q1 of `values`.

    Quartiles are numpy's default (linear interpolation between order statistics, the same as pandas' and R's
    type 7). Raises ValueError on no values or a non-finite one.
    """
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values to summarise")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"non-finite values to summarise: {x.tolist()}")
    q1, median, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
    return {"n": int(x.size), "median": median, "mean": float(x.mean()),
            "std": float(x.std(ddof=1)) if x.size > 1 else 0.0, "min": float(x.min()), "max": float(x.max()),
            "q1": q1, "q3": q3, "iqr": q3 - q1}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The numbers a run contributes to a card: its best epoch's dev metrics, and `NAME/metric` for every extra
    evaluation file (results["eval_files"], scored with the best epoch's model)."""
    best = results.get("best") or {}
    out = {k: float(v) for k, v in best.items() if k not in _NOT_METRICS and _is_number(v)}
    for name, metrics in (results.get("eval_files") or {}).items():
        out.update({f"{name}/{k}": float(v) for k, v in metrics.items() if _is_number(v)})
    return out


def read_results(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run directory's results.json; FileNotFoundError / DataError naming the file."""
    path = Path(run_dir) / RESULTS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {run_dir} is not a finished fine-tuning run")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(results, dict) or not results.get("best"):
        raise DataError(f"{path}: no best epoch recorded; the run did not finish an evaluation")
    return results


def _run_entry(run_dir: Path, root: Path | None) -> dict[str, Any]:
    results = read_results(run_dir)
    config = results.get("config") or {}
    return {"dir": str(run_dir.relative_to(root)) if root is not None else str(run_dir),
            "seed": config.get("seed"), "learning_rate": config.get("learning_rate"),
            "best_epoch": results["best"].get("epoch"), "metrics": run_metrics(results),
            "train_tokens_per_s": results.get("train_tokens_per_s"),
            "train_examples_per_s": results.get("train_examples_per_s"),
            "wall_seconds": results.get("wall_seconds"), "confusion_matrix": results.get("confusion_matrix"),
            "_results": results}


def pooled_confusion(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The runs' confusion matrices summed cell by cell, per evaluated file ({"labels", "runs", "dev", ...}); None
    when a run has none (not a classifier) or their labels differ."""
    matrices = [run.get("confusion_matrix") for run in runs]
    if not matrices or any(not m for m in matrices) or any(m["labels"] != matrices[0]["labels"] for m in matrices):
        return None
    names = [k for k in matrices[0] if k != "labels" and all(k in m for m in matrices)]
    return {"labels": matrices[0]["labels"], "runs": len(matrices),
            **{k: np.sum([m[k] for m in matrices], axis=0).tolist() for k in names}}


def card_from_runs(run_dirs: Sequence[str | os.PathLike], root: str | os.PathLike | None = None,
                   name: str | None = None) -> dict[str, Any]:
    """The card of finished run directories (each with results.json), grouped into settings by learning rate.

    root: the sweep directory (run paths are stored relative to it). name: the card's row name in a merged
    table (default: the model directory's name). Returns the card dict (see the module docstring); ValueError
    when the runs are of different tasks or models.
    """
    root = Path(root) if root is not None else None
    runs = [_run_entry(Path(d), root) for d in run_dirs]
    if not runs:
        raise ValueError("a card needs at least one finished run")
    first = runs[0]["_results"]
    what = ("kind", "task", "model_dir", "metric")
    for run in runs[1:]:
        other = {k: run["_results"].get(k) for k in what}
        if other != {k: first.get(k) for k in what}:
            raise ValueError(f"{run['dir']}: a run of another task or model ({other}) than {runs[0]['dir']}; a "
                             f"card summarises runs of one setting")
    metric = first["metric"]
    settings: dict[float, list[dict[str, Any]]] = {}
    for run in runs:
        settings.setdefault(run["learning_rate"], []).append(run)
    table = []
    for lr, group in sorted(settings.items(), key=lambda kv: kv[0] or 0.0):
        names = sorted({k for run in group for k in run["metrics"]}, key=lambda k: ("/" in k, k))
        stats = {k: summarize([run["metrics"][k] for run in group if k in run["metrics"]]) for k in names}
        throughput = {key: summarize([r[key] for r in group]) for key in ("train_tokens_per_s", "train_examples_per_s")
                      if all(_is_number(r[key]) for r in group)}
        wall = [r["wall_seconds"] for r in group if _is_number(r["wall_seconds"])]
        table.append({"learning_rate": lr, "seeds": [r["seed"] for r in group],
                      "runs": [{k: v for k, v in r.items() if k != "_results"} for r in group],
                      "stats": stats, "throughput": throughput, "wall_seconds": float(sum(wall)) if wall else None,
                      "confusion_matrix": pooled_confusion(group)})
    chosen = max(table, key=lambda s: s["stats"][metric]["median"])
    task = first.get("task") or first.get("kind")
    wall = [s["wall_seconds"] for s in table if s["wall_seconds"] is not None]
    return {"name": name or Path(str(first.get("model_dir", "model"))).name, "kind": first.get("kind"),
            "task": task, "model_dir": first.get("model_dir"), "train": first.get("train"), "dev": first.get("dev"),
            "metric": metric, "runs": len(runs), "statistics": STATISTICS,
            "chosen": {"learning_rate": chosen["learning_rate"], "by": f"highest median dev {metric}"},
            "stats": chosen["stats"], "throughput": chosen["throughput"],
            "confusion_matrix": chosen["confusion_matrix"],
            "wall_seconds": float(sum(wall)) if wall else None, "settings": table}


# ------------------------------------------------------------------------------------------------------------------
# Writing and reading cards
# ------------------------------------------------------------------------------------------------------------------
def _f(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def card_markdown(card: dict[str, Any]) -> str:
    """card.md: the chosen setting's statistics per metric, then one line per setting and one per run."""
    lines = [f"# {card['name']}: {card['task']} ({card['runs']} runs)", "",
             f"Model `{card['model_dir']}`, train `{card['train']}`, dev `{card['dev']}`. Chosen: learning rate "
             f"{card['chosen']['learning_rate']:g} ({card['chosen']['by']}).", "",
             "| metric | median | mean | std | min | max | q1 | q3 | IQR | n |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, s in card["stats"].items():
        lines.append(f"| {key} | " + " | ".join(_f(s[k]) for k in ("median", "mean", "std", "min", "max", "q1", "q3",
                                                                       "iqr")) + f" | {s['n']} |")
    tp = card["throughput"].get("train_tokens_per_s")
    ex = card["throughput"].get("train_examples_per_s")
    lines += ["", f"Training throughput (median over runs): {_f(tp and tp['median'], 0)} tokens/s, "
                  f"{_f(ex and ex['median'], 1)} examples/s; wall time of all runs: {_f(card['wall_seconds'], 0)} s.",
              "", "| learning rate | seeds | " + f"median {card['metric']} | IQR |", "|---|---|---|---|"]
    for s in card["settings"]:
        m = s["stats"][card["metric"]]
        lines.append(f"| {s['learning_rate']:g} | {','.join(map(str, s['seeds']))} | {_f(m['median'])} | "
                     f"{_f(m['iqr'])} |")
    confusion = card.get("confusion_matrix")
    for name in [k for k in (confusion or {}) if k not in ("labels", "runs")]:
        labels = confusion["labels"]
        lines += ["", f"Confusion matrix, {name}, summed over the chosen setting's {confusion['runs']} runs "
                      f"(rows: gold, columns: predicted):", "", "| gold \\ predicted | " + " | ".join(labels) + " |",
                  "|---|" + "---|" * len(labels)]
        lines += [f"| {label} | " + " | ".join(map(str, row)) + " |" for label, row in zip(labels, confusion[name])]
    lines += ["", "| run | seed | lr | best epoch | " + " | ".join(card["stats"]) + " |",
              "|---|---|---|---|" + "---|" * len(card["stats"])]
    for s in card["settings"]:
        for run in s["runs"]:
            lines.append(f"| {run['dir']} | {run['seed']} | {run['learning_rate']:g} | {run['best_epoch']} | "
                         + " | ".join(_f(run["metrics"].get(k)) for k in card["stats"]) + " |")
    return "\n".join(lines) + "\n"


def write_card(out_dir: str | os.PathLike, card: dict[str, Any]) -> Path:
    """card.json and card.md of a card, or of a merged table (`merge_cards`), into out_dir (atomically); returns
    card.json's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / CARD_MD, merged_markdown(card) if "rows" in card else card_markdown(card))
    atomic_write(out_dir / CARD_JSON, json.dumps(card, indent=2) + "\n")
    return out_dir / CARD_JSON


def find_runs(sweep_dir: str | os.PathLike) -> list[Path]:
    """Finished run directories under a sweep directory (any depth: seedN, lrX/seedN), sorted; the directory
    itself when it is one run."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / RESULTS).is_file():
        return [sweep_dir]
    return sorted(p.parent for p in sweep_dir.rglob(RESULTS) if p.parent.parent.name != "model")


def read_card(path: str | os.PathLike, name: str | None = None) -> dict[str, Any]:
    """The card of a sweep directory (recomputed from its runs; named as its card.json says unless `name` is
    given), a single run directory (a card of one run), or a card.json file (or a directory holding only one)
    whose runs are gone. FileNotFoundError naming the path when it holds none of these."""
    path = Path(path)
    if path.is_file() and path.name.endswith(".json"):
        card = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(card, dict) or "stats" not in card:
            raise DataError(f"{path}: not a card (no 'stats')")
        return {**card, "name": name or card["name"]}
    runs = find_runs(path) if path.is_dir() else []
    written = path / CARD_JSON if path.is_dir() else None
    if not runs:
        if written is not None and written.is_file():
            return read_card(written, name)
        raise FileNotFoundError(f"{path}: no {CARD_JSON}, {RESULTS} or run directories with one")
    if name is None and written is not None and written.is_file():  # the sweep's own name (finetune --name)
        name = json.loads(written.read_text(encoding="utf-8")).get("name")
    return card_from_runs(runs, root=path, name=name or (path.name if len(runs) > 1 else None))


# ------------------------------------------------------------------------------------------------------------------
# Tables of cards
# ------------------------------------------------------------------------------------------------------------------
def merge_cards(cards: Sequence[dict[str, Any]], metrics: Sequence[str] | None = None) -> dict[str, Any]:
    """One table of several cards: rows are the cards' names (models, variants), columns `task: metric` for every
    metric of `metrics` (default: each card's selection metric and its extra files' versions of it) a card has.

    Returns {"rows": [...], "columns": [...], "cells": {row: {column: stats}}, "cards": [...]}; a cell a row
    lacks is absent. Two cards of one name and task are refused (ValueError).
    """
    rows: list[str] = []
    columns: list[str] = []
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for card in cards:
        wanted = list(metrics) if metrics else [k for k in card["stats"] if k.split("/")[-1] == card["metric"]]
        if card["name"] not in rows:
            rows.append(card["name"])
        for key in wanted:
            if key not in card["stats"]:
                continue
            file, _, metric = key.rpartition("/")
            column = f"{card['task']}{' (' + file + ')' if file else ''}: {metric}"
            if column in cells.get(card["name"], {}):
                raise ValueError(f"two cards named {card['name']!r} for {column}; name them apart (NAME=DIR)")
            if column not in columns:
                columns.append(column)
            cells.setdefault(card["name"], {})[column] = card["stats"][key]
    return {"rows": rows, "columns": columns, "cells": cells,
            "cards": [{k: card[k] for k in ("name", "task", "metric", "model_dir", "runs", "chosen", "throughput",
                                            "wall_seconds", "confusion_matrix") if k in card} for card in cards]}


def merged_markdown(table: dict[str, Any]) -> str:
    """The merged table as markdown: median [q1, q3] (min-max, n) per cell."""
    lines = ["| model | " + " | ".join(table["columns"]) + " |", "|---|" + "---|" * len(table["columns"])]
    for row in table["rows"]:
        cells = []
        for column in table["columns"]:
            s = table["cells"].get(row, {}).get(column)
            cells.append("-" if s is None else f"{s['median']:.3f} [{s['q1']:.3f}, {s['q3']:.3f}] "
                                               f"({s['min']:.3f}-{s['max']:.3f}, n={s['n']})")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return ("\n".join(lines) + "\n\nEach cell: median [first quartile, third quartile] (min-max, number of runs) of "
            "the chosen setting.\n")
