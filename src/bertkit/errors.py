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



class CheckpointError(ValueError):
    """A model directory that cannot be loaded as asked; the message names the file or tensor (raised by
    `bertkit.checkpoint` and by `bertkit.models.ModelDir`'s config reader, which stays free of torch)."""

# Optional dependencies, by the extra of pyproject.toml that installs them: the top-level module a verb imports ->
# the extra's name. A verb that meets one missing says which extra to install, in one line.
EXTRAS = {"seqeval": "tasks", "scipy": "tasks", "sklearn": "tasks", "matplotlib": "plots", "starlette": "serve",
          "uvicorn": "serve", "onnx": "serve", "onnxscript": "serve", "onnxruntime": "serve"}


def needs_extra(err: ModuleNotFoundError, what: str, extra: str = "serve") -> ModuleNotFoundError:
    """The error for an optional package a verb needs: `what` ("bertkit serve needs starlette and uvicorn") and the
    extra that installs it; the missing module's name travels, so the command line names the extra too."""
    return ModuleNotFoundError(f"{what}: pip install \"bertkit[{extra}]\"", name=err.name)


def missing_extra(err: BaseException, verb: str) -> str | None:
    """The one line for `err` when it is an optional dependency that is not installed (a ModuleNotFoundError of a
    module in EXTRAS, however deep the import), else None.

    verb: what the user ran, e.g. "finetune ner" -> "bertkit finetune ner needs seqeval, which is not installed:
    pip install 'bertkit[tasks]'".
    """
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    module = err.name.split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return f"bertkit {verb} needs {module}, which is not installed: pip install 'bertkit[{extra}]'"
