"""Exceptions shared across bertkit.

Kept tiny and free of imports so that any module (readers, tokenizer, checkpoint code) can raise the same
error type without pulling in the rest of the package.
"""

from __future__ import annotations

import os


class DataError(ValueError):
    """An input file is malformed; the message starts with ``"{path}:{line}: "`` so editors can jump there.

    A subclass of ValueError so callers that only know "bad input" still catch it.
    """

    @classmethod
    def at(cls, path: str | os.PathLike[str], line: int | None, message: str) -> "DataError":
        """Build the error for `line` (1-based) of `path`; `line=None` when no line applies (e.g. JSON key)."""
        where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
        return cls(f"{where}: {message}")
