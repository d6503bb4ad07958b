"""The CLI reference page, written from `bertkit.cli.build_parser()` at every build (a MkDocs hook).

Nothing in docs/reference/cli.md is typed by hand: every verb and sub-verb, every option with its help, default
and choices come from the argparse parser that `bertkit` itself runs, so an option added to the parser appears
in the site at the next `mkdocs build` without editing a page. tests/test_docs.py checks that every option of the
parser appears in `render()`'s output.

`render()` is importable on its own (no MkDocs needed); `on_files` is the hook MkDocs calls.
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

PAGE = "reference/cli.md"
SRC = Path(__file__).resolve().parents[2] / "src"  # the tree the site is built from, ahead of any installed copy


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help) of each sub-command of `parser`, in the order the parser lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, sub, helps.get(name, "")))
    return out


def _cell(text: str) -> str:
    """Markdown table cell: newlines folded, pipes escaped, `<` `>` `&` escaped outside code spans (a help text's
    `<sep>` would otherwise be read as an HTML tag), code spans kept as they are."""
    parts = " ".join(str(text).split()).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: treat all of it as text
        parts = ["\\`".join(parts)]
    # Python-Markdown's tables do not split a row at a pipe inside a code span, so only text pipes are escaped
    parts = [p if i % 2 else html.escape(p, quote=False).replace("|", "\\|") for i, p in enumerate(parts)]
    return "`".join(parts)


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else "on"
    if action.default is None or action.default is argparse.SUPPRESS:
        return ""
    if isinstance(action.default, (list, tuple)):
        return " ".join(map(str, action.default))
    return str(action.default)


def _names(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    return ", ".join(action.option_strings)  # a BooleanOptionalAction lists --x and --no-x


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
                   and a.help is not argparse.SUPPRESS]  # hidden options: the parser's epilog lists them
        if not actions:
            continue
        title = group.title or "options"
        column = "option" if any(a.option_strings for a in actions) else "argument"
        rows += ["", f"**{_cell(title)}**", "", f"| {column} | help | default |", "| --- | --- | --- |"]
        for action in actions:
            help_text = "" if action.help is argparse.SUPPRESS else (action.help or "")
            if "%(" in help_text:
                try:
                    help_text = help_text % {**vars(action), "prog": parser.prog}
                except (KeyError, TypeError, ValueError):
                    pass
            if action.choices and not isinstance(action.choices, dict):
                help_text += f" (choices: {', '.join(map(str, action.choices))})"
            if action.required and action.option_strings:
                help_text += " (required)"
            rows.append(f"| `{_names(action)}` | {_cell(help_text)} | {_cell(_default(action))} |")
    return rows


def _section(name: str, parser: argparse.ArgumentParser, help_text: str, depth: int) -> list[str]:
    lines = ["", f"{'#' * depth} `{name}`", ""]
    if help_text:
        lines += [_cell(help_text[:1].upper() + help_text[1:]) + ("" if help_text.endswith(".") else "."), ""]
    lines += ["```text", parser.format_usage().strip(), "```"]
    if parser.description:
        lines += ["", _cell(parser.description)]
    lines += _option_rows(parser)
    if parser.epilog:
        lines += ["", "```text", parser.epilog.strip(), "```"]
    for sub_name, sub, sub_help in _subparsers(parser):
        lines += _section(f"{name} {sub_name}", sub, sub_help, min(depth + 1, 4))
    return lines


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole CLI reference as Markdown: one section per verb (and sub-verb), one table row per option."""
    if parser is None:
        if str(SRC) not in sys.path:
            sys.path.insert(0, str(SRC))
        from bertkit.cli import build_parser

        parser = build_parser()
    verbs = _subparsers(parser)
    lines = ["# CLI reference", "",
             "Generated from the `bertkit` argument parser when the site is built: every verb, every option, "
             "its help and its default. `bertkit VERB --help` prints the same.", "",
             "| verb | what it does |", "| --- | --- |"]
    for name, _, help_text in verbs:
        anchor = f"bertkit-{name}".replace(" ", "-")
        lines.append(f"| [`{name}`](#{anchor}) | {_cell(help_text)} |")
    lines += ["", "## `bertkit`", "", "```text", parser.format_usage().strip(), "```"]
    lines += _option_rows(parser)
    for name, sub, help_text in verbs:
        lines += _section(f"bertkit {name}", sub, help_text, 2)
    return "\n".join(lines) + "\n"


def on_files(files, config):
    """MkDocs hook: the generated page takes the place of docs/reference/cli.md, which in the repository only
    says where the reference comes from (so that links to it from the README resolve there too)."""
    from mkdocs.structure.files import File

    placeholder = files.get_file_from_path(PAGE)
    if placeholder is not None:
        files.remove(placeholder)
    files.append(File.generated(config, PAGE, content=render()))
    return files
