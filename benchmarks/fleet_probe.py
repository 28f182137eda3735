"""Counts what an operation asks of the stores: SQL statements (Dagster's and ours), AWS calls.

A `Probe` hooks, for the time it is entered, every SQLAlchemy engine (Dagster's storage),
psycopg's `Cursor.execute` (the application database) and botocore's API calls (S3, SQS), in
this process. It records how many of each, the seconds spent in SQL, and the statements that
took longest, so a figure that grows with the fleet comes with the query that makes it grow.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_SPACES = re.compile(r"\s+")
_PARAMS = re.compile(r"(%\([a-z_]+?)_?\d+(_\d+)?\)s")
_PARAM_RUNS = re.compile(r"(%\([a-z_]+\)s)(, \1)+")
_LITERALS = re.compile(r"'[^']*'")
_PATCH_LOCK = threading.Lock()


def normalize(statement: str) -> str:
    """One line per kind of statement: parameters and literal lists folded."""
    text = _SPACES.sub(" ", statement).strip()
    text = _PARAM_RUNS.sub(r"\1, ...", _PARAMS.sub(r"\1)s", text))
    return _LITERALS.sub("'?'", text)[:240]


@dataclass
class Probe:
    sql_statements: int = 0
    sql_seconds: float = 0.0
    aws_calls: Counter[str] = field(default_factory=Counter)
    by_statement: dict[str, list[float]] = field(default_factory=dict)  # text → [count, seconds]
    _undo: list[Any] = field(default_factory=list)

    def _record(self, statement: str, seconds: float) -> None:
        self.sql_statements += 1
        self.sql_seconds += seconds
        entry = self.by_statement.setdefault(normalize(statement), [0, 0.0])
        entry[0] += 1
        entry[1] += seconds

    def __enter__(self) -> Probe:
        import botocore.client
        import psycopg
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            conn.info.setdefault("fleet_probe_started", []).append(time.perf_counter())

        def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            started = conn.info["fleet_probe_started"].pop()
            self._record(statement, time.perf_counter() - started)

        event.listen(Engine, "before_cursor_execute", before)
        event.listen(Engine, "after_cursor_execute", after)
        self._undo.append(lambda: event.remove(Engine, "before_cursor_execute", before))
        self._undo.append(lambda: event.remove(Engine, "after_cursor_execute", after))

        with _PATCH_LOCK:
            execute = psycopg.Cursor.execute
            api_call = botocore.client.BaseClient._make_api_call
            probe = self

            def counted_execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return execute(cursor, query, *args, **kwargs)
                finally:
                    text = query if isinstance(query, str) else repr(query)[:240]
                    probe._record(text, time.perf_counter() - started)

            def counted_call(client: Any, operation: str, params: Any) -> Any:
                probe.aws_calls[f"{client.meta.service_model.service_name}:{operation}"] += 1
                return api_call(client, operation, params)

            psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
            botocore.client.BaseClient._make_api_call = counted_call  # type: ignore[method-assign]

        def restore() -> None:
            psycopg.Cursor.execute = execute  # type: ignore[method-assign]
            botocore.client.BaseClient._make_api_call = api_call  # type: ignore[method-assign]

        self._undo.append(restore)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()

    def s3_calls(self) -> int:
        return sum(n for name, n in self.aws_calls.items() if name.startswith("s3:"))

    def top(self, count: int = 5) -> list[dict[str, Any]]:
        """The statements that took longest in all, with how often they ran."""
        ranked = sorted(self.by_statement.items(), key=lambda item: -item[1][1])[:count]
        return [{"seconds": round(s, 3), "count": int(n), "sql": text} for text, (n, s) in ranked]

    def summary(self) -> dict[str, Any]:
        return {
            "sql_statements": self.sql_statements,
            "sql_seconds": round(self.sql_seconds, 3),
            "aws_calls": dict(self.aws_calls),
            "top_statements": self.top(),
        }
