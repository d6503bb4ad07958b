"""bertkit.io's JSON reader: every way a JSON file can be wrong is one line naming the file, and every reader of a
JSON object in the package (config, checkpoint, SQuAD, sentence-transformers, tokenizer files) says it the same way.
(The atomic writers, the directory lock and the JSON Lines reader are tested under tests/reliability/.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bertkit.errors import CheckpointError
from bertkit.models.modeldir import read_config
from bertkit.config import BertConfig
from bertkit.errors import DataError
from bertkit.io import read_json, read_json_object
from bertkit.sentence import read_sentence_config
from bertkit.tasks.squad import read_squad
from bertkit.tokenizers.bpe import ByteLevelBPETokenizer
from bertkit.tokenizers.tokenizer_json import read_configs
from bertkit.tokenizers.wordpiece import WordPieceTokenizer


@pytest.mark.parametrize("value", [{}, {"a": [1, 2.5, None], "é": {"b": True}}])
def test_an_object_round_trips(tmp_path, value):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    assert read_json_object(path) == value
    assert read_json(path) == value


def test_read_json_takes_any_value(tmp_path):
    path = tmp_path / "modules.json"
    path.write_text('[{"idx": 0}, 3, "x"]', encoding="utf-8")
    assert read_json(path) == [{"idx": 0}, 3, "x"]


# (bytes, the message after "{path}"): each way a file can be wrong, once.
WRONG = [
    (b'{"a": 1,\n  "b": }', ": not valid JSON at line 2, column 8 (Expecting value)"),
    (b"", ": not valid JSON at line 1, column 1 (Expecting value)"),
    (b'{"a": 1}\n{"b": 2}', ": not valid JSON at line 2, column 1 (Extra data)"),
    (b'{"a": "x"}\n{"b": "\xe9t\xe9"}', ":2: invalid UTF-8 (byte 0xe9 at byte 7 of the line); save the file as UTF-8"),
    (b"[1, 2]", ": expected a JSON object, found list"),
    (b"null", ": expected a JSON object, found NoneType"),
    (b'"text"', ": expected a JSON object, found str"),
]


@pytest.mark.parametrize("raw, said", WRONG)
@pytest.mark.parametrize("error", [DataError, CheckpointError])
def test_a_wrong_file_is_one_line_naming_it(tmp_path, raw, said, error):
    path = tmp_path / "x.json"
    path.write_bytes(raw)
    with pytest.raises(error) as caught:
        read_json_object(path, error=error)
    assert type(caught.value) is error and str(caught.value) == f"{path}{said}"


def test_a_missing_file_names_what_it_is(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        read_json_object(tmp_path / "none.json", "SQuAD file")
    assert str(caught.value) == f"{tmp_path / 'none.json'}: no such SQuAD file"


def _sentence_dir(directory: Path, name: str) -> Path:
    """A sentence-transformers directory whose file `name` the test breaks."""
    directory.mkdir()
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    return directory / name


# Every reader of a JSON object file in the package: (the file it reads in `directory`, how to call it on the
# directory, the error type it raises). A new reader belongs here.
READERS = {
    "config": (lambda d: d / "config.json", lambda d: BertConfig.from_json_file(d / "config.json"), DataError),
    "checkpoint": (lambda d: d / "config.json", read_config, CheckpointError),
    "squad": (lambda d: d / "train.json", lambda d: read_squad(d / "train.json"), DataError),
    "sentence": (lambda d: _sentence_dir(d / "st", "sentence_bert_config.json"),
                 lambda d: read_sentence_config(d / "st"), DataError),
    "sentence-pooling": (lambda d: _sentence_dir(d / "st", "1_Pooling/config.json"),
                         lambda d: read_sentence_config(d / "st"), DataError),
    "tokenizer-config": (lambda d: d / "tokenizer_config.json", read_configs, DataError),
    "wordpiece-config": (lambda d: d / "tokenizer_config.json", WordPieceTokenizer.from_pretrained, DataError),
    "bpe-config": (lambda d: d / "tokenizer_config.json", ByteLevelBPETokenizer.from_pretrained, DataError),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("raw, said", [WRONG[0], WRONG[3], WRONG[4]])
def test_every_reader_says_it_the_same_way(tmp_path, reader, raw, said):
    place, call, error = READERS[reader]
    path = place(tmp_path)
    path.write_bytes(raw)
    with pytest.raises(error, match=f"^{re.escape(str(path) + said)}$"):
        call(tmp_path)


def test_sentence_modules_must_be_a_list(tmp_path):
    path = _sentence_dir(tmp_path / "st", "modules.json")
    path.write_text('{"idx": 0}')
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: expected a list of module objects$"):
        read_sentence_config(tmp_path / "st")
    path.write_text("[{")
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}: not valid JSON at line 1, column 3 "):
        read_sentence_config(tmp_path / "st")
