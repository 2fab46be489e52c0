# Generated from projections/aio/__init__.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The projection runners' drivers, blocking here: the one source of every I/O behaviour.

The blocking twins in `projections/sync/` are generated from the modules of
`projections/aio/` by `tools/async_to_sync.py`. What decides (validation, gap
fills, batching, progress markers) is the sans-I/O core in
`projections/core.py` and `projections/offset_store.py`; the statements are
in `projections/offset_sql.py` and `projections/management_sql.py`.
"""
