"""Errors are told apart by code or type, never by their text: no production module looks
for words in an error's message (``"stale" in str(e)``, ``e.args``, ``.message``, a
regular expression over a database error's detail). Messages are for people and change."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["backfill_core", "service", "spark_workers", "state_store", "connectors"]

# attributes that hold an error's text
TEXT_ATTRS = {"args", "message", "msg", "message_detail", "message_primary", "pgerror"}
# names conventionally bound to an error, besides those ``except ... as`` binds
ERROR_NAMES = {"e", "err", "error", "exc", "ex", "exception"}
# string methods and regular expression calls that look into a text
SEARCHES = {"search", "match", "fullmatch", "findall", "finditer", "startswith", "endswith"}
SEARCHES |= {"find", "rfind", "index", "count"}


def _error_names(tree: ast.AST) -> set[str]:
    bound = {n.name for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.name}
    return bound | ERROR_NAMES


def _is_error(node: ast.expr, names: set[str]) -> bool:
    """An expression that is an error (``e``, ``job.error``)."""
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Attribute) and node.attr in names


def _error_text(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` reads an error's text somewhere inside."""
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("str", "repr")
            and n.args
            and _is_error(n.args[0], names)
        ):
            return True
        if isinstance(n, ast.Attribute) and n.attr in TEXT_ATTRS:
            return True
        if (  # error.get("message")
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and n.args[0].value in ("message", "msg", "detail")
        ):
            return True
    return False


def text_matches(source: str, filename: str = "<test>") -> list[int]:
    """Lines where an error's text is searched."""
    tree = ast.parse(source, filename=filename)
    names = _error_names(tree)
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in n.ops):
            if any(_error_text(c, names) for c in n.comparators):
                lines.append(n.lineno)
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in SEARCHES
            and any(_error_text(x, names) for x in [n.func.value, *n.args])
        ):
            lines.append(n.lineno)
    return lines


def test_no_module_matches_error_text() -> None:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if lines := text_matches(path.read_text(), str(path)):
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_checker_catches_the_ways_errors_were_matched() -> None:
    # the matches the worker protocol, the Spark fence and the collect path once had
    caught = [
        'if "Empty CSV file" not in str(e): raise',
        "if FENCED_OFF in str(job.error): raise Fenced()",
        'if why not in str(error.get("message", "")): return None',
        "m = _DROPPED_ACTOR.search(diag.message_detail or '')",
        "try:\n    f()\nexcept ValueError as boom:\n    ok = 'stale' in str(boom)",
        "ok = 'stale' in exc.args[0]",
        "ok = str(e).startswith('stale')",
    ]
    for source in caught:
        assert text_matches(source), source
    fine = [
        "if e.code is ErrorCode.STALE_COLLECT: pass",
        "if 'x' in str(path): pass",
        "raise Invalid(e.message, {})",
        "ok = key in row.columns",
    ]
    for source in fine:
        assert not text_matches(source), source
