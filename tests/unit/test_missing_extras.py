"""A name whose optional dependency is not installed says which extra installs it.

`from projections import OtelTelemetry` without the `otel` extra, or `from
projections.spark import project` without `spark`, used to fail with a bare "No
module named 'opentelemetry'". The packages export those names lazily
(`journal/_lazy.py`); that import now names the extra and its install line, and
is still a `ModuleNotFoundError` for the missing module, so `except ImportError`
code keeps working. Here the dependency is made missing the way Python allows
without uninstalling it: `None` in `sys.modules`.
"""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("package", "name", "module", "dependency", "extra"),
    [
        ("projections", "OtelTelemetry", "projections.telemetry_otel", "opentelemetry", "otel"),
        ("projections.spark", "project", "projections.spark.driver", "pyspark", "spark"),
    ],
)
def test_a_missing_extra_is_named_with_its_install_line(
    monkeypatch: pytest.MonkeyPatch,
    package: str,
    name: str,
    module: str,
    dependency: str,
    extra: str,
) -> None:
    exporter = importlib.import_module(package)
    monkeypatch.delitem(exporter.__dict__, name, raising=False)  # cached by an earlier use
    for loaded in [m for m in sys.modules if m == module or m.split(".")[0] == dependency]:
        monkeypatch.delitem(sys.modules, loaded)  # restored after the test
    monkeypatch.setitem(sys.modules, dependency, None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError) as caught:
        getattr(exporter, name)
    message = str(caught.value)
    assert f"{package}.{name} needs the {extra!r} extra" in message
    assert f"pip install 'slicejournal[{extra}]'" in message
    assert dependency in message
    assert (caught.value.name or "").split(".")[0] == dependency  # the module it missed


@pytest.mark.parametrize(
    ("package", "name", "module", "missing"),
    [
        # Not an extra's dependency: not ours to explain.
        ("projections", "PrometheusTelemetry", "projections.telemetry_prometheus",
         "prometheus_client"),
        # A module missing from an extra's package that is installed (a broken or
        # mismatched install): the extra is there, so installing it is not the answer.
        ("projections.spark", "project", "projections.spark.driver", "pyspark.sql"),
    ],
)  # fmt: skip
def test_other_missing_modules_go_up_unchanged(
    monkeypatch: pytest.MonkeyPatch, package: str, name: str, module: str, missing: str
) -> None:
    exporter = importlib.import_module(package)
    monkeypatch.delitem(exporter.__dict__, name, raising=False)
    for loaded in [m for m in sys.modules if m == module or m.startswith(missing)]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ModuleNotFoundError) as caught:
        getattr(exporter, name)
    assert "extra" not in str(caught.value)
    assert caught.value.name == missing
