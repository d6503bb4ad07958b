"""plot_run: one PNG per group of metrics present, nothing for absent groups, file:line errors for bad lines."""

import json
import re
import sys

import pytest

from bertkit.errors import DataError
from bertkit.pipeline.plots import group_keys, kind, plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir, records, extra_lines=()):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def training(step, **extra):
    record = {"step": step, "loss": 9.0 - step / 10, "mlm_loss": 8.5 - step / 10, "nsp_loss": 0.5,
              "mlm_accuracy": step / 100, "nsp_accuracy": 0.5 + step / 400, "lr": 1e-4 * step / 20,
              "tokens_per_s": 1000.0 + step}
    record.update(extra)
    return record


def evaluation(step):
    return {"step": step, "eval_mlm_accuracy": step / 100, "eval_perplexity": 500.0 / step,
            "eval_nsp_accuracy": 0.6, "eval_mlm_loss": 6.0 - step / 20}


def names(paths):
    return {p.name for p in paths}


def test_every_group_present_gives_its_png(tmp_path):
    pytest.importorskip("matplotlib")
    records = [training(s) for s in range(1, 21)] + [evaluation(10), evaluation(20)]
    write_metrics(tmp_path / "run", records)
    paths = plot_run(tmp_path / "run")
    assert names(paths) == {"loss.png", "accuracy.png", "lr.png", "throughput.png", "eval.png"}
    for path in paths:
        assert path.parent == tmp_path / "run" / "plots"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert sorted(p.name for p in (tmp_path / "run" / "plots").iterdir()) == sorted(names(paths))


def test_only_groups_with_data_and_out_dir(tmp_path):
    pytest.importorskip("matplotlib")
    write_metrics(tmp_path / "run", [{"step": s, "loss": 3.0 / s, "lr": 1e-3, "note": "text is not plotted",
                                      "done": False} for s in range(1, 4)])
    paths = plot_run(tmp_path / "run", out_dir=tmp_path / "figs")
    assert names(paths) == {"loss.png", "lr.png"}
    assert all(p.parent == tmp_path / "figs" and p.read_bytes()[:8] == PNG_MAGIC for p in paths)
    assert not (tmp_path / "run" / "plots").exists()


def test_unknown_numeric_keys_are_plotted_too(tmp_path):
    pytest.importorskip("matplotlib")
    write_metrics(tmp_path / "run", [{"step": 1, "grad_norm": 1.5, "eval_f1": 0.7},
                                     {"step": 2, "grad_norm": 1.2, "eval_f1": float("nan")}])
    assert names(plot_run(tmp_path / "run")) == {"other.png", "eval.png"}


def test_no_numeric_keys_writes_nothing(tmp_path):
    write_metrics(tmp_path / "run", [{"step": 1, "event": "start"}])
    assert plot_run(tmp_path / "run") == []


def test_grouping_rules():
    assert [kind(k) for k in ("loss", "mlm_loss", "mlm_accuracy", "nsp_acc", "lr", "learning_rate",
                              "tokens_per_s", "grad_norm", "perplexity")] == \
        ["loss", "loss", "accuracy", "accuracy", "lr", "lr", "throughput", None, None]
    groups = group_keys(["loss", "mlm_loss", "mlm_accuracy", "lr", "tokens_per_s", "samples_per_s",
                         "eval_mlm_accuracy", "eval_nsp_accuracy", "eval_perplexity", "eval_mlm_loss", "grad_norm"])
    assert groups == {
        "loss": [["loss", "mlm_loss"]],
        "accuracy": [["mlm_accuracy"]],
        "lr": [["lr"]],
        "throughput": [["samples_per_s"], ["tokens_per_s"]],  # different units: one axis each
        "eval": [["eval_mlm_accuracy", "eval_nsp_accuracy"], ["eval_mlm_loss"], ["eval_perplexity"]],
        "other": [["grad_norm"]],
    }


@pytest.mark.parametrize("bad, why", [
    ('{"step": 3, "loss": ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"loss": 1.0}', "no numeric 'step'"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    write_metrics(tmp_path / "run", [training(1), training(2)], extra_lines=["", bad, json.dumps(training(3))])
    path = tmp_path / "run" / "metrics.jsonl"
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}:4: {why}"):
        plot_run(tmp_path / "run")


def test_missing_metrics_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path)


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    write_metrics(tmp_path / "run", [training(1)])
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` raise ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot_run(tmp_path / "run")
    assert not (tmp_path / "run" / "plots").exists()


# ------------------------------------------------------------------------------------------------------------------
# Scripts beyond Latin: drawn with an installed font that has them, else kept out of the image
# ------------------------------------------------------------------------------------------------------------------
def _draw_korean(path):
    from bertkit.pipeline.plots import plot_confusion

    return plot_confusion({"labels": ["유사", "관련", "무관"], "dev": [[3, 1, 0], [1, 2, 1], [0, 1, 4]]},
                          path, title="한국어 문장 쌍")


def test_korean_text_draws_without_missing_glyphs(tmp_path, recwarn):
    import logging

    from bertkit.pipeline import plots

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("matplotlib").addHandler(handler)
    try:
        _draw_korean(tmp_path / "with.png")
        has_font = any(family in plots.CJK_FONTS for family, _ in plots.figure_fonts())
        assert plots.drawable("유사") == has_font
        # Without any Hangul font (as on a machine where `make install` could not add one), the labels go.
        saved = plots.CJK_FONTS
        plots.CJK_FONTS = ()
        try:
            assert not plots.drawable("유사") and plots.figure_text("유사", "0") == "0"
            assert plots.figure_text("similar", "0") == "similar"
            _draw_korean(tmp_path / "without.png")
        finally:
            plots.CJK_FONTS = saved
    finally:
        logging.getLogger("matplotlib").removeHandler(handler)
    messages = [str(w.message) for w in recwarn] + [r.getMessage() for r in records]
    assert not [m for m in messages if "missing from font" in m or "Glyph" in m]
    assert (tmp_path / "with.png").stat().st_size > 0 and (tmp_path / "without.png").stat().st_size > 0
