"""The ``calibration`` block ``speclane bench`` writes into report.json, from its tables.

``speclane simulate --calibrate`` fits its cost model and acceptance from these blocks
(``sim/calibrate.py``, which documents the fields), and reads a report without one
from its tables through the same function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

DECODE_TABLE = "One decode step"
SPEEDUP_TABLE = "Single-stream speed-up"


def calibration_record(scenario: str, tables: Sequence[Any], num_draft_tokens: int | None = None) -> dict[str, Any]:
    """The ``calibration`` block for a bench report: filled for ``decode`` and ``speedup``
    (``scenario=""`` reads whatever the tables hold), empty for other scenarios."""
    if scenario not in ("", "decode", "speedup"):
        return {}
    dicts = [t if isinstance(t, dict) else dataclasses.asdict(t) for t in tables]
    record: dict[str, Any] = {}
    steps = _step_times(dicts)
    if steps:
        record["step_ms_by_batch"] = {str(b): ms for b, ms in steps.items()}
    tasks = _speedup_tasks(dicts)
    if tasks:
        record["speedup_tasks"] = tasks
        if num_draft_tokens is not None:
            record["num_draft_tokens"] = num_draft_tokens
    return record


def _table(tables: Iterable[dict[str, Any]], title_prefix: str) -> dict[str, Any] | None:
    return next((t for t in tables if str(t.get("title", "")).startswith(title_prefix)), None)


def _column(table: dict[str, Any], name: str) -> int:
    return table["columns"].index(name)


def _step_times(tables: Iterable[dict[str, Any]]) -> dict[int, float]:
    t = _table(tables, DECODE_TABLE)
    if t is None:
        return {}
    b, ms = _column(t, "batch"), _column(t, "ms/step")
    return {int(row[b]): float(row[ms]) for row in t["rows"]}


def _speedup_tasks(tables: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    t = _table(tables, SPEEDUP_TABLE)
    if t is None:
        return []
    cols = {name: _column(t, name) for name in ("task", "speclane spec on tok/s", "spec off tok/s", "acceptance", "tokens/round")}
    return [{
        "task": row[cols["task"]],
        "on_tok_s": float(row[cols["speclane spec on tok/s"]]),
        "off_tok_s": float(row[cols["spec off tok/s"]]),
        "acceptance": _fraction(row[cols["acceptance"]]),
        "tokens_per_round": float(row[cols["tokens/round"]]),
    } for row in t["rows"]]


def _fraction(value: Any) -> float:
    text = str(value).strip()
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)
