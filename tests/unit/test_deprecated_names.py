"""Nothing public breaks without warning: every name of 0.2.0's `__all__` that a package
no longer exports still works for one minor release, warns, and names its replacement."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

PACKAGES = ("journal", "projections", "projections.spark", "projections.fleet")
BASELINE = Path(__file__).parent / "data" / "public_api_0.2.0.txt"
CHANGELOG = Path(__file__).parents[2] / "CHANGELOG.md"

# (package, name): (where the same object lives now, and the text the warning must contain).
DEPRECATED = {
    ("projections", "Mode"): ("projections.core", "Mode", "Projection.exactly_once"),
    ("projections", "ProjectionCore"): ("projections.core", "ProjectionCore", "internal"),
    ("projections", "OffsetState"): ("projections.offset_store", "OffsetState", "internal"),
    ("projections", "Record"): ("projections.offset_store", "Record", "internal"),
    ("projections", "Validation"): ("projections.offset_store", "Validation", "internal"),
    ("projections", "Verdict"): ("projections.offset_store", "Verdict", "internal"),
    ("projections", "ProjectionTables"): (
        "projections.tables",
        "ProjectionTables",
        "ProjectionTableNames",
    ),
    ("projections", "use_telemetry"): (
        "journal",
        "use_telemetry",
        "from journal import use_telemetry",
    ),
    ("projections", "parse_duration"): (
        "journal",
        "parse_duration",
        "from journal import parse_duration",
    ),
    ("projections.spark", "SparkHandler"): (
        "projections",
        "SyncGroupedHandler",
        "from projections import SyncGroupedHandler",
    ),
    ("projections.spark", "is_spark_session"): (
        "projections.spark.session",
        "is_spark_session",
        "internal",
    ),
    **{
        ("projections.fleet", name): ("projections", name, f"from projections import {name}")
        for name in (
            "FleetControl",
            "FleetStatus",
            "FleetWorker",
            "LeaseStatus",
            "WorkerApp",
            "WorkerSettings",
        )
    },
    **{
        ("projections.fleet", name): ("projections.fleet.assignment", name, "internal")
        for name in ("LeaseRow", "Plan", "assign", "plan")
    },
}


def baseline() -> set[tuple[str, str]]:
    lines = BASELINE.read_text(encoding="utf-8").splitlines()
    names = set()
    for line in lines:
        if line and not line.startswith("#"):
            package = next(p for p in sorted(PACKAGES, key=len, reverse=True) if line.startswith(p))
            names.add((package, line[len(package) + 1 :]))
    return names


def test_every_name_0_2_0_exported_is_exported_still_or_deprecated() -> None:
    gone = {
        (package, name)
        for package, name in baseline()
        if name not in importlib.import_module(package).__all__
    }
    assert gone == set(DEPRECATED)


@pytest.mark.parametrize(("package", "name"), sorted(DEPRECATED))
def test_a_deprecated_name_warns_naming_its_replacement_and_is_the_same_object(
    package: str, name: str
) -> None:
    home, attribute, replacement = DEPRECATED[package, name]
    current = getattr(importlib.import_module(home), attribute)
    with pytest.warns(DeprecationWarning, match=f"{package}.{name} is deprecated") as caught:
        old = getattr(importlib.import_module(package), name)
    assert old is current
    assert replacement in str(caught[0].message)
    assert "0.4.0" in str(caught[0].message)
    # Every use warns, not only the first: `from package import name` too, at the importer.
    with pytest.warns(DeprecationWarning) as again:
        exec(f"from {package} import {name}", {})  # the statement a user writes
    assert len(again) == 1


@pytest.mark.parametrize(("package", "name"), sorted(DEPRECATED))
def test_each_deprecation_is_in_the_changelog(package: str, name: str) -> None:
    unreleased = CHANGELOG.read_text(encoding="utf-8").split("\n## ")[1]
    deprecated = unreleased.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    assert f"`{package}.{name}`" in deprecated


def test_the_public_names_import_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for package in PACKAGES:
            module = importlib.import_module(package)
            for name in module.__all__:
                getattr(module, name)
            assert not set(module.__all__) & {n for p, n in DEPRECATED if p == package}


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = importlib.import_module("projections.fleet").Nope
