"""The package's layout as docs/architecture.md gives it: `defs/` holds Dagster's definitions and
no SQL (statements live in `db/`, and those on Dagster's own tables in one module of the services,
`orchestration/dagster_tables.py`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "episode_pipeline"
DAGSTER_TABLES = "orchestration/dagster_tables.py"
# A statement's opening words, at the start of a string literal.
SQL = re.compile(r"\b(SELECT\s+\S|INSERT\s+INTO|DELETE\s+FROM|UPDATE\s+\S+\s+SET|COPY\s+\S)")


def sql_literals(path: Path) -> list[str]:
    """String literals that open with an SQL statement, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and SQL.match(node.value.lstrip())
    ]


def test_the_rule_finds_a_statement_and_not_prose() -> None:
    assert SQL.match("SELECT column_name FROM information_schema.columns")
    assert SQL.match("DELETE FROM {} WHERE {} = %s")
    assert not SQL.match("select the rows")
    assert not SQL.match("rows for a COPY text")


def test_defs_holds_no_sql() -> None:
    found = {
        str(path.relative_to(PACKAGE)): literals
        for path in sorted((PACKAGE / "defs").rglob("*.py"))
        if (literals := sql_literals(path))
    }
    assert not found, f"SQL in defs/ (move it to db/ or orchestration/): {found}"


def imports_sqlalchemy(path: Path) -> bool:
    """Whether the module imports sqlalchemy: a query built from Dagster's table objects."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.append(node.module or "")
    return any(module.split(".")[0] == "sqlalchemy" for module in modules)


def test_the_services_state_dagsters_tables_in_one_module() -> None:
    found = {
        relative: problems
        for path in sorted((PACKAGE / "orchestration").rglob("*.py"))
        if (relative := str(path.relative_to(PACKAGE))) != DAGSTER_TABLES
        and (problems := ["imports sqlalchemy"] * imports_sqlalchemy(path) + sql_literals(path))
    }
    assert not found, f"SQL in orchestration/ outside {DAGSTER_TABLES} (move it there): {found}"
