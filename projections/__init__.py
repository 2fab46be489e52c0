"""slicejournal's projections: turning slice streams into read models.

Filled in by the projections work (offset store, runners, rescaling).
"""
