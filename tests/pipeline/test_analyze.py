"""bertkit.pipeline.analyze (`bertkit analyze layers`): the per-layer distances on hand-made states, against each model's own
hidden states one text at a time (padding excluded, ALBERT's shared layer run L times), the JSON and PNG written
through the CLI for two models side by side, and one-line errors for bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bertkit.pipeline.analyze import distances, layer_distances
from bertkit.cli import main
from bertkit.models import BertForPreTraining
from conftest import TINY_TEXT, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_distances_by_hand():
    # One text, two tokens, embeddings + 2 layers, H 2.
    states = [np.array([[[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]],     # token 1: h0, h1, h2
                        [[3.0, 4.0], [3.0, 4.0], [-3.0, -4.0]]])]  # token 2
    d = distances(states)
    # Layer 1: token 1 moves (1,0) -> (0,1): L2 sqrt 2, cos 0 (90 degrees); token 2 stays: 0, cos 1.
    # Layer 2: token 1 (0,1) -> (0,2): L2 1, cos 1; token 2 flips: L2 10, cos -1 (180 degrees).
    assert d["l2"] == pytest.approx([math.sqrt(2) / 2, 5.5])
    assert d["cosine_distance"] == pytest.approx([0.5, 1.0])
    assert d["angle_degrees"] == pytest.approx([45.0, 90.0])


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("analyze")
    out = {}
    for name, fields in (("bert", {}), ("albert", dict(model_type="albert", embedding_size=16, num_hidden_groups=1,
                                                        hidden_act="gelu_new"))):
        torch.manual_seed(0)
        config = tiny_config(vocab_size=tiny_tokenizer.vocab_size, num_hidden_layers=3, **fields)
        BertForPreTraining(config).save_pretrained(root / name / "model", tokenizer=tiny_tokenizer)
        out[name] = root / name / "model"
    texts = root / "texts.txt"
    texts.write_text("\n".join(TINY_TEXT[:6]) + "\n\n")
    return out, texts


@pytest.mark.parametrize("name", ["bert", "albert"])
def test_layer_distances_equal_the_models_own_hidden_states(models, tiny_tokenizer, name):
    dirs, _ = models
    texts = TINY_TEXT[:6]  # of different lengths: batched with padding
    result = layer_distances(dirs[name], texts, batch_size=4)
    model = BertForPreTraining.from_pretrained(dirs[name]).bert.eval()
    per_token = []
    with torch.no_grad():
        for text in texts:  # one text at a time: no padding at all
            ids = torch.tensor([tiny_tokenizer.encode(text).input_ids])
            hidden = model(ids, output_hidden_states=True).hidden_states
            per_token.append(torch.stack([h[0] for h in hidden], dim=1).double())  # (T, L + 1, H)
    states = torch.cat(per_token)
    l2 = (states[:, 1:] - states[:, :-1]).norm(dim=-1).mean(0)
    cos = torch.nn.functional.cosine_similarity(states[:, 1:], states[:, :-1], dim=-1)
    assert result["layers"] == 3 and len(result["l2"]) == 3  # ALBERT: one weight set, run 3 times
    assert result["tokens"] == states.shape[0]
    assert result["l2"] == pytest.approx(l2.tolist(), rel=1e-4)
    assert result["cosine_distance"] == pytest.approx((1 - cos).mean(0).tolist(), rel=1e-4, abs=1e-6)


def test_cli_draws_two_models_side_by_side(models, tmp_path, capsys):
    dirs, texts = models
    out = tmp_path / "out"
    assert main(["analyze", "layers", "--model", str(dirs["bert"]), str(dirs["albert"]), "--name", "BERT",
                 "ALBERT", "--input", str(texts), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "layers.json").read_text())
    assert report["texts"] == 6 and [m["name"] for m in report["models"]] == ["BERT", "ALBERT"]
    assert [m["model_type"] for m in report["models"]] == ["bert", "albert"]
    assert (out / "layers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line.split() for line in printed.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    assert float(rows[0][1]) == pytest.approx(report["models"][0]["l2"][0], abs=1e-3)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary or lock file left behind


def test_cli_bad_input_gives_one_line(models, tmp_path, capsys):
    dirs, texts = models
    assert main(["analyze", "layers", "--model", str(dirs["bert"]), "--input", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "none.txt: no such input file" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    assert main(["analyze", "layers", "--model", str(dirs["bert"]), "--input", str(empty)]) == 2
    assert "empty.txt: no text in it" in capsys.readouterr().err
    assert main(["analyze", "layers", "--model", str(dirs["bert"]), str(dirs["albert"]), "--name", "one",
                 "--input", str(texts)]) == 2
    assert "--name: 1 names for 2 models" in capsys.readouterr().err
