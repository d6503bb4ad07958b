"""SWAG reader and multiple-choice accuracy on tiny CSV fixtures."""

import re

import numpy as np
import pytest

from bertkit.errors import DataError
from bertkit.tasks.swag import MultipleChoiceExample, multiple_choice_accuracy, read_swag

HEADER = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
ROW1 = ('anetv_jkn6uvmqwh4,3416,"Members of the procession walk down the street holding small horn brass '
        'instruments. A drum line","Members of the procession walk down the street holding small horn brass '
        'instruments.",A drum line,gold,"passes by walking down the street playing their instruments.",'
        'has heard approaching them.,"arrives and they\'re outside dancing and asleep.",turns the lead singer '
        'watches the performance.,0\n')
# A quoted field spanning two lines: the next row must still report its own first line.
ROW2 = 'lsmdc0001,12,x,"Someone, smiling,\nwaves.",He,gen,"runs, fast.",sits.,eats.,sleeps.,3\n'
ROW3 = "lsmdc0002,13,x,She nods.,She,gen,a.,b.,c.,d.,1\n"


def test_read_swag(tmp_path):
    path = tmp_path / "val.csv"
    path.write_text(HEADER + ROW1 + ROW2 + ROW3, encoding="utf-8")
    first, second, third = read_swag(path)
    assert first.context == "Members of the procession walk down the street holding small horn brass instruments."
    assert first.choices[0] == "A drum line passes by walking down the street playing their instruments."
    assert first.choices[2] == "A drum line arrives and they're outside dancing and asleep."
    assert (first.id, first.label, first.line) == ("3416", 0, 2)
    assert second == MultipleChoiceExample(id="12", context="Someone, smiling,\nwaves.",
                                           choices=["He runs, fast.", "He sits.", "He eats.", "He sleeps."],
                                           label=3, line=3)
    assert (third.label, third.line) == (1, 5)


def test_read_swag_test_file_without_labels(tmp_path):
    path = tmp_path / "test.csv"
    path.write_text(HEADER.replace(",label", "") + ROW3.replace(",1\n", "\n"), encoding="utf-8")
    (example,) = read_swag(path)
    assert example.label is None and example.choices == ["She a.", "She b.", "She c.", "She d."]


def test_read_swag_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + ROW3 + ROW3.replace(",1\n", ",4\n"), encoding="utf-8")
    with pytest.raises(DataError, match="^" + re.escape(f"{path}:3: ") + "label '4' is not one of 0, 1, 2, 3"):
        read_swag(path)
    path.write_text(HEADER + "a,b,c\n", encoding="utf-8")
    with pytest.raises(DataError, match="^" + re.escape(f"{path}:2: ") + "expected 11 fields, found 3"):
        read_swag(path)
    path.write_text("video-id,sent1\n", encoding="utf-8")
    with pytest.raises(DataError, match="^" + re.escape(f"{path}:1: ") + "missing column"):
        read_swag(path)


def test_multiple_choice_accuracy():
    logits = np.array([[0.1, 2.0, 0.3, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.4]])  # argmax 1, 0, 2
    assert multiple_choice_accuracy(logits, [1, 3, 2]) == pytest.approx(2 / 3)
    assert multiple_choice_accuracy([1, 0, 2, 3], [1, 0, 0, 0]) == 0.5
    with pytest.raises(ValueError):
        multiple_choice_accuracy([1, 0], [1, 0, 2])
