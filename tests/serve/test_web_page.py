"""The web page at / in a real headless Chromium (Playwright driving the distribution's chromium): the page loads,
a query is typed and submitted, and what it draws is what `bertkit predict` (fill_mask) answers: class
probabilities as bars, entities marked in the text, the answer span marked in its context, masked-token candidates,
a generation marked after its prompt (`bertkit generate`).

Needs the playwright package and a chromium binary (Debian: `apt-get install chromium`); skipped without them.
Playwright's own browser download is never used.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
if CHROMIUM is None:
    pytest.skip("no chromium binary (Debian: apt-get install chromium)", allow_module_level=True)

from conftest import uvicorn_in_thread  # noqa: E402
from serve_models import WORDS, build_models  # noqa: E402

from bertkit.tasks.finetune import FinetuneConfig, finetune, predict  # noqa: E402
from bertkit.inference import fill_mask  # noqa: E402
from bertkit.serve import Engine, ServeConfig, create_app  # noqa: E402

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "serve-page.png"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("page-models"))


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        # --no-sandbox: Chromium refuses its sandbox as root (containers, CI)
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@contextlib.contextmanager
def running(model_dir, kind=None):
    """A uvicorn server on 127.0.0.1 (a free port) serving the model directory; yields its base URL."""
    app = create_app(Engine(model_dir, kind), ServeConfig(max_wait_ms=1))
    with uvicorn_in_thread(app) as port:
        yield f"http://127.0.0.1:{port}"


def ask(browser, url: str, fields: dict[str, str]):
    """Open the page, fill the fields, submit, wait for the drawn answer; returns the page."""
    page = browser.new_page(viewport={"width": 900, "height": 760})
    page.goto(url)
    page.wait_for_selector("body[data-ready]")
    for name, value in fields.items():
        page.fill(f"#{name}", value)
    page.click("#submit")
    page.wait_for_selector("#answer")
    return page


def bar_rows(page) -> list[tuple[str, str]]:
    return [(row.get_attribute("data-name"), row.query_selector(".pct").inner_text())
            for row in page.query_selector_all("#answer .row")]


def test_class_probabilities_as_bars(browser, models, tmp_path):
    text, pair = "the movie was very good", "nobody knows"
    (want,) = predict(models["classify"], "classify", [(text, pair)])
    with running(models["classify"]) as url:
        page = ask(browser, url, {"text": text, "pair": pair})
        assert page.inner_text("#top") == want["label"]
        ranked = sorted(want["probabilities"].items(), key=lambda kv: -kv[1])
        assert bar_rows(page) == [(name, f"{100 * p:.1f}%") for name, p in ranked]
        width = page.eval_on_selector("#answer .row.top .bar", "e => parseFloat(e.style.width)")
        assert width == pytest.approx(100 * ranked[0][1], abs=0.01)
        page.screenshot(path=str(tmp_path / "classify.png"))
        page.close()


def test_entities_marked_in_the_text(browser, models):
    text = "john lives in paris and mary in london"
    (want,) = predict(models["ner"], "ner", [text])
    assert want["entities"]  # the random head tags something
    with running(models["ner"]) as url:
        page = ask(browser, url, {"text": text})
        marks = page.query_selector_all("#answer mark")
        got = [(m.get_attribute("data-type"), int(m.get_attribute("data-start")), int(m.get_attribute("data-end")))
               for m in marks]
        assert got == [(e["type"], e["start"], e["end"]) for e in want["entities"]]
        assert page.inner_text("#answer .text").replace("\n", "").startswith(text[:want["entities"][0]["start"]])
        page.close()


def clear_answer(model_dir, queries):
    """The first (question, context) whose best span beats the second best by a clear margin (2 points of
    probability: far above what float rounding between two processes can move), with predict's answer."""
    for question, context in queries:
        (want,) = predict(model_dir, "squad", [(question, context)], top_k=2)
        if len(want["nbest"]) < 2:  # no span, or only one: nothing to compare
            continue
        best, second = want["nbest"]
        if want["answer"] and best["probability"] - second["probability"] > 0.02:
            (want,) = predict(model_dir, "squad", [(question, context)])
            return question, context, want
    raise AssertionError("none of the queries has a clear best span")


