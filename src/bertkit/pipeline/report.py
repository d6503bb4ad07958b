"""The pipeline's report page: one self-contained HTML file (figures embedded as base64 PNG, styles inline).

`write_report(report, run_dir, html_path, plots_dir)` takes the report dict that `bertkit.pipeline.run_pipeline`
builds, draws the figures from the pretraining run's `metrics.jsonl` and the label-efficiency curve in the report,
writes each as a PNG into `plots_dir` and embeds the same bytes in the page. The page opens from disk with no
network and no other file: the label-efficiency curve and its table first (pretrained vs random initialisation,
median and interquartile range over seeds at each label count), then the machine and plan, corpus and model
summary, the held-out curves, fill-mask by frequency band with examples from the middle band, and the commands
that redo each stage. The machine (CPU model and flags, GPU) is named beside every figure. Figure text in a script
no installed font draws is kept out of the images (`bertkit.pipeline.plots.figure_text`).

matplotlib (`pip install matplotlib`) draws the figures; without it the page is written without them and says so.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertkit.pipeline.plots import (METRICS_FILE, collect_series, figure_classes, figure_text, font_context,
                                    read_metrics)

# (file stem, title) of every figure, in page order.
FIGURES = {
    "label_efficiency": "Label efficiency: dev accuracy against the number of labels, pretrained vs random "
                        "initialisation, frozen and fine-tuned (median over seeds, bars: interquartile range, dots: "
                        "each seed)",
    "heldout_accuracy": "Held-out masked-token accuracy during pretraining",
    "heldout_perplexity": "Held-out masked-LM perplexity during pretraining (log scale)",
    "training_loss": "Masked-LM loss during pretraining: training (mean over each logging window) and held-out",
}


# ------------------------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------------------------
def _png(draw: Callable[[Any], None], size: tuple[float, float] = (7.0, 3.8)) -> bytes:
    """PNG bytes of one axes drawn by `draw(ax)` (matplotlib's object API on the Agg canvas: the calling
    process's global backend is left alone)."""
    Figure, FigureCanvasAgg = figure_classes()
    with font_context():  # any Hangul or CJK text falls back to an installed font that has it
        fig = Figure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        draw(ax)
        ax.grid(True, alpha=0.3, which="both")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def draw_label_efficiency(ax, finetune: dict[str, Any], machine: dict[str, Any] | None = None) -> None:
    """The label-efficiency curve on `ax`: per starting point the median dev accuracy over seeds at each label
    count (labels on a log axis), a bar over the interquartile range, each seed as a faint dot; where the frozen
    points have it, the baseline (random initialisation fine-tuned on the same label sets) dotted; the majority
    class as a dashed line; the machine in the title. Every text drawn is ASCII or passes `figure_text`."""
    curve = finetune["curve"]
    frozen = [p["labels"] for p in curve if p.get("frozen")]
    encoder = f" (frozen encoder up to {max(frozen):,} labels)" if frozen else ""
    series = (("pretrained", f"pretrained{encoder}"), ("scratch", f"random initialisation{encoder}"),
              ("scratch_finetuned", "random initialisation, fine-tuned"))
    for (name, label), color, shift, style in zip(series, ("tab:blue", "tab:orange", "tab:green"),
                                                  (0.97, 1.03, 1.0), ("-", "-", ":")):
        points = [p for p in curve if p.get(name)]
        if not points:
            continue
        xs = [p["labels"] for p in points]
        medians = [p[name]["median"] for p in points]
        ax.plot(xs, medians, marker="o", color=color, linewidth=2, linestyle=style, label=f"{label} (median)")
        for p in points:
            x = p["labels"] * shift  # the two starting points side by side, not on top of each other
            ax.plot([x, x], [p[name]["q1"], p[name]["q3"]], color=color, linewidth=5, alpha=0.45,
                    solid_capstyle="butt")
            ax.plot([x] * len(p[name]["values"]), p[name]["values"], ".", color=color, alpha=0.5, markersize=4)
    if finetune.get("majority_accuracy") is not None:
        ax.axhline(finetune["majority_accuracy"], color="grey", linestyle="--", linewidth=1, label="majority class")
    ax.set_xscale("log")
    ax.set_xticks([p["labels"] for p in curve], [f"{p['labels']:,}" for p in curve])
    ax.minorticks_off()
    ax.set_xlabel("labelled training examples (log scale)")
    ax.set_ylabel("dev accuracy")
    task = finetune.get("task", {})
    name = "built-in task" if task.get("name") in ("word-salad", "word-order", "docstring-package") else "your task"
    where = ""
    if machine:
        where = figure_text(machine.get("gpu") or machine.get("cpu") or "", "")
        where = f" on {where}" if where else ""
    ax.set_title(f"Label efficiency, {name}: pretrained vs random initialisation{where}", fontsize=9)
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small", loc="lower right")


def draw_figures(report: dict[str, Any], run_dir: str | os.PathLike) -> dict[str, bytes]:
    """{stem: PNG bytes} for the figures of `FIGURES` that have data (ImportError without matplotlib)."""
    series = collect_series(read_metrics(Path(run_dir) / METRICS_FILE))
    figures: dict[str, bytes] = {}
    rows = report.get("recipe", {}).get("eval_instances") or report.get("eval_rows")

    def titled(ax, stem: str, ylabel: str) -> None:
        ax.set_title(FIGURES[stem], fontsize=10)
        ax.set_xlabel("pretraining step")
        ax.set_ylabel(ylabel)

    if "eval_mlm_accuracy" in series:
        steps, values = series["eval_mlm_accuracy"]

        def accuracy(ax):
            ax.plot(steps, values, marker="o", markersize=4,
                    label=f"held-out text{f' (up to {rows} rows)' if rows else ''}")
            fill = report.get("fill_mask") or {}
            if fill.get("baseline_accuracy") is not None:
                ax.axhline(fill["baseline_accuracy"], color="grey", linestyle="--", linewidth=1,
                           label=f"always '{fill['baseline_word']}' (fill-mask prompts)")
            titled(ax, "heldout_accuracy", "accuracy of the masked tokens")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize="small")
        figures["heldout_accuracy"] = _png(accuracy)
    if "eval_perplexity" in series:
        steps, values = series["eval_perplexity"]

        def perplexity(ax):
            ax.plot(steps, values, marker="o", markersize=4, color="tab:red")
            ax.set_yscale("log")
            titled(ax, "heldout_perplexity", "perplexity (log scale)")
        figures["heldout_perplexity"] = _png(perplexity)
    train_key = "mlm_loss" if "mlm_loss" in series else ("loss" if "loss" in series else None)
    if train_key is not None or "eval_mlm_loss" in series:
        def loss(ax):
            if train_key is not None:
                ax.plot(*series[train_key], label=f"training {train_key.replace('_', ' ')}", linewidth=1)
            if "eval_mlm_loss" in series:
                ax.plot(*series["eval_mlm_loss"], marker="o", markersize=4, label="held-out mlm loss")
            titled(ax, "training_loss", "cross-entropy (nats)")
            ax.legend(fontsize="small")
        figures["training_loss"] = _png(loss)
    finetune = report.get("finetune") or {}
    if finetune.get("curve"):
        figures["label_efficiency"] = _png(lambda ax: draw_label_efficiency(ax, finetune, report.get("machine")),
                                           size=(7.5, 4.6))
    return {stem: figures[stem] for stem in FIGURES if stem in figures}  # page order


