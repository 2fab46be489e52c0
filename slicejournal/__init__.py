"""slicejournal's application layer: the `slicejournal` command, the demo and the
embedded-server lifecycle.

It sits above the two libraries and imports both; `journal` and `projections`
never import it. A service embeds the libraries; this package is what a
developer runs.
"""

from journal.schema import release

__version__ = release()