def test_answer_span_marked_in_its_context(browser, models):
    context = "john lives in paris . mary lives in rome and peter in berlin ."
    question, context, want = clear_answer(models["squad"], [(f"where does {name} live ?", context)
                                                             for name in ("mary", "john", "peter", "anna")])
    assert context[want["start"]:want["end"]] == want["answer"]
    with running(models["squad"]) as url:
        page = ask(browser, url, {"question": question, "context": context})
        assert page.inner_text("#top") == want["answer"]
        mark = page.query_selector("#answer mark.answer")
        assert mark.inner_text() == want["answer"]
        assert (int(mark.get_attribute("data-start")), int(mark.get_attribute("data-end"))) == (want["start"],
                                                                                                 want["end"])
        page.close()


def test_masked_token_candidates_with_probabilities(browser, models):
    text = "john lives in [MASK] and mary in london"
    (want,) = fill_mask(models["pretraining"], text)
    with running(models["pretraining"], "fill-mask") as url:
        page = ask(browser, url, {"text": text})
        assert bar_rows(page) == [(c["token"], f"{100 * c['probability']:.1f}%") for c in want]
        page.close()


def test_a_generation_shown_after_its_prompt(browser, tmp_path):
    from serve_models import causal_model

    from bertkit.inference import generate

    directory = causal_model(tmp_path)
    prompt = "john lives in"
    (want,) = generate(directory, [prompt])
    assert want["continuation"]
    with running(directory) as url:
        page = ask(browser, url, {"text": prompt})
        assert page.inner_text("#top") == want["continuation"]
        assert page.inner_text("#answer mark.generated") == want["continuation"]
        assert page.inner_text("#answer .text").startswith(prompt)
        page.close()


@pytest.mark.slow
def test_a_fine_tuned_classifier_on_the_page_and_its_screenshot(browser, models, tmp_path):
    """A tiny classifier fine-tuned here for a few seconds (a sentence is positive when it says "good"), asked about
    a held-out sentence; the page's screenshot goes to docs/img/serve-page.png (the README shows it)."""
    rng = random.Random(3)
    filler = [w for w in WORDS if w not in ("good", "bad")]

    def rows(n):
        out = []
        for i in range(n):
            words = [rng.choice(filler) for _ in range(rng.randint(3, 8))]
            words.insert(rng.randrange(len(words) + 1), "good" if i % 2 == 0 else "bad")
            out.append(f"{' '.join(words)},{'positive' if i % 2 == 0 else 'negative'}")
        return "text,label\n" + "\n".join(out) + "\n"

    (tmp_path / "train.csv").write_text(rows(96), encoding="utf-8")
    (tmp_path / "dev.csv").write_text(rows(16), encoding="utf-8")
    config = FinetuneConfig(epochs=6, dropout=0.0, batch_size=8, learning_rate=3e-3, progress=False,
                            max_seq_length=24)
    results = finetune("classify", models["pretraining"], tmp_path / "train.csv", tmp_path / "dev.csv",
                       tmp_path / "run", config)
    assert results["best"]["accuracy"] >= 0.9
    text = "the story was long but the music was good"
    (want,) = predict(tmp_path / "run" / "model", "classify", [text])
    assert want["label"] == "positive"
    with running(tmp_path / "run" / "model") as url:
        page = ask(browser, url, {"text": text})
        assert page.inner_text("#top") == "positive"
        assert bar_rows(page)[0] == ("positive", f"{100 * want['probability']:.1f}%")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        page.close()
    assert SCREENSHOT.stat().st_size > 10_000


def test_similarity_view_of_an_embedding_model(browser, models):
    """Sentences typed one per line: their cosine matrix, from /v1/embeddings, as `encode_sentences` gives it."""
    import numpy as np

    from bertkit.features import encode_sentences

    sentences = ["john lives in paris", "mary lives in london", "the movie was very good"]
    vectors = encode_sentences(models["pretraining"], sentences)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    want = unit @ unit.T
    with running(models["pretraining"], "embeddings") as url:
        page = browser.new_page(viewport={"width": 900, "height": 900})
        page.goto(url)
        page.wait_for_selector("body[data-ready]")
        assert page.is_visible("#similarity")
        page.fill("#sentences", "\n".join(sentences))
        page.click("#compare")
        page.wait_for_selector("#cosines")
        cells = [[float(td.inner_text()) for td in tr.query_selector_all("td")]
                 for tr in page.query_selector_all("#cosines tr")[1:]]
        np.testing.assert_allclose(cells, want, atol=1.5e-3)  # drawn with three decimals
        page.screenshot(path=str(SCREENSHOT.with_name("serve-similarity.png")), full_page=True)
        page.close()
