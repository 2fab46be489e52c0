"""Helpers of the slice-query tests: what the journal holds, and collecting a live stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg

from journal import EventEnvelope, Journal


async def journal_events(j: Journal) -> set[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            psycopg.sql.SQL("SELECT persistence_id, seq_nr FROM {} WHERE NOT deleted").format(
                j.tables.journal
            )
        )
        return {(p, s) for p, s in await cur.fetchall()}


async def collect_until(
    stream: AsyncIterator[EventEnvelope],
    out: list[EventEnvelope],
    done: asyncio.Event,
) -> None:
    async for env in stream:
        out.append(env)
        if done.is_set():
            return
