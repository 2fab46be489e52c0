"""The projection fleet: worker processes that share a projection's slice ranges
through PostgreSQL leases, fenced, and rescaled with one command."""
