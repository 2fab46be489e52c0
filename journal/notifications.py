"""LISTEN/NOTIFY wake-ups: the payload format, and why notifications are sent as they are.

The sender and the listener are drivers (`journal/aio/notifications.py` and
its generated sync twin); this module holds what both share.

Notifications are hints only. A query that misses one still finds the events on
its next poll, so nothing here is needed for correctness, only for latency.

Why post-commit, from one background task: `NOTIFY` inside a transaction takes
a database-wide lock at commit, which serialises every notifying writer's
commit (and so its WAL flush). Instead, `append` records "entity type X,
slice bucket B changed" in memory after its commit, and one sender per
`Journal` turns everything recorded since its last send into one `pg_notify`
per entity type. At low rates that is one notification per append, sent at
once; after each send the task waits 10 ms, so at high rates many appends
share one and the lock is taken at most ~100 times per second no matter how
many writers there are. Appends made inside a caller's transaction (`conn=`)
notify inside it instead, because only the caller knows when it commits.

Payload: ``"<16 hex digits>:<entity type>"`` — a 64-bit mask of slice buckets
(bucket = slice // 16) followed by the entity type. Channel: see
`Tables.notify_channel`.
"""

from __future__ import annotations

SLICES_PER_BUCKET = 16
MIN_SEND_INTERVAL = 0.01
_MASK_DIGITS = 16


def bucket_bit(slice_: int) -> int:
    """The mask bit of the bucket holding `slice_`."""
    return 1 << (slice_ // SLICES_PER_BUCKET)


def bucket_mask(min_slice: int, max_slice: int) -> int:
    """The bucket mask covering an inclusive slice range."""
    mask = 0
    for bucket in range(min_slice // SLICES_PER_BUCKET, max_slice // SLICES_PER_BUCKET + 1):
        mask |= 1 << bucket
    return mask


def encode_payload(entity_type: str, mask: int) -> str:
    """Build a notification payload for an entity type and a bucket mask."""
    return f"{mask:0{_MASK_DIGITS}x}:{entity_type}"


def decode_payload(payload: str) -> tuple[str, int] | None:
    """Split a payload into (entity type, bucket mask); None if it is not ours."""
    if len(payload) <= _MASK_DIGITS or payload[_MASK_DIGITS] != ":":
        return None
    try:
        mask = int(payload[:_MASK_DIGITS], 16)
    except ValueError:
        return None
    return payload[_MASK_DIGITS + 1 :], mask
