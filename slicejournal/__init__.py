"""slicejournal's application layer: the `slicejournal` command, the demo and the
embedded-server lifecycle.

It sits above the two libraries and imports both; `journal` and `projections`
never import it. A service embeds the libraries; this package is what a
developer runs.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("slicejournal")
except _metadata.PackageNotFoundError:  # pragma: no cover - a source tree not installed
    __version__ = "0+unknown"
