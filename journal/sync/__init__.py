# Generated from journal/aio/__init__.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The journal's drivers, blocking here: the one source of every I/O behaviour.

The blocking twins in `journal/sync/` are generated from the modules of
`journal/aio/` by `tools/async_to_sync.py`; the pure parts they execute
(statements, the slice-query machine, row decoding) live beside them in
`journal/`.
"""
