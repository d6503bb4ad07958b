"""Training curves as PNG files, drawn from a run's `metrics.jsonl`.

The trainer appends one JSON object per line to `run_dir/metrics.jsonl`: training lines carry `step` and keys such
as `loss`, `mlm_loss`, `mlm_accuracy`, `lr`, `tokens_per_s`; evaluation lines carry `step` and keys starting with
`eval_`. `plot_run` draws every numeric key it finds, one figure per group:

    loss.png        training keys containing "loss" (loss, mlm_loss, nsp_loss, ...), on one axis
    accuracy.png    training keys containing "accuracy" or "acc"
    lr.png          the learning rate(s)
    throughput.png  rates: keys ending in "_per_s" / "_per_sec", or "throughput", each on its own axis (units differ)
    eval.png        every `eval_*` key: losses on one axis, accuracies on another, anything else on its own
    other.png       any remaining numeric training key (grad_norm, epoch, ...), each on its own axis

A figure is written only when its group has data. matplotlib is optional (`pip install matplotlib`) and imported
only when a figure is drawn; its object-oriented API with the Agg canvas is used, so the global backend of the
calling process (a notebook, say) is left untouched.
"""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from bertkit.errors import DataError
from bertkit.io import atomic_write, read_json_lines

METRICS_FILE = "metrics.jsonl"
# Figure names in the order they are written (and returned).
GROUPS = ("loss", "accuracy", "lr", "throughput", "eval", "other")
# Kinds whose keys are drawn on one axis; other keys have units of their own.
_SHARED_AXIS = ("loss", "accuracy", "lr")
# Series with at most this many points are drawn with markers (evaluation curves are sparse).
_MARKER_MAX_POINTS = 50

Series = dict[str, tuple[list[float], list[float]]]  # key -> (steps, values)


# ------------------------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------------------------
def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a metrics file, one per non-blank line.

    A torn last line (cut short by a full disk or a kill mid-write) is left out, and said on stderr; the file is
    not changed (the trainer removes such a line when the run resumes). Raises FileNotFoundError when the file is
    absent and DataError ("path:line: ...") for any other line that is not a JSON object or has no numeric `step`:
    damage in the middle of a run's record is a fact to report, not to paper over.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such metrics file")
    lines, torn = read_json_lines(path)
    if torn is not None:
        print(f"bertkit: {path}:{torn.line}: left out a torn last line ({torn.text!r}...), cut short by an "
              f"interrupted write", file=sys.stderr)
    records = []
    for number, record in lines:
        if not isinstance(record, dict):
            raise DataError.at(path, number, f"expected a JSON object, found {type(record).__name__}")
        if not _is_number(record.get("step")):
            raise DataError.at(path, number, "no numeric 'step' on this line")
        records.append(record)
    return records


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def collect_series(records: list[dict]) -> Series:
    """Every numeric key except `step` as (steps, values), sorted by step; non-finite values become NaN (a gap)."""
    series: Series = {}
    for record in records:
        step = float(record["step"])
        for key, value in record.items():
            if key == "step" or not _is_number(value):
                continue
            value = float(value)
            steps, values = series.setdefault(key, ([], []))
            steps.append(step)
            values.append(value if math.isfinite(value) else math.nan)
    for key, (steps, values) in series.items():
        order = sorted(range(len(steps)), key=steps.__getitem__)  # stable: a resumed run's repeats stay in order
        series[key] = ([steps[i] for i in order], [values[i] for i in order])
    return series


# ------------------------------------------------------------------------------------------------------------------
# Grouping
# ------------------------------------------------------------------------------------------------------------------
def kind(key: str) -> str | None:
    """What a metric measures, from its name: "loss", "accuracy", "lr", "throughput" or None (anything else)."""
    name = key.lower()
    words = name.split("_")
    if "loss" in name:
        return "loss"
    if "accuracy" in name or "acc" in words:
        return "accuracy"
    if name in ("lr", "learning_rate") or words[0] == "lr" or name.endswith("_lr"):
        return "lr"
    if name.endswith(("_per_s", "_per_sec", "_per_second")) or "throughput" in name:
        return "throughput"
    return None


