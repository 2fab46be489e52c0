"""The journal's drivers, asyncio here: the one source of every I/O behaviour.

The blocking twins in `journal/sync/` are generated from the modules of
`journal/aio/` by `tools/async_to_sync.py`; the pure parts they execute
(statements, the slice-query machine, row decoding) live beside them in
`journal/`.
"""
