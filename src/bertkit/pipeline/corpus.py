"""The main job's corpus: docstrings of the Python sources installed on this machine (stage 1), and the
vocabulary's normalisation chosen for the corpus's script (stage 2).

The text is read with `ast` from the source files: nothing is imported or executed, and nothing of that text ships
with bertkit. `default_corpus` writes it as a Google-format corpus (one sentence per line, one module per
document); `prose_sentences` is also where the built-in task (`bertkit.pipeline.task`) finds its sentences.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import math
import multiprocessing
import os
import re
import sysconfig
import time
import unicodedata
from pathlib import Path

from tqdm.auto import tqdm

from bertkit.data.corpus import split_sentences


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) > 40:
                found.append(doc)
    return found


# Marks of code, markup and field lists rather than prose: Sphinx fields, LaTeX, braces, operators, literals, rules
# of reStructuredText headings, links.
_NOT_PROSE = re.compile(r":(param|type|rtype|returns?|raises?|arg|ivar|vartype)\b|[$\\{}]|==|->|``|~~~|===|https?://")
_PROSE_CHARACTERS = frozenset(" .,;:'\"()-?!/")


def is_prose(sentence: str) -> bool:
    """True for a sentence of prose: at least 90% letters, spaces and ordinary punctuation, and no mark of code or
    markup (`_NOT_PROSE`)."""
    plain = sum(c.isalpha() or c in _PROSE_CHARACTERS for c in sentence)
    return plain >= 0.9 * len(sentence) and not _NOT_PROSE.search(sentence)


def prose_sentences(path: Path) -> list[str]:
    """The prose sentences of a Python file's docstrings, whitespace collapsed, in file order.

    Doctest examples, parameter tables and code-like fragments are left out (`is_prose`); so are sentences of 15
    characters or fewer."""
    lines = []
    for doc in _docstrings(path):
        for paragraph in doc.split("\n\n"):
            text = " ".join(paragraph.split())
            if len(text) < 30 or ">>>" in text or text.count("_") > 4 or text.count("`") > 6:
                continue
            lines.extend(s for s in split_sentences(text) if len(s) > 15 and is_prose(s))
    return lines


def source_roots() -> list[Path]:
    """The standard library's folder, then the installed packages' (purelib, platlib), without repeats."""
    roots: list[Path] = []
    for key in ("stdlib", "purelib", "platlib"):
        root = sysconfig.get_paths().get(key)
        if root and Path(root).is_dir() and Path(root) not in roots:
            roots.append(Path(root))
    return roots


def python_files(root: Path) -> list[Path]:
    """The .py files under `root` in a stable order (sorted folders and names), test folders, caches, hidden
    folders and nested site-packages left out."""
    skip = {"test", "tests", "__pycache__", "site-packages", "dist-packages"}  # packages are walked as own roots
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def default_corpus(out_file: Path, max_bytes: int = 12_000_000, progress: bool = True,
                   exclude: set[str] | frozenset[str] = frozenset(), roots: list[Path] | None = None,
                   max_seconds: float = math.inf, processes: int | None = None) -> Path:
    """Write docstrings of installed Python sources as a Google-format corpus: one sentence per line, one
    module per document (blank line between documents). Stops at about `max_bytes`, or after `max_seconds` once
    it has two documents (a slow or busy machine keeps its budget for training: some packages' files take long to
    parse for little prose).

    exclude: sentences left out wherever they occur (the built-in task's dev sentences).
    roots: folders to read (default `source_roots()`).
    processes: parsing processes (default: the machine's cores, at most 4); the files are written in their order
    whatever the number, so the corpus depends only on where the budget stops it.
    """
    began = time.perf_counter()
    files = [f for root in (roots if roots is not None else source_roots()) for f in python_files(root)]
    written = documents = 0
    out_file.parent.mkdir(parents=True, exist_ok=True)
    processes = processes or min(4, os.cpu_count() or 1)
    # Parsing is all the work and each file is parsed alone: a pool of processes assembles about `processes`
    # times the text in the same seconds (the budget is the limit on a slow machine).
    pool = multiprocessing.Pool(processes) if processes > 1 and len(files) > 1 else None
    parsed = pool.imap(prose_sentences, files, chunksize=4) if pool else map(prose_sentences, files)
    with pool or contextlib.nullcontext(), open(out_file, "w", encoding="utf-8") as handle, \
            tqdm(total=max_bytes, unit="B", unit_scale=True, desc="assembling corpus", disable=not progress) as bar:
        for sentences in parsed:
            lines = [s for s in sentences if s not in exclude]
            if len(lines) < 2:
                continue
            block = "\n".join(lines) + "\n\n"
            handle.write(block)
            size = len(block.encode("utf-8"))
            written += size
            documents += 1
            bar.update(size)
            if written >= max_bytes or (documents >= 2 and time.perf_counter() - began > max_seconds):
                break
    if documents < 2:
        raise RuntimeError("could not find enough Python docstrings on this machine; pass --corpus PATH")
    return out_file


def choose_normalisation(texts, sample_chars: int = 2_000_000, threshold: float = 0.001) -> tuple[bool, bool, str]:
    """(lowercase, strip_accents, why) for a vocabulary trained on `texts` (an iterable of strings; the first
    `sample_chars` characters are read).

    Always lowercase (uncased: casing carries little at this size, and a script without case is left as it is).
    Accent stripping (NFD, then the combining marks dropped, as Google's uncased BERT does) only when it removes
    accents from Latin, Greek or Cyrillic letters and nothing else: where more than `threshold` of the letters are
    ones NFD changes in another script (a Hangul syllable becomes its jamo, a kana loses its voicing mark, a
    Devanagari letter its nukta), the letters are kept whole.
    """
    letters = changed = 0
    scripts: collections.Counter[str] = collections.Counter()
    seen = 0
    for text in texts:
        for c in text:
            if not c.isalpha():
                continue
            letters += 1
            if ord(c) >= 0x0530 and unicodedata.normalize("NFD", c) != c:  # past Latin, Greek and Cyrillic
                changed += 1
                scripts[unicodedata.name(c, "OTHER").split()[0]] += 1
        seen += len(text)
        if seen >= sample_chars:
            break
    if letters and changed > threshold * letters:
        script = scripts.most_common(1)[0][0].capitalize()
        return True, False, (f"uncased, accents kept: NFD would change {changed / letters:.0%} of the letters "
                             f"({script} ones, e.g. a Hangul syllable into its jamo), so the letters stay whole")
    return True, True, ("uncased with accent stripping (Google's uncased BERT): in this text NFD only takes "
                        "accents off Latin, Greek or Cyrillic letters")
