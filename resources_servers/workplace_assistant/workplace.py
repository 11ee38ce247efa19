"""The workplace sandbox: one session's copy of a small company's data, and how two copies differ.

State is five collections: ``emails``, ``calendar_events``, ``project_tasks`` and ``customers``
(records keyed by an 8-digit id) plus ``plots`` (the charts created through analytics). The
company directory and the website visit log are read-only and shared by every session.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.base_resources_server import HTTPError

FIXTURES_DIR = Path(__file__).parent / "fixtures"

# Table name → id column. The order is the order diffs are reported in.
TABLES: dict[str, str] = {
    "emails": "email_id",
    "calendar_events": "event_id",
    "project_tasks": "task_id",
    "customers": "customer_id",
}
PLOT_FIELDS = ("time_min", "time_max", "value_to_plot", "plot_type")


@dataclass(frozen=True)
class Fixtures:
    """The company data every session starts from (never mutated)."""

    tables: Mapping[str, Mapping[str, Mapping[str, Any]]]
    directory: tuple[str, ...]
    visits: tuple[Mapping[str, Any], ...]


def load_fixtures(folder: str | Path = FIXTURES_DIR) -> Fixtures:
    """Read (once per folder) the fixture files; a malformed file raises naming file and record."""
    return _load_fixtures(str(Path(folder).resolve()))


@functools.lru_cache(maxsize=8)
def _load_fixtures(folder: str) -> Fixtures:
    root = Path(folder)

    def read(name: str) -> list[Any]:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"workplace fixture {path} is missing")
        try:
            data = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"workplace fixture {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, list):
            raise ValueError(f"workplace fixture {path} must hold a JSON list of records")
        return data

    tables: dict[str, dict[str, dict[str, Any]]] = {}
    for table, id_column in TABLES.items():
        rows: dict[str, dict[str, Any]] = {}
        for index, record in enumerate(read(f"{table}.json")):
            record_id = record.get(id_column) if isinstance(record, dict) else None
            if not isinstance(record_id, str):
                raise ValueError(f"{table}.json record {index}: missing string field {id_column!r}")
            if record_id in rows:
                raise ValueError(f"{table}.json record {index}: duplicate {id_column} {record_id!r}")
            rows[record_id] = record
        tables[table] = rows
    directory = tuple(str(address).lower() for address in read("company_directory.json"))
    visits = tuple(read("analytics_visits.json"))
    return Fixtures(tables=tables, directory=directory, visits=visits)


class Workplace:
    """One session's mutable copy of the company data, plus the plots it has created.

    New records get ids past the largest id the table has ever held, so a created record
    never takes over the identity of a seeded (or deleted) one.
    """

    def __init__(self, fixtures: Fixtures, now: str) -> None:
        self.fixtures = fixtures
        self.now = now
        self.tables: dict[str, dict[str, dict[str, Any]]] = {
            table: {record_id: dict(record) for record_id, record in rows.items()}
            for table, rows in fixtures.tables.items()
        }
        self.plots: list[dict[str, str]] = []
        self._next_ids = {
            table: max((int(record_id) for record_id in rows if record_id.isdigit()), default=-1) + 1
            for table, rows in fixtures.tables.items()
        }

    def new_id(self, table: str) -> str:
        """A fresh 8-digit id for ``table``."""
        number = self._next_ids[table]
        self._next_ids[table] = number + 1
        return f"{number:08d}"

    def record(self, table: str, record_id: str, noun: str) -> dict[str, Any]:
        """The live record ``record_id`` of ``table``; a 404 naming it when there is none."""
        found = self.tables[table].get(record_id)
        if found is None:
            raise HTTPError(404, f"{noun} {record_id!r} not found")
        return found


def _canonical(value: Any) -> Any:
    # Text compares case- and edge-whitespace-insensitively ("Raj.Patel@atlas.com " is the
    # same address); an empty string and a missing value are the same thing.
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().casefold()
        return text or None
    return value


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _record_key(record: Mapping[str, Any], skip: str | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _canonical(v)) for k, v in record.items() if k != skip))


def _describe(key: tuple[tuple[str, Any], ...]) -> str:
    return "{" + ", ".join(f"{k}: {_show(v, 40)}" for k, v in key if v is not None) + "}"


def state_diff(actual: Workplace, expected: Workplace) -> list[str]:
    """Every difference between two sessions' states, as readable lines (empty when equal).

    Seeded records are matched by id and compared field by field. Records created during the
    rollout are matched by content alone (their ids depend on creation order), as are plots.
    """
    lines: list[str] = []
    for table, id_column in TABLES.items():
        seeded = actual.fixtures.tables[table]
        got, want = actual.tables[table], expected.tables[table]
        for record_id in seeded:
            a, e = got.get(record_id), want.get(record_id)
            if a is None and e is None:
                continue
            if a is None:
                lines.append(f"{table} {record_id}: deleted, expected kept")
            elif e is None:
                lines.append(f"{table} {record_id}: still present, expected deleted")
            else:
                for field in sorted(set(a) | set(e)):
                    if _canonical(a.get(field)) != _canonical(e.get(field)):
                        lines.append(
                            f"{table} {record_id}: {field} is {_show(a.get(field))}, expected {_show(e.get(field))}"
                        )
        created_got = Counter(_record_key(r, id_column) for rid, r in got.items() if rid not in seeded)
        created_want = Counter(_record_key(r, id_column) for rid, r in want.items() if rid not in seeded)
        for key in sorted(created_want - created_got, key=repr):
            lines.append(f"{table}: missing new record {_describe(key)}")
        for key in sorted(created_got - created_want, key=repr):
            lines.append(f"{table}: unexpected new record {_describe(key)}")
    plots_got = Counter(_record_key(p, None) for p in actual.plots)
    plots_want = Counter(_record_key(p, None) for p in expected.plots)
    for key in sorted(plots_want - plots_got, key=repr):
        lines.append(f"plots: missing new plot {_describe(key)}")
    for key in sorted(plots_got - plots_want, key=repr):
        lines.append(f"plots: unexpected new plot {_describe(key)}")
    return lines
