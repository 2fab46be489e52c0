"""The pure core loads no I/O stack and pickles, so a Spark executor or a worker
process can carry it: the slice-query state machine, the offset store's
validation, the model, settings, slices and serialization, the fleet's planner
and the Spark source's options and offsets."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from journal.model import EPOCH, NOT_LOADED, EventEnvelope, TimestampOffset
from journal.query.by_slice import BySliceQuery
from journal.settings import BacktrackingSettings, JournalSettings, QuerySettings
from journal.slices import SliceRange, slice_ranges
from projections.offset_store import OffsetState, Record
from projections.settings import ProjectionSettings

PURE_MODULES = [
    "journal",
    "journal.model",
    "journal.settings",
    "journal.slices",
    "journal.serialization",
    "journal.errors",
    "journal.query.by_slice",
    "projections.core",
    "projections.names",
    "projections.offset_store",
    "projections.settings",
    "projections.recovery",
    "projections.fleet.assignment",
    "projections.spark.offsets",
    "projections.spark.options",
]
IO_STACK = ("psycopg", "psycopg_pool", "asyncio", "pyspark")
# The packages whose `__init__` resolves the I/O-bound names on first use (PEP 562).
LAZY_PACKAGES = ["journal", "projections", "projections.fleet", "projections.spark"]


def test_the_pure_core_imports_no_io_stack() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {PURE_MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {IO_STACK!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == []


def test_every_lazy_export_resolves_to_what_it_names() -> None:
    # Importing a submodule binds it as an attribute of its package; an export of the
    # same name (say a function `project` in a module `project`) would then resolve to
    # the module once that module had been imported by anything else first. And a name
    # mapped to two modules resolves through the later one only, which may lack it.
    code = (
        "import importlib, json, pkgutil, types\n"
        f"packages = [importlib.import_module(p) for p in {LAZY_PACKAGES!r}]\n"
        "for p in packages:\n"
        "    for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "wrong = [f'{p.__name__}.{n}' for p in packages for n in p.__all__\n"
        "         if isinstance(getattr(p, n, None), types.ModuleType | None)]\n"
        "print(json.dumps(sorted(wrong)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(result.stdout) == []


def roundtrip(value: Any) -> Any:
    return pickle.loads(pickle.dumps(value))


def test_offsets_envelopes_settings_and_ranges_pickle() -> None:
    offset = TimestampOffset(EPOCH + timedelta(seconds=5), EPOCH, {"A|1": 3, "A|2": 1})
    assert roundtrip(offset) == offset
    env = EventEnvelope("A|1", "A", 5, 3, offset.timestamp, NOT_LOADED, offset=offset)
    again = roundtrip(env)
    assert again == env and again.event is NOT_LOADED
    settings = JournalSettings(schema="s", query=QuerySettings(buffer_size=7))
    assert roundtrip(settings) == settings
    assert roundtrip(ProjectionSettings()) == ProjectionSettings()
    assert roundtrip(slice_ranges(4)) == slice_ranges(4)
    assert roundtrip(SliceRange(3, 9)) == SliceRange(3, 9)


def test_query_state_and_offset_state_pickle() -> None:
    settings = QuerySettings(backtracking=BacktrackingSettings(window=60, behind_current_time=5))
    offset = TimestampOffset(EPOCH + timedelta(seconds=5), EPOCH, {"A|1": 3})
    machine = BySliceQuery(settings, offset, now=100.0)
    copy = roundtrip(machine)
    assert copy.next_request(100.0) == machine.next_request(100.0)
    records = [Record(5, "A|1", 3, offset.timestamp), Record(6, "A|2", 1, offset.timestamp)]
    state = OffsetState(timedelta(minutes=5), records)
    again = roundtrip(state)
    assert again.seq_nr_of("A|1") == 3 and again.seq_nr_of("A|2") == 1
    assert again.start_offset(range(5, 7)) == state.start_offset(range(5, 7))


@pytest.mark.parametrize("module", PURE_MODULES)
def test_each_pure_module_is_importable(module: str) -> None:
    __import__(module)
