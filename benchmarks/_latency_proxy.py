"""A TCP proxy in front of PostgreSQL that delays what it forwards: a network.

    python benchmarks/_latency_proxy.py TARGET RTT_MS

Users' databases sit across a network, and a Unix socket hides the round trips a
library makes. This forwards each client connection (TCP, 127.0.0.1, a free port
printed on the first line of stdout) to `TARGET` (`host:port`, or the path of a
Unix socket) and holds every chunk from the server `RTT_MS` milliseconds before
passing it on, in order, so each round trip costs at least that. (All of it on
the way back: the event loop's timers round a delay up to the millisecond, so two
half delays would add up to two milliseconds.)
It runs as a process of its own (`benchmarks/_common.py` starts it for `--rtt-ms`),
so its work does not share the measured process's event loop; the round trip it
really gives is measured and printed by the benchmark (the event loop's timers
round a delay up to the millisecond).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _forward(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(1 << 16):
            queue.put_nowait((loop.time() + delay, data))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, b""))
    with contextlib.suppress(ConnectionError):
        await sender


async def _serve(target: str, delay: float) -> None:
    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if target.startswith("/"):
            return await asyncio.open_unix_connection(target)
        host, port = target.rsplit(":", 1)
        return await asyncio.open_connection(host, int(port))

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await connect()
        await asyncio.gather(_forward(client_r, server_w, 0.0), _forward(server_r, client_w, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    asyncio.run(_serve(argv[0], float(argv[1]) / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
