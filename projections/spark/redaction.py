"""Keep a DSN's password out of the text Spark shows: plans, UIs, event logs.

The source and the sink take the DSN as a plain `dsn` option. Spark's own
redaction goes by names (`spark.redaction.regex`: keys like `password`,
`token`; `spark.sql.redaction.options.regex`: `url`), which `dsn` is not.
A classic session never prints our options, but a Spark Connect server
records each request's plan as text — options included — in the event log
(the operation, job, stage and SQL execution events). Spark redacts such
strings with `spark.sql.redaction.string.regex`, unset by default: `register`
sets it, for the session, to `DSN_PASSWORD` unless the user has chosen a
string redaction of their own (theirs must then cover DSNs).
"""

from __future__ import annotations

from typing import Any

STRING_REDACTION = "spark.sql.redaction.string.regex"
CORE_STRING_REDACTION = "spark.redaction.string.regex"  # the fallback of the former

# A key=value DSN's `password=...` (up to the next blank or quote), and a URI's
# `user:password` between `://` and `@` (Java regex; Spark replaces each match).
DSN_PASSWORD = r"""(?i)password\s*=\s*[^\s"]+|(?<=://)[^\s"/@:]*:[^\s"/@]*(?=@)"""


def redact_dsn_passwords(spark: Any) -> None:
    """Make `spark` (classic or Connect) redact DSN passwords in the strings it shows,
    unless a string redaction is set already."""
    for key in (STRING_REDACTION, CORE_STRING_REDACTION):
        if spark.conf.get(key, None):
            return
    spark.conf.set(STRING_REDACTION, DSN_PASSWORD)