def group_keys(keys) -> dict[str, list[list[str]]]:
    """Figure name -> its axes, each a list of keys drawn together. Only non-empty figures are present.

    Training keys go to the figure of their kind or to "other"; `eval_*` keys go to "eval". Losses, accuracies
    and learning rates share an axis per figure (same units); every other key gets an axis of its own.
    """
    figures: dict[str, dict[str, list[str]]] = {}
    for key in sorted(keys):
        evaluation = key.startswith("eval_")
        what = kind(key[len("eval_"):] if evaluation else key)
        figure = "eval" if evaluation else (what or "other")
        axis = what if what in _SHARED_AXIS else key
        figures.setdefault(figure, {}).setdefault(axis, []).append(key)
    return {name: list(figures[name].values()) for name in GROUPS if name in figures}


# ------------------------------------------------------------------------------------------------------------------
# Drawing
# ------------------------------------------------------------------------------------------------------------------
def matplotlib_parts() -> SimpleNamespace:
    """The parts of matplotlib that bertkit draws with: Figure, FigureCanvasAgg, font_manager, rcParams,
    rc_context, FT2Font. The one place bertkit imports matplotlib, on first use: it is optional (the `plots` extra);
    without it, ModuleNotFoundError saying how to install it."""
    try:  # optional dependency: the `plots` extra
        import matplotlib
        from matplotlib import font_manager
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ft2font import FT2Font
    except ModuleNotFoundError as err:  # the name travels, so the command line names the extra (bertkit.errors)
        raise ModuleNotFoundError("plotting needs matplotlib, which is not installed: pip install matplotlib "
                                  "(or pip install 'bertkit[plots]')", name=err.name) from None
    return SimpleNamespace(Figure=Figure, FigureCanvasAgg=FigureCanvasAgg, font_manager=font_manager,
                           rcParams=matplotlib.rcParams, rc_context=matplotlib.rc_context, FT2Font=FT2Font)


def figure_classes() -> tuple[type, type]:
    """(Figure, FigureCanvasAgg) of `matplotlib_parts`: figures drawn on the Agg canvas with the object API, so
    the calling process's global backend is left alone."""
    parts = matplotlib_parts()
    return parts.Figure, parts.FigureCanvasAgg


# Fonts that draw Hangul and CJK, in order of preference; every figure uses the first one installed as a fallback
# behind matplotlib's default (DejaVu Sans, which has neither). `make install` adds NanumGothic where it can.
CJK_FONTS = ("NanumGothic", "Noto Sans CJK KR", "Noto Sans CJK JP", "Noto Sans KR", "Source Han Sans KR",
             "UnDotum", "WenQuanYi Zen Hei", "Droid Sans Fallback")
_charmaps: dict[str, frozenset[int]] = {}
_scanned = False


def _charmap(path: str) -> frozenset[int]:
    if path not in _charmaps:
        _charmaps[path] = frozenset(matplotlib_parts().FT2Font(path).get_charmap())
    return _charmaps[path]


def figure_fonts() -> list[tuple[str, str]]:
    """(family, file) of the fonts figures draw with, in fallback order: matplotlib's default sans-serif, then the
    first installed font of `CJK_FONTS`."""
    parts = matplotlib_parts()
    font_manager, rcParams = parts.font_manager, parts.rcParams
    global _scanned
    if not _scanned:
        # matplotlib's font list is cached on first use: a font installed since (by `make install`) is added here.
        _scanned = True
        known = {font.name for font in font_manager.fontManager.ttflist}
        if not known & set(CJK_FONTS):
            for path in font_manager.findSystemFonts():
                if Path(path).stem.lower().startswith(("nanumgothic", "notosanscjk", "notosanskr")):
                    try:
                        font_manager.fontManager.addfont(path)
                    except (OSError, RuntimeError):  # a file FreeType cannot read: not ours to fix
                        pass
    fonts = []
    for family in (rcParams["font.sans-serif"][0], *CJK_FONTS):
        try:
            path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
        except ValueError:  # not installed
            continue
        fonts.append((family, path))
        if family in CJK_FONTS:
            break
    return fonts


