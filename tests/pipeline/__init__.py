"""Tests of bertkit.pipeline (a package, so its test_corpus.py and test_run.py stand beside tests/data/test_corpus.py
and tests/tasks/test_run.py under their own names)."""
