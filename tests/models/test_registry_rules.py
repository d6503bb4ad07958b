"""The registry's rules, checked on the source with `ast` (DESIGN.md: "a driver that branches on model_type or kind is
a table missing a column"): outside bertkit/models/, no code compares a model_type or a family against the name of
an architecture (a row of bertkit.models.registry.ARCHITECTURES) but the few listed in ALLOWED with why, and the
file name config.json is written in one module only (bertkit.config.CONFIG_NAME; messages may say it).
"""

from __future__ import annotations

import ast
from pathlib import Path

from bertkit.config import CONFIG_NAME
from bertkit.models.registry import ARCHITECTURES

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "bertkit"
# What a branch compares: a model_type, a family, an architecture (any spelling: a name, an attribute, a
# config.json key read with .get("model_type")).
SUBJECTS = {"model_type", "family", "architecture", "matrix_family"}
# (file under src/bertkit, the comparison as ast.unparse writes it) -> why it stays a comparison. At most 3.
ALLOWED: dict[tuple[str, str], str] = {}


def _literals(node: ast.AST) -> set[str]:
    """The string literals `node` is: one constant, or a tuple / list / set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _names_a_subject(node: ast.AST) -> bool:
    for part in ast.walk(node):
        if isinstance(part, ast.Name) and part.id in SUBJECTS or isinstance(part, ast.Attribute) and part.attr in \
                SUBJECTS or isinstance(part, ast.Constant) and part.value in SUBJECTS:
            return True
    return False


def _tainted(tree: ast.AST) -> set[str]:
    """Names a module assigns from a model_type or a family (`name = config.model_type or ...`): comparing one of
    them is comparing the model_type."""
    return {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _names_a_subject(node.value)
            for target in node.targets if isinstance(target, ast.Name)}


def branches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, comparison) for each comparison in `tree` of a model_type / family against an architecture's name."""
    tainted = _tainted(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = set().union(*map(_literals, sides)) & set(ARCHITECTURES)
            if named and any(_names_a_subject(side) or isinstance(side, ast.Name) and side.id in tainted
                             for side in sides if not _literals(side)):
                found.append((node.lineno, ast.unparse(node)))
    return found


def _modules_outside_models() -> dict[str, ast.AST]:
    return {str(path.relative_to(PACKAGE)): ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "models"}


def test_the_scan_sees_each_spelling_of_a_branch():
    # A check on the checker: each way the package has spelled a family branch is found, and a comparison of
    # other words (a task kind, ELMo's word splitter "bert") is not.
    code = ("a = config.model_type == 'xlnet'\n"
            "b = raw.get('model_type') in ('bert', 'roberta')\n"
            "c = family != 'causal'\n"
            "d = words == 'bert'\n"
            "e = kind == 'ner'\n"
            "name = getattr(encoder.config, 'model_type', None) or 'module'\n"
            "f = name == 't5'\n")
    assert [line for line, _ in branches(ast.parse(code))] == [1, 2, 3, 7]


def test_no_model_type_branch_outside_models():
    assert len(ALLOWED) <= 3
    found = {(path, text): line for path, tree in _modules_outside_models().items() for line, text in branches(tree)}
    unlisted = sorted(f"src/bertkit/{path}:{line}: {text}" for (path, text), line in found.items()
                      if (path, text) not in ALLOWED)
    assert not unlisted, ("model_type / family branches outside bertkit/models/ (read a field of the architecture's "
                          "registry row instead):\n" + "\n".join(unlisted))
    assert set(ALLOWED) <= set(found), f"ALLOWED lists branches that are gone: {sorted(set(ALLOWED) - set(found))}"


def test_config_json_is_named_in_one_module():
    naming = sorted(path for path, tree in _modules_outside_models().items()
                    if any(isinstance(node, ast.Constant) and node.value == CONFIG_NAME for node in ast.walk(tree)))
    models = sorted(str(path.relative_to(PACKAGE)) for path in (PACKAGE / "models").rglob("*.py")
                    if any(isinstance(node, ast.Constant) and node.value == CONFIG_NAME
                           for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert naming + models == ["config/base.py"], "use bertkit.config.CONFIG_NAME"
