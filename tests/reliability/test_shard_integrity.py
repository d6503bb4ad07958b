"""Verified shards: altered bytes of unchanged size never train silently (index files are checked at open, token
files before their first use or all at once with --verify), and a manifest whose counts disagree with its files is
one line naming the shard and the field, never an IndexError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from reliability_helpers import make_prepared, one_error_line, pretrain_argv

from bertkit.cli import main
from bertkit.data.shards import ShardedCorpus
from bertkit.errors import DataError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("integrity"), shard_tokens=400)


@pytest.fixture
def data_dir(prepared, tmp_path) -> Path:
    """A fresh copy of the prepared directory, to damage."""
    return Path(shutil.copytree(prepared, tmp_path / "data"))


def alter(path: Path, offset: int | None = None) -> None:
    """Change bytes of `path` in place, keeping its size (by default in the middle of the file)."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if offset is None else offset
    data[at] ^= 0x5A
    data[at + 1] ^= 0x33
    path.write_bytes(bytes(data))


def read_all(corpus: ShardedCorpus) -> None:
    for i in range(len(corpus)):
        corpus.document(i)


def test_the_fixture_has_several_shards(prepared):
    corpus = ShardedCorpus(prepared, "train")
    assert len(corpus._shards) >= 3
    read_all(corpus)  # and an intact corpus reads


@pytest.mark.parametrize("suffix", ["tokens.bin", "wordstarts.bin"])
def test_altered_token_files_fail_before_their_first_use(data_dir, suffix):
    path = data_dir / "train" / f"shard_00001.{suffix}"
    alter(path)
    corpus = ShardedCorpus(data_dir, "train")  # the index files are intact: opening is fast and succeeds
    first = int(corpus._doc_offsets[1])
    for i in range(first):  # shard 0 is intact and reads
        corpus.document(i)
    expected = f"{path}: the file does not match its SHA-256 in the manifest"
    with pytest.raises(DataError, match=expected.replace(".", r"\.")):
        corpus.document(first)
    with pytest.raises(DataError, match=expected.replace(".", r"\.")):
        list(ShardedCorpus(data_dir, "train").token_stream(first))
    with pytest.raises(DataError, match=r"shard_00001\." + suffix.replace(".", r"\.") + " does not match its "
                                        "checksum"):
        ShardedCorpus(data_dir, "train", verify=True)  # --verify: every file at open


@pytest.mark.parametrize("suffix", ["sentences.npy", "documents.npy"])
def test_altered_index_files_fail_at_open(data_dir, suffix):
    path = data_dir / "train" / f"shard_00002.{suffix}"
    alter(path, offset=len(path.read_bytes()) - 12)  # inside the offsets, past the .npy header
    with pytest.raises(DataError) as err:
        ShardedCorpus(data_dir, "train")
    assert str(err.value).startswith(f"{path}: the file does not match its SHA-256 in the manifest")


def _edit_manifest(data_dir: Path, edit) -> Path:
    path = data_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest["splits"]["train"])
    path.write_text(json.dumps(manifest))
    return path


def test_a_split_total_that_disagrees_with_its_shards(data_dir):
    path = _edit_manifest(data_dir, lambda split: split.update(documents=split["documents"] + 5))
    with pytest.raises(DataError) as err:
        ShardedCorpus(data_dir, "train")
    total = sum(s["documents"] for s in json.loads(path.read_text())["splits"]["train"]["shards"])
    assert str(err.value) == (f"{path}: split 'train': documents is {total + 5} but its shards hold {total} (the "
                              f"manifest was altered; prepare the corpus again)")


@pytest.mark.parametrize("field", ["documents", "sentences", "tokens"])
def test_a_shard_count_that_disagrees_with_its_files(data_dir, field):
    def edit(split):  # shard 1 claims one more; the split's total agrees with the shards, not with the files
        split["shards"][1][field] += 1
        split[field] += 1

    _edit_manifest(data_dir, edit)
    with pytest.raises(DataError) as err:
        corpus = ShardedCorpus(data_dir, "train")
        read_all(corpus)  # never an IndexError
    message = str(err.value)
    assert message.startswith(f"{data_dir / 'train' / 'shard_00001'}.*: {field}: the manifest says ")
    assert "\n" not in message


def test_a_shard_entry_without_its_files(data_dir):
    path = _edit_manifest(data_dir, lambda split: split["shards"][0].pop("files"))
    with pytest.raises(DataError, match=f"^{path}: split 'train', shard shard_00000: no 'files'$"):
        ShardedCorpus(data_dir, "train")


def test_pretraining_on_an_altered_shard_is_one_line(data_dir, tmp_path, capsys):
    """Lazily: the run starts and stops before the bad shard's first document is used; with --verify it stops
    before anything is written."""
    path = data_dir / "train" / "shard_00000.tokens.bin"
    alter(path)
    assert main(pretrain_argv(data_dir, tmp_path / "lazy", max_steps=20, save_every=100)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"bertkit: error: {path}: the file does not match its SHA-256 in the manifest")
    assert not (tmp_path / "lazy" / "checkpoints").exists()
    assert main(pretrain_argv(data_dir, tmp_path / "verified", "--verify", max_steps=20, save_every=100)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"bertkit: error: {path} does not match its checksum")
    assert not (tmp_path / "verified").exists()


def test_verification_state_survives_pickling(prepared):
    """Worker processes get a pickled corpus: what was verified stays verified, the maps are reopened."""
    import pickle

    corpus = ShardedCorpus(prepared, "train", verify=True)
    copy = pickle.loads(pickle.dumps(corpus))
    assert copy._verified == set(range(len(corpus._shards)))
    ids, _ = copy.document(0)
    assert np.array_equal(np.concatenate(ids), np.concatenate(corpus.document(0)[0]))