def drawable(text: str) -> bool:
    """True when the figure fonts (`figure_fonts`) have a glyph for every character of `text` (whitespace aside):
    text that is not drawable would come out as empty boxes, with matplotlib's "Glyph ... missing" warning."""
    covered = [_charmap(path) for _, path in figure_fonts()]
    return all(c.isspace() or any(ord(c) in m for m in covered) for c in text)


def figure_text(text: str, fallback: str) -> str:
    """`text` where the figure fonts draw all of it, else `fallback` (which should be plain ASCII): a label in a
    script no installed font covers is kept out of the image rather than drawn as boxes."""
    return text if drawable(text) else fallback


def font_context():
    """A matplotlib rc context in which text falls back from the default font to an installed CJK/Hangul font
    (glyph by glyph), so figures created and saved inside it draw those scripts."""
    return matplotlib_parts().rc_context({"font.family": [family for family, _ in figure_fonts()]})


_TITLES = {"loss": "Training loss (mean over each logging window)", "accuracy": "Training accuracy",
           "lr": "Learning rate schedule", "throughput": "Training throughput",
           "eval": "Held-out evaluation (perplexity on a log axis)", "other": "Other training metrics"}


def _draw(name: str, axes_keys: list[list[str]], series: Series, path: Path) -> None:
    with font_context():
        _draw_in_context(name, axes_keys, series, path)


