"""Figures from the files the benchmarks write, not typed into pages (a MkDocs hook).

A page line `<!-- include: PATH -->` (PATH from the repository root) is replaced by that file's Markdown, its
headings moved below the page's (`# x` becomes `### x`), when the site is built. The GPU suite writes its report
as Markdown (bench/gpu/report.py); the Performance pages include those reports this way, so a rerun's report is
what the site shows. A missing file fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.M)


def expand(markdown: str, root: Path = ROOT, shift: int = 2) -> str:
    """`markdown` with every include line replaced by the file it names, headings shifted by `shift` levels."""
    def one(match: re.Match) -> str:
        path = root / match.group(1)
        if not path.is_file():
            raise FileNotFoundError(f"<!-- include: {match.group(1)} -->: no such file {path}")
        out, fence = [], False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                fence = not fence
            elif not fence and re.match(r"^#{1,6} ", line):
                line = "#" * shift + line
            out.append(line)
        return "\n".join(out)
    return INCLUDE.sub(one, markdown)


def on_page_markdown(markdown, page, config, files):
    try:
        return expand(markdown)
    except FileNotFoundError as err:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: {err}") from err