# ------------------------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------------------------
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1b1b1b; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; } th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; }
th { background: #f3f3f3; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.key { display: flex; flex-wrap: wrap; gap: 0.8em; margin: 1em 0; }
.key div { background: #f5f7fa; border: 1px solid #dde3ea; border-radius: 6px; padding: 0.6em 0.9em; }
.key b { display: block; font-size: 1.3em; }
figure { margin: 0.8em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 0.6em; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; white-space: pre-wrap; }
.ok { color: #0a7a2f; font-weight: bold; } .miss { color: #b00020; } .muted { color: #666; font-size: 0.9em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


class Markup(str):
    """A table cell that is already HTML."""


def _cell(value: Any) -> str:
    if isinstance(value, Markup):
        return f"<td>{value}</td>"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"<td class=\"num\">{_num(value, 1)}</td>"
    if isinstance(value, str) and value[:1].isdigit():  # a figure already formatted
        return f"<td class=\"num\">{_e(value)}</td>"
    return f"<td>{_e(value)}</td>"


def _table(header: list[str], rows: list[list[Any]], table_id: str | None = None) -> str:
    """An HTML table; numbers are right-aligned (ints with thousands separators, floats with one decimal: format
    other figures before)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    ident = f" id=\"{table_id}\"" if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(stem: str, figures: dict[str, bytes]) -> str:
    if stem not in figures:
        return ""
    data = base64.b64encode(figures[stem]).decode("ascii")
    return (f"<figure><img alt=\"{_e(FIGURES[stem])}\" src=\"data:image/png;base64,{data}\">"
            f"<figcaption class=\"muted\">{_e(FIGURES[stem])}</figcaption></figure>")


def _machine_line(machine: dict[str, Any]) -> str:
    """One line naming the machine, beside every figure."""
    return machine.get("summary") or machine.get("cpu") or "this machine"


def render_html(report: dict[str, Any], figures: dict[str, bytes], note: str = "") -> str:
    """The page for `report` (run_pipeline's dict) with `figures` ({stem: PNG bytes}) embedded."""
    where = _e(_machine_line(report.get("machine", {})))
    parts = (_key_figures(report, where, note) + _curve_section(report, figures, where)
             + _machine_section(report, where) + _corpus_section(report) + _model_section(report)
             + _pretraining_section(report, figures, where) + _fill_mask_section(report, where)
             + _files_section(report))
    return "\n".join(p for p in parts if p)


def _largest(ft: dict[str, Any]) -> str:
    """The largest label count run: all the labels, unless the budget skipped that point."""
    last = ft["curve"][-1]
    return (f"all {last['labels']:,} labels" if last["labels"] == ft["train_examples"]
            else f"{last['labels']:,} labels (all {ft['train_examples']:,}: skipped, out of time)")


def _key_figures(report: dict[str, Any], where: str, note: str) -> list[str]:
    """The page's head, title and the key figures above the curve."""
    ft, machine = report["finetune"], report.get("machine", {})
    first, last = ft["curve"][0], ft["curve"][-1]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>bertkit pipeline report"
             f"</title><style>{_STYLE}</style></head><body>",
             "<h1>bertkit pipeline: raw text → pretrained → fine-tuned with few and many labels → evaluated</h1>",
             f"<p class=\"muted\">{_e(report.get('minutes', '?'))} minutes on {where} ({_e(machine.get('device'))}, "
             f"{_e(report['precision'])}).{' ' + _e(note) if note else ''}</p>",
             "<div class=\"key\">",
             f"<div>dev accuracy with {first['labels']:,} labels, pretrained / random init<b>"
             f"{_num(first['pretrained']['median'])} / {_num(first['scratch']['median'])}</b>median of "
             f"{first['seeds']} seeds, gap {first['gap'] + 0.0:+.3f}</div>",
             (f"<div>random init fine-tuned on the same {first['labels']:,} labels<b>"
              f"{_num(first['scratch_finetuned']['median'])}</b>median of {len(first['scratch_finetuned']['values'])} "
              f"seed(s), pretrained {first['finetuned_gap'] + 0.0:+.3f}</div>" if first.get("scratch_finetuned")
              else ""),
             f"<div>with {_largest(ft)}<b>{_num(last['pretrained']['median'])} / "
             f"{_num(last['scratch']['median'])}</b>median of {last['seeds']} seed(s)</div>",
             f"<div>held-out masked-token accuracy<b>{_num(report['mlm_accuracy_before'])} → "
             f"{_num(report['mlm_accuracy_after'])}</b>{report['steps']:,} pretraining steps</div>",
             "</div>"]
    return parts


def _cell_iqr(s: dict[str, Any]) -> str:
    return f"{s['median']:.3f} [{s['q1']:.3f}–{s['q3']:.3f}]"


def _curve_rows(curve: list[dict[str, Any]], baseline: bool) -> list[list[Any]]:
    """The curve's table: per label count the seeds' medians and IQRs, the gap, the wins, the verdict; with
    `baseline`, random initialisation fine-tuned beside it."""
    def versus_tuned(p: dict[str, Any]) -> Any:
        if not p.get("scratch_finetuned"):
            return "—"
        t = p["scratch_finetuned"]
        return Markup(f"{_e(_cell_iqr(t))}, {len(t['values'])} seed(s): gap {p['finetuned_gap'] + 0.0:+.3f}"
                      + (", <span class=\"ok\">beyond both IQRs</span>" if p["finetuned_beyond_spread"] else ""))

    return [[f"{p['labels']:,}" + (" (frozen encoder)" if p.get("frozen") else ""), p["passes"], p["seeds"],
           _cell_iqr(p["pretrained"]), _cell_iqr(p["scratch"]),
           f"{p['gap'] + 0.0:+.3f}", f"{p['wins']} of {p['seeds']}",
           Markup("<span class=\"ok\">yes</span>" if p["beyond_spread"] else "no")]
          + ([versus_tuned(p)] if baseline else []) for p in curve]


def _curve_recipe(ft: dict[str, Any], where: str) -> str:
    """The paragraph above the curve: the task, how each point trains, what a point shows."""
    task, config, curve = ft["task"], ft["config"], ft["curve"]
    frozen = any(p.get("frozen") for p in curve)
    tuned = [p for p in curve if not p.get("frozen")]
    baseline = [p for p in curve if p.get("scratch_finetuned")]
    return (f"<p>Task: {_e(task['description'])}. {ft['train_examples']:,} training and {ft['dev_examples']:,} dev "
            f"{'pairs' if ft.get('pairs') else 'examples'}; {len(ft['labels'])} classes; always answering the "
            f"majority class scores {_num(ft['majority_accuracy'])}. Each point trains on a class-balanced "
            f"set of that many labelled examples (the smaller sets of a seed are subsets of the larger ones; each "
            f"seed draws its own), from the pretrained model and from the same architecture randomly initialised, "
            f"with the same recipe and seeds. "
            + (f"Label sets of at most {config['frozen_max_labels']:,} examples fit a logistic regression "
               f"(L-BFGS to convergence, L2) on the standardised mean and maximum over the tokens of the frozen "
               f"encoder's last layer, for both starting points: so few sentences cannot say which of the "
               f"encoder's weights to move. On a frozen random encoder that regression reads a random network's "
               f"features: on a task that a bag of words cannot solve (the built-in one) it is at chance by "
               f"construction, so it is not the baseline a reader expects. " if frozen else "")
            + (f"That baseline is the last column: random initialisation fine-tuned on the same label sets, with "
               f"learning rate {config['learning_rate']:g} ({baseline[0]['scratch_finetuned']['passes']} passes "
               f"over {baseline[0]['labels']:,} labels), against the pretrained model's regression. "
               if baseline else "")
            + (f"{'Larger ones' if frozen else 'Each'} fine-tune the whole model: learning rate "
               f"{config['learning_rate']:g}, batch {config['batch_size']}, dropout {config['dropout']}, length "
               f"{config['max_seq_length']}, {_e(config['precision'])}, at least {config['min_examples']:,} "
               f"examples seen per run (so {tuned[0]['passes']} passes over {tuned[0]['labels']:,} labels"
               + (f", {tuned[-1]['passes']} over {tuned[-1]['labels']:,}" if len(tuned) > 1 else "")
               + "), the dev set scored once at the end (no epoch picked on dev)." if tuned else "")
            + f" A point is the median over the seeds, with the "
            f"interquartile range in brackets. Measured on {where}.</p>")


def _curve_section(report: dict[str, Any], figures: dict[str, bytes], where: str) -> list[str]:
    """The centre of the story: the label-efficiency curve, its table and the claim it supports."""
    ft = report["finetune"]
    curve = ft["curve"]
    first, last = curve[0], curve[-1]
    baseline = any(p.get("scratch_finetuned") for p in curve)
    claim = ("pretraining pays already with the fewest labels, beyond the seeds' spread"
             if first["beyond_spread"] and first["gap"] > 0
             else f"{first['seeds']} seed(s) at the fewest labels: too few for a spread, so no claim"
             if first["seeds"] < 3
             else "at this budget the gap at the fewest labels is within the seeds' spread: no clear claim"
             if not first["beyond_spread"] else "random initialisation does better at the fewest labels")
    return ["<h2 id=\"label-efficiency\">Label efficiency: pretrained vs random initialisation</h2>",
          _curve_recipe(ft, where),
          _figure("label_efficiency", figures),
          _table(["labels", "passes", "seeds", "pretrained: median [IQR]", "random init: median [IQR]",
                  "gap of medians", "pretrained ahead", "gap beyond both IQRs"]
                 + (["random init fine-tuned: median [IQR], gap"] if baseline else []), _curve_rows(curve, baseline),
                 table_id="label-efficiency-table"),
          f"<p><b>{_e(claim[0].upper() + claim[1:])}</b>: with {first['labels']:,} labels the pretrained median "
          f"is {first['gap'] + 0.0:+.3f} from random initialisation's (pretrained ahead on {first['wins']} of "
          f"{first['seeds']} seeds)"
          + (f", {first['finetuned_gap'] + 0.0:+.3f} from random initialisation fine-tuned on the same label "
             f"sets ({'beyond' if first['finetuned_beyond_spread'] else 'not beyond'} both interquartile ranges; "
             f"ahead on {first['finetuned_wins']} of {first['finetuned_seeds']} seeds)"
             if first.get("scratch_finetuned") else "")
          + f"; with {_largest(ft)} the gap is {last['gap'] + 0.0:+.3f}.</p>"]


def _machine_section(report: dict[str, Any], where: str) -> list[str]:
    """The machine, the precision, the speed measured and the plan made from it, the stages' seconds."""
    machine, plan = report.get("machine", {}), report["plan"]
    load = machine.get("load_average_at_start")
    shared = (f" The load average was {load:.1f} at the start and {machine.get('load_average_at_end') or 0:.1f} at "
              f"the end on {machine.get('cores')} cores: other work shared the machine, so the speeds are lower than "
              f"it gives alone." if load is not None and machine.get("cores") and load > 0.5 * machine["cores"]
              else "")
    starts = plan.get("starts") or [2] * len(plan["ladder"])  # runs per seed: both starting points, or one
    return ["<h2 id=\"machine\">Machine, precision and plan</h2>",
            f"<p>{where}. <b>{_e(report['precision'])}</b>: {_e(report['precision_reason'])}. Measured before "
            f"pretraining: {report['speed']['tokens_per_s']:,.0f} tokens/s ({report['speed']['step_s']:.3f} s per "
            f"step of {report['speed']['tokens_per_step']:,.0f} tokens); from it the plan: pretraining "
            f"{plan['pretrain_s'] / 60:.1f} minutes, then "
            + _e(", ".join(f"{n:,} labels x {k} seed{'s' if k > 1 else ''}"
                           for n, k, m in zip(plan['ladder'], plan['seeds'], starts) if m == 2))
            + " for each starting point"
            + _e("; random initialisation fine-tuned beside the frozen points: "
                 + (", ".join(f"{n:,} labels x {k}" for n, k, m in zip(plan['ladder'], plan['seeds'], starts)
                              if m == 1 and k) or "none planned") if 1 in starts else "")
            + f" (~{plan['finetune_s'] / 60:.1f} minutes).{_e(shared)}</p>",
            _table(["stage", "seconds"], [[k, v] for k, v in report.get("timings", {}).items()])]


def _corpus_section(report: dict[str, Any]) -> list[str]:
    """The corpus's splits and the vocabulary."""
    summary = report.get("corpus_summary", {})
    norm = report.get("normalisation", {})
    return ["<h2 id=\"corpus\">Corpus and vocabulary</h2>",
            f"<p>{_e(', '.join(report['corpus']))}; a WordPiece vocabulary of {report['vocab_size']:,} tokens "
            f"trained on it, {_e(norm.get('why', 'uncased'))}. Held-out documents are never trained on: the "
            f"held-out curves and the fill-mask prompts come from them.</p>",
            _table(["split", "documents", "sentences", "tokens"],
                   [[split, v["documents"], v["sentences"], v["tokens"]] for split, v in summary.items()])]


def _model_section(report: dict[str, Any]) -> list[str]:
    """The model's size and the pretraining recipe."""
    model = report["model_summary"]
    recipe = report["recipe"]
    return ["<h2 id=\"model\">Model and recipe</h2>",
            _table(["preset", "layers", "hidden", "heads", "parameters"],
                   [[model["preset"], model["layers"], model["hidden"], model["heads"], model["parameters"]]]),
            f"<p>Recipe <code>{_e(recipe['name'])}</code>: masked LM only on packed rows of length "
            f"{recipe['max_seq_length']}, attention isolated between documents, {recipe['mask_prob']:.0%} of the "
            f"tokens predicted, batch {recipe['batch_size']}, peak learning rate {recipe['learning_rate']:g}, no "
            f"dropout.</p>"]


def _pretraining_section(report: dict[str, Any], figures: dict[str, bytes], where: str) -> list[str]:
    """Pretraining's steps, tokens and speed, the held-out figures and curves."""
    plan = report["plan"]
    return ["<h2 id=\"pretraining\">Pretraining</h2>",
            f"<p>{report['steps']:,} steps, {report['train_tokens']:,} tokens, {report['tokens_per_s']:,.0f} "
            f"tokens/s over the run (held-out evaluations included) on {where}. Held-out evaluation every "
            f"{plan['eval_every']:,} steps ({report['eval_points']} points): masked-token accuracy "
            f"{_num(report['mlm_accuracy_before'])} → {_num(report['mlm_accuracy_after'])}, perplexity "
            f"{_num(report['perplexity_before'], 0)} → {_num(report['perplexity_after'], 1)}.</p>",
            "<div class=\"figures\">" + _figure("heldout_accuracy", figures) + _figure("heldout_perplexity", figures)
            + "</div>", _figure("training_loss", figures)]


def _fill_mask_section(report: dict[str, Any], where: str) -> list[str]:
    """Fill-mask on held-out text: by frequency band beside the frequency baseline, examples, the user's probes."""
    fill = report["fill_mask"]
    bands = [[b["band"], b["prompts"], _num(b["top1_accuracy"]), _num(b["top5_accuracy"]),
              _num(b["baseline_top1"]), _num(b["baseline_top5"])] for b in fill.get("bands", [])]
    examples = []
    for ex in fill["examples"]:
        candidates = ", ".join(f"{t} ({p:.2f})" for t, p in ex["candidates"])
        mark = Markup("<span class=\"ok\">✓</span>" if ex["correct"] else "<span class=\"miss\">✗</span>")
        examples.append([ex["prompt"], Markup(f"<b>{_e(ex['answer'])}</b>"), ex.get("band", ""), candidates, mark])
    parts = ["<h2 id=\"fill-mask\">Fill-mask on held-out text</h2>",
             f"<p>{fill['prompts']:,} prose sentences from held-out documents (6 to 60 pieces, at least 80% of "
             f"them letters), one word of one vocabulary piece masked in each (chosen at random), the sentence alone "
             f"as input: top-1 accuracy <b>{_num(fill['top1_accuracy'])}</b>, top-5 {_num(fill['top5_accuracy'])}; "
             f"always answering the corpus's most frequent word '{_e(fill['baseline_word'])}' scores "
             f"{_num(fill['baseline_accuracy'])}. By the masked word's frequency rank in the training text, beside "
             f"the frequency baseline (always the band's most frequent word, or its five most frequent, for "
             f"top-5), on {where}:</p>",
             _table(["frequency band", "prompts", "top-1", "top-5", "frequency baseline top-1",
                     "frequency baseline top-5"], bands, table_id="fill-mask-bands"),
             f"<p>The first {len(fill['examples'])} prompts drawn whose word is in the 100-1,000 band (words a "
             f"unigram model does not get; not chosen by outcome):</p>",
             _table(["held-out sentence", "true word", "band", "model's top 5 (probability)", "top-1"], examples,
                    table_id="fill-mask-table")]
    if report.get("probes"):
        parts.append(_table(["your sentence", "model's top 5 (probability)"],
                            [[text, ", ".join(f"{t} ({p:.2f})" for t, p in c)]
                             for text, c in report["probes"].items()]))
    return parts


def _files_section(report: dict[str, Any]) -> list[str]:
    """The commands that redo each stage, and where the run's files are."""
    parts = ["<h2 id=\"reproduce\">Reproduce each stage</h2>",
             "<p>The same stages with the separate verbs (the pipeline ran these settings):</p>"]
    for stage, command in report.get("commands", []):
        parts.append(f"<p class=\"muted\">{_e(stage)}</p><pre>{_e(command)}</pre>")
    models = report["finetune"].get("models", {})
    parts += ["<h2 id=\"files\">Files</h2>",
              _table(["what", "where"], [["pretrained model (fill-mask)", report["model"]],
                                         ["fine-tuned on all labels", models.get("pretrained", "")],
                                         ["fine-tuned on all labels from random initialisation",
                                          models.get("scratch", "")],
                                         ["pretraining metrics", str(Path(report["model"]).parent / METRICS_FILE)],
                                         ["this report as JSON", str(Path(report["report"]).with_suffix(".json"))]]),
              "</body></html>"]
    return parts


def write_report(report: dict[str, Any], run_dir: str | os.PathLike, html_path: str | os.PathLike,
                 plots_dir: str | os.PathLike) -> list[Path]:
    """Draw the figures into `plots_dir` (PNG) and write the page to `html_path` with them embedded; return the
    PNG paths. Without matplotlib the page is written without figures (and says so) and [] is returned."""
    note = ""
    try:
        figures = draw_figures(report, run_dir)
    except ImportError:
        figures, note = {}, "no figures: matplotlib is not installed (pip install matplotlib)"
    written = []
    if figures:
        plots = Path(plots_dir)
        plots.mkdir(parents=True, exist_ok=True)
        for stem, png in figures.items():
            path = plots / f"{stem}.png"
            path.write_bytes(png)
            written.append(path)
    Path(html_path).write_text(render_html(report, figures, note), encoding="utf-8")
    return written