def _draw_in_context(name: str, axes_keys: list[list[str]], series: Series, path: Path) -> None:
    Figure, FigureCanvasAgg = figure_classes()
    n = len(axes_keys)
    cols = 1 if n == 1 else 2
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(7 if cols == 1 else 11, 4 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(_TITLES[name])
    for i, keys in enumerate(axes_keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        for key in keys:
            steps, values = series[key]
            ax.plot(steps, values, label=key, marker="o" if len(steps) <= _MARKER_MAX_POINTS else None,
                    markersize=3)
        ax.set_xlabel("step")
        if name == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if all("perplexity" in key for key in keys):  # spans orders of magnitude: the late gains would be flat
            ax.set_yscale("log")
        if len(keys) == 1 and n > 1:
            ax.set_title(keys[0] + (" (log scale)" if "perplexity" in keys[0] else ""))
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    fig.savefig(path, format="png", dpi=100)


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Draw the curves of `run_dir/metrics.jsonl` into PNG files; return their paths (in `GROUPS` order).

    out_dir: where to write them, default `run_dir/plots` (created if needed). Only figures with data are
    written (see the module docstring for the grouping). Raises FileNotFoundError without a metrics file,
    DataError naming file:line for a malformed line, ImportError when matplotlib is not installed.
    """
    run_dir = Path(run_dir)
    series = collect_series(read_metrics(run_dir / METRICS_FILE))
    figures = group_keys(series)
    if not figures:
        return []
    figure_classes()  # fail before creating out_dir
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, axes_keys in figures.items():
        path = out / f"{name}.png"
        _draw(name, axes_keys, series, path)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------------------------
# Result cards and confusion matrices
# ------------------------------------------------------------------------------------------------------------------
def plot_card(table: dict, path: str | os.PathLike) -> Path:
    """Draw a merged card (`bertkit.tasks.card.merge_cards`) as dot-and-whisker plots, one panel per column (task:
    metric): for every row (model, variant) a dot at the median, a thick bar over the interquartile range and a
    thin whisker from min to max. Returns the PNG's path."""
    Figure, FigureCanvasAgg = figure_classes()
    with font_context():
        return _plot_card(table, path, Figure, FigureCanvasAgg)


def _plot_card(table: dict, path, Figure, FigureCanvasAgg) -> Path:
    columns, rows = table["columns"], table["rows"]
    if not columns:
        raise ValueError("the card has no column to draw")
    n = len(columns)
    cols = min(n, 3)
    fig = Figure(figsize=(4.2 * cols, (1.2 + 0.45 * len(rows)) * math.ceil(n / cols)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, column in enumerate(columns):
        ax = fig.add_subplot(math.ceil(n / cols), cols, i + 1)
        for y, row in enumerate(rows):
            s = table["cells"].get(row, {}).get(column)
            if s is None:
                continue
            ax.plot([s["min"], s["max"]], [y, y], color="0.5", linewidth=1)
            ax.plot([s["q1"], s["q3"]], [y, y], color="C0", linewidth=5, solid_capstyle="butt")
            ax.plot([s["median"]], [y], "o", color="C3", markersize=6)
        shown = [figure_text(str(r), f"row {k + 1}") for k, r in enumerate(rows)]
        ax.set_yticks(range(len(rows)), shown if i % cols == 0 else [""] * len(rows))
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.invert_yaxis()
        ax.set_title(figure_text(str(column), f"column {i + 1}"), fontsize="medium")
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle("median (dot), interquartile range (bar), min-max (whisker)", fontsize="small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def plot_confusion(matrices: dict, path: str | os.PathLike, title: str = "") -> Path:
    """Draw confusion matrices ({"labels": [...], NAME: rows = gold, columns = predicted, ...}, as results.json
    and cards hold them) as annotated heat maps, one panel per NAME (dev, each extra file), gold on the vertical
    axis and predictions across. Returns the PNG's path."""
    Figure, FigureCanvasAgg = figure_classes()
    with font_context():
        return _plot_confusion(matrices, path, title, Figure, FigureCanvasAgg)


def _plot_confusion(matrices: dict, path, title: str, Figure, FigureCanvasAgg) -> Path:
    # A label no installed font draws is shown by its number (the order of matrices["labels"]).
    labels = [figure_text(str(x), str(i)) for i, x in enumerate(matrices["labels"])]
    title = figure_text(title, "")
    names = [k for k in matrices if k not in ("labels", "runs")]
    size = max(3.2, 0.6 * len(labels) + 2)
    fig = Figure(figsize=(size * len(names), size), layout="constrained")
    FigureCanvasAgg(fig)
    for i, name in enumerate(names):
        counts = matrices[name]
        ax = fig.add_subplot(1, len(names), i + 1)
        ax.imshow(counts, cmap="Blues")
        top = max(max(row) for row in counts) or 1
        for r, row in enumerate(counts):
            for c, value in enumerate(row):
                ax.text(c, r, str(value), ha="center", va="center", color="white" if value > top / 2 else "black")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xlabel("predicted label")
        ax.set_ylabel("true label")
        ax.set_title(name + (f" (summed over {matrices['runs']} runs)" if "runs" in matrices else ""),
                     fontsize="medium")
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


# ------------------------------------------------------------------------------------------------------------------
# Layer distances (the ALBERT paper's equilibrium figure)
# ------------------------------------------------------------------------------------------------------------------
def plot_layer_distances(results: list[dict], names: list[str], path: str | os.PathLike) -> Path:
    """Draw `bertkit.pipeline.analyze.layer_distances` results of several models side by side: the L2 distance and the
    cosine distance (1 - cos) between each layer's input and output embeddings against the layer, one line per
    model (as figure 1 of the ALBERT paper). Written atomically; returns the PNG's path."""
    Figure, FigureCanvasAgg = figure_classes()
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (key, label) in enumerate((("l2", "L2 distance"), ("cosine_distance", "cosine distance (1 - cos)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for name, result in zip(names, results):
            ax.plot(range(1, result["layers"] + 1), result[key], marker="o", markersize=4, label=name)
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.set_title(f"{label} between each layer's input and output", fontsize="medium")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write(path, buffer.getvalue())
    return path
