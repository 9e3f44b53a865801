"""pgqueuer's enqueue, one job at a time, timed: the peer figure of #30 item 3.

pgqueuer is not a dependency of this project: run this with a Python that has it
(``python -m venv /tmp/peer && /tmp/peer/bin/pip install pgqueuer asyncpg``), against a
PostgreSQL database of its own (its tables are installed there, and emptied first):

    createdb pgq_bench
    /tmp/peer/bin/python scripts/peer_pgqueuer.py --dsn postgresql://postgres@127.0.0.1/pgq_bench

It prints one JSON object: ``enqueue_single_per_s``, each ``Queries.enqueue`` of one job
awaited before the next, as ``dbqueue_bench --only enqueue`` times ours (a warm-up of
200 first, untimed), on one asyncpg connection; and ``enqueue_in_transaction_per_s``,
the enqueue's own cost inside a caller's writing transaction, timed as
``dbqueue_bench``'s ``enqueue_in_transaction_per_s`` is: the same transactions (one
UPDATE of a row of the caller's) with and without an enqueue, alternating in 10 rounds,
and the difference is the enqueue's.
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
    in_transaction = await _in_transaction(conn, queries, count)
    await queries.clear_queue()
    await conn.close()
    return {
        "peer": "pgqueuer",
        "enqueue_single_per_s": round(count / elapsed, 1),
        "enqueue_in_transaction_per_s": round(in_transaction, 1),
        "jobs": count,
    }


async def _in_transaction(conn: object, queries: object, count: int, rounds: int = 10) -> float:
    """Enqueues/s of the enqueue's own time inside the caller's transactions."""
    # A table of its own, logged as the caller's would be (a temporary table's commit
    # writes no WAL, so the enqueue would be charged the commit's flush).
    await conn.execute("DROP TABLE IF EXISTS caller")  # type: ignore[attr-defined]
    await conn.execute("CREATE TABLE caller (id int PRIMARY KEY, n int)")  # type: ignore[attr-defined]
    await conn.execute("INSERT INTO caller VALUES (1, 0)")  # type: ignore[attr-defined]
    per_round = max(1, count // rounds)
    without = with_enqueue = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            async with conn.transaction():  # type: ignore[attr-defined]
                await conn.execute("UPDATE caller SET n = n + 1 WHERE id = 1")  # type: ignore[attr-defined]
        middle = time.perf_counter()
        for _ in range(per_round):
            async with conn.transaction():  # type: ignore[attr-defined]
                await conn.execute("UPDATE caller SET n = n + 1 WHERE id = 1")  # type: ignore[attr-defined]
                await queries.enqueue("noop", None)  # type: ignore[attr-defined]
        without += middle - started
        with_enqueue += time.perf_counter() - middle
    await conn.execute("DROP TABLE caller")  # type: ignore[attr-defined]
    return per_round * rounds / (with_enqueue - without)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.dsn, args.jobs))))
