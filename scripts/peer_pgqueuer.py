"""pgqueuer's enqueue, one job at a time, timed: the peer figure of #30 item 3.

pgqueuer is not a dependency of this project: run this with a Python that has it
(``python -m venv /tmp/peer && /tmp/peer/bin/pip install pgqueuer asyncpg``), against a
PostgreSQL database of its own (its tables are installed there, and emptied first):

    createdb pgq_bench
    /tmp/peer/bin/python scripts/peer_pgqueuer.py --dsn postgresql://postgres@127.0.0.1/pgq_bench

It prints one JSON object: ``enqueue_single_per_s``, each ``Queries.enqueue`` of one job
awaited before the next, as ``dbqueue_bench --only enqueue`` times ours (a warm-up of
200 first, untimed), on one asyncpg connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def main(dsn: str, count: int) -> dict[str, float | int | str]:
    import asyncpg  # type: ignore[import-not-found]
    from pgqueuer.db import AsyncpgDriver  # type: ignore[import-not-found]
    from pgqueuer.queries import Queries  # type: ignore[import-not-found]

    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    if not await queries.schema_is_installed():
        await queries.install()
    await queries.clear_queue()
    for _ in range(200):
        await queries.enqueue("noop", None)
    started = time.perf_counter()
    for _ in range(count):
        await queries.enqueue("noop", None)
    elapsed = time.perf_counter() - started
    await queries.clear_queue()
    await conn.close()
    return {"peer": "pgqueuer", "enqueue_single_per_s": round(count / elapsed, 1), "jobs": count}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.dsn, args.jobs))))
