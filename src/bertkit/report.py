"""The pipeline's report page: one self-contained HTML file (figures embedded as base64 PNG, styles inline).

`write_report(report, run_dir, html_path, plots_dir)` takes the report dict that `bertkit.pipeline.run_pipeline`
builds, draws the figures from the pretraining run's `metrics.jsonl` and the fine-tuning curves in the report,
writes each as a PNG into `plots_dir` and embeds the same bytes in the page. The page opens from disk with no
network and no other file: corpus and model summary, the held-out curves, the pretrained-vs-random-initialisation
table, the fill-mask examples and the commands that redo each stage.

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

from bertkit.plots import METRICS_FILE, collect_series, read_metrics

# (file stem, title) of every figure, in page order.
FIGURES = {
    "heldout_accuracy": "Held-out masked-token accuracy during pretraining",
    "heldout_perplexity": "Held-out masked-LM perplexity during pretraining (log scale)",
    "training_loss": "Masked-LM loss during pretraining: training (mean over each logging window) and held-out",
    "finetune_accuracy": "Fine-tuning: dev accuracy per epoch, pretrained vs random initialisation (thin: each seed)",
}


# ------------------------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------------------------
def _png(draw: Callable[[Any], None], size: tuple[float, float] = (7.0, 3.8)) -> bytes:
    """PNG bytes of one axes drawn by `draw(ax)` (matplotlib's object API on the Agg canvas: the calling
    process's global backend is left alone)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    draw(ax)
    ax.grid(True, alpha=0.3, which="both")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


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
    if finetune.get("pretrained", {}).get("curve") and finetune.get("scratch", {}).get("curve"):
        def curves(ax):
            for (name, label), color in zip((("pretrained", "pretrained"), ("scratch", "random initialisation")),
                                            ("tab:blue", "tab:orange")):
                for run in finetune[name].get("runs", []):  # each seed thin, their mean bold
                    if run["curve"]:
                        ax.plot(*zip(*run["curve"]), color=color, alpha=0.35, linewidth=1)
                epochs, accuracy = zip(*finetune[name]["curve"])
                seeds = len(finetune[name].get("runs", [])) or 1
                ax.plot(epochs, accuracy, marker="o", color=color, linewidth=2,
                        label=f"{label} (mean of {seeds} seed{'s' if seeds > 1 else ''})")
            if finetune.get("majority_accuracy") is not None:
                ax.axhline(finetune["majority_accuracy"], color="grey", linestyle="--", linewidth=1,
                           label="majority class")
            ax.set_title(FIGURES["finetune_accuracy"], fontsize=10)
            ax.set_xlabel("epoch")
            ax.set_ylabel("dev accuracy")
            ax.set_ylim(0, 1)
            ax.legend(fontsize="small")
        figures["finetune_accuracy"] = _png(curves)
    return figures


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


def _first_epoch(pre: dict[str, Any], scr: dict[str, Any]) -> str:
    """The two mean curves at the first evaluation, when both have it: how much of a head start pretraining gives."""
    if not pre.get("curve") or not scr.get("curve") or pre["curve"][0][0] != scr["curve"][0][0]:
        return ""
    (epoch, a), (_, b) = pre["curve"][0], scr["curve"][0]
    return (f" After {'the first epoch' if epoch == 1 else f'{epoch:g} epochs'}: {a:.3f} pretrained, {b:.3f} from "
            f"random initialisation (mean of the seeds).")


def render_html(report: dict[str, Any], figures: dict[str, bytes], note: str = "") -> str:
    """The page for `report` (run_pipeline's dict) with `figures` ({stem: PNG bytes}) embedded."""
    ft, fill, machine = report["finetune"], report["fill_mask"], report.get("machine", {})
    model, plan = report["model_summary"], report["plan"]
    pre, scr = ft["pretrained"], ft["scratch"]
    gain = round(pre["accuracy"] - scr["accuracy"], 3) + 0.0  # + 0.0 turns -0.0 into 0.0: no "-0.000"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>bertkit pipeline report"
             f"</title><style>{_STYLE}</style></head><body>",
             "<h1>bertkit pipeline: raw text → pretrained → fine-tuned → evaluated</h1>",
             f"<p class=\"muted\">{_e(report.get('minutes', '?'))} minutes on "
             f"{_e(machine.get('cpu') or 'this machine')} ({_e(machine.get('threads'))} threads, "
             f"{_e(machine.get('device'))}).{' ' + _e(note) if note else ''}</p>",
             "<div class=\"key\">",
             f"<div>held-out masked-token accuracy<b>{_num(report['mlm_accuracy_before'])} → "
             f"{_num(report['mlm_accuracy_after'])}</b></div>",
             f"<div>fine-tuned dev accuracy, pretrained / random init<b>{_num(pre['accuracy'])} / "
             f"{_num(scr['accuracy'])}</b>gain {gain:+.3f}, mean of {len(ft.get('seeds', [])) or 1} seed(s)</div>",
             f"<div>fill-mask top-1 on {fill['prompts']:,} held-out sentences<b>{_num(fill['top1_accuracy'])}</b>"
             f"always '{_e(fill['baseline_word'])}': {_num(fill['baseline_accuracy'])}</div>",
             "</div>"]

    load = machine.get("load_average_at_start")
    shared = (f" The load average was {load:.1f} at the start and {machine.get('load_average_at_end') or 0:.1f} at "
              f"the end on {machine.get('cores')} cores: other work shared the machine, so the speeds are lower than "
              f"it gives alone." if load is not None and machine.get("cores") and load > 0.5 * machine["cores"]
              else "")
    parts += ["<h2 id=\"machine\">Machine and precision</h2>",
              f"<p><b>{_e(report['precision'])}</b>: {_e(report['precision_reason'])}. Measured before pretraining: "
              f"{report['speed']['tokens_per_s']:,.0f} tokens/s ({report['speed']['step_s']:.3f} s per step of "
              f"{report['speed']['tokens_per_step']:,.0f} tokens).{_e(shared)}</p>",
              _table(["stage", "seconds"], [[k, v] for k, v in report.get("timings", {}).items()])]

    summary = report.get("corpus_summary", {})
    parts += ["<h2 id=\"corpus\">Corpus and vocabulary</h2>",
              f"<p>{_e(', '.join(report['corpus']))}; an uncased WordPiece vocabulary of {report['vocab_size']:,} "
              f"tokens trained on it. Held-out documents are never trained on: the held-out curves and the fill-mask "
              f"prompts come from them.</p>",
              _table(["split", "documents", "sentences", "tokens"],
                     [[split, v["documents"], v["sentences"], v["tokens"]] for split, v in summary.items()])]

    recipe = report["recipe"]
    parts += ["<h2 id=\"model\">Model and recipe</h2>",
              _table(["preset", "layers", "hidden", "heads", "parameters"],
                     [[model["preset"], model["layers"], model["hidden"], model["heads"], model["parameters"]]]),
              f"<p>Recipe <code>{_e(recipe['name'])}</code>: masked LM only on packed rows of length "
              f"{recipe['max_seq_length']}, attention isolated between documents, {recipe['mask_prob']:.0%} of the "
              f"tokens predicted, batch {recipe['batch_size']}, peak learning rate {recipe['learning_rate']:g}, no "
              f"dropout. It gave the best held-out masked-token accuracy per CPU minute in the README's "
              f"pretrain-vs-scratch experiment: 0.290 at the tiny size (L2/H128) and 0.282 at the mini size "
              f"(L4/H256) after 29 one-thread minutes on WikiText-2, against 0.107 after 20 two-thread minutes for "
              f"the <code>mini</code> recipe (masked LM + next-sentence prediction at length 128, fp32). The tiny "
              f"size runs three times the steps of the mini one: over three minutes on the docstring corpus (one "
              f"thread each, side by side) it reached held-out accuracy 0.202 against 0.170.</p>"]

    parts += ["<h2 id=\"pretraining\">Pretraining</h2>",
              f"<p>{report['steps']:,} steps, {report['train_tokens']:,} tokens, {report['tokens_per_s']:,.0f} "
              f"tokens/s over the run (held-out evaluations included). Held-out evaluation every "
              f"{plan['eval_every']:,} steps ({report['eval_points']} points): masked-token accuracy "
              f"{_num(report['mlm_accuracy_before'])} → {_num(report['mlm_accuracy_after'])}, perplexity "
              f"{_num(report['perplexity_before'], 0)} → {_num(report['perplexity_after'], 1)}.</p>",
              "<div class=\"figures\">" + _figure("heldout_accuracy", figures) + _figure("heldout_perplexity", figures)
              + "</div>", _figure("training_loss", figures)]

    task = ft["task"]
    config, seeds = ft["config"], ft.get("seeds", [])

    def row(label: str, r: dict[str, Any]) -> list[Any]:
        return [label, _num(r["accuracy"]), " / ".join(f"{a:.3f}" for a in r.get("accuracies", [])),
                _num(r.get("accuracy_sd")), _num(r["macro_f1"]), _num(r["last_accuracy"]), _num(r["seconds"], 0)]

    rows = [row("pretrained", pre), row("random initialisation", scr),
            ["majority class", _num(ft["majority_accuracy"]), "", "", "", "", ""]]
    wins = sum(p > s for p, s in zip(pre.get("accuracies", []), scr.get("accuracies", [])))
    spread = max(pre.get("accuracy_sd") or 0.0, scr.get("accuracy_sd") or 0.0, pre["accuracy_se"])
    verdict = ("within the spread of the seeds and of the dev sample: no clear difference" if abs(gain) < spread
               else "pretraining helps" if gain > 0 else "random initialisation does better")
    parts += ["<h2 id=\"finetuning\">Fine-tuning: pretrained vs random initialisation</h2>",
              f"<p>Task: {_e(task['description'])}. {ft['train_examples']:,} training and {ft['dev_examples']:,} "
              f"dev examples; labels {_e(', '.join(ft['labels']))}. Both starting points have the same architecture "
              f"and get the same recipe, budget and seeds ({_e(', '.join(map(str, seeds)))}): {ft['epochs']:g} "
              f"epochs, batch {config['batch_size']}, learning rate {config['learning_rate']:g}, dropout "
              f"{config['dropout']}, length {config['max_seq_length']}, {_e(config['precision'])}. Each run keeps its "
              f"best epoch on dev (as every bertkit fine-tuning run does); the table gives the mean over the seeds "
              f"and each seed's figure. One run's binomial standard error on this dev set is about "
              f"{pre['accuracy_se']:.3f}.</p>",
              _table(["starting point", "dev accuracy, mean", "per seed", "sd over seeds", "macro-F1, mean",
                      "last epoch, mean", "seconds, all seeds"], rows, table_id="finetune-table"),
              f"<p><b>Gain from pretraining: {gain:+.3f}</b> (pretrained ahead on {wins} of {len(seeds)} "
              f"seed{'s' if len(seeds) != 1 else ''}; {verdict}).{_first_epoch(pre, scr)}</p>",
              _figure("finetune_accuracy", figures)]

    examples = []
    for ex in fill["examples"]:
        candidates = ", ".join(f"{t} ({p:.2f})" for t, p in ex["candidates"])
        mark = Markup("<span class=\"ok\">✓</span>" if ex["correct"] else "<span class=\"miss\">✗</span>")
        examples.append([ex["prompt"], Markup(f"<b>{_e(ex['answer'])}</b>"), candidates, mark])
    rare = (f" On the {fill['rare_prompts']:,} prompts whose word is not among the corpus's {fill['frequent_words']} "
            f"most frequent: {_num(fill['rare_top1_accuracy'])}." if fill.get("rare_top1_accuracy") is not None else "")
    parts += ["<h2 id=\"fill-mask\">Fill-mask on held-out text</h2>",
              f"<p>{fill['prompts']:,} prose sentences from held-out documents (6 to 60 pieces, at least 80% of "
              f"them letters), one word of one vocabulary piece masked in each (chosen at random), the sentence alone "
              f"as input: top-1 accuracy "
              f"<b>{_num(fill['top1_accuracy'])}</b>, top-5 {_num(fill['top5_accuracy'])}; always answering the "
              f"corpus's most frequent word '{_e(fill['baseline_word'])}' scores {_num(fill['baseline_accuracy'])}."
              f"{rare} The first {len(fill['examples'])} prompts drawn (not chosen by outcome):</p>",
              _table(["held-out sentence", "true word", "model's top 5 (probability)", "top-1"], examples,
                     table_id="fill-mask-table")]
    if report.get("probes"):
        parts.append(_table(["your sentence", "model's top 5 (probability)"],
                            [[text, ", ".join(f"{t} ({p:.2f})" for t, p in c)]
                             for text, c in report["probes"].items()]))

    parts += ["<h2 id=\"reproduce\">Reproduce each stage</h2>",
              "<p>The same stages with the separate verbs (the pipeline ran these settings):</p>"]
    for stage, command in report.get("commands", []):
        parts.append(f"<p class=\"muted\">{_e(stage)}</p><pre>{_e(command)}</pre>")
    parts += ["<h2 id=\"files\">Files</h2>",
              _table(["what", "where"], [["pretrained model (fill-mask)", report["model"]],
                                         ["fine-tuned model", ft["pretrained"].get("model", "")],
                                         ["fine-tuned from random initialisation", ft["scratch"].get("model", "")],
                                         ["pretraining metrics", str(Path(report["model"]).parent / METRICS_FILE)],
                                         ["this report as JSON", str(Path(report["report"]).with_suffix(".json"))]]),
              "</body></html>"]
    return "\n".join(p for p in parts if p)


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
