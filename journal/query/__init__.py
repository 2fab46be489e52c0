"""Queries over the journal: by persistence id and by slice range.

`by_slice` holds the slice query's decisions as a plain state machine;
`reader` executes them against PostgreSQL.
"""
