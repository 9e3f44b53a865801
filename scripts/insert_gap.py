"""What a pause between statements costs the driver's own INSERT: the limit under
``dbqueue_bench``'s enqueue share (#30 item 3).

    DBQUEUE_DB=mysql DBQUEUE_DB_NAME=bench python scripts/insert_gap.py

The statement is the INSERT ``enqueue()`` sends for a no-op job, its parameters quoted in
once by the driver, as ``dbqueue_bench``'s yardstick sends it (django_dbqueue/bench/
baseline.py). It is sent ``--count`` times in a row, autocommitted, with the client
busy (a loop on the CPU, as Python code between two enqueues would be) for 0, 100 and
250 µs (``--gaps``) between statements, in ``--rounds`` interleaved rounds. Printed, one
JSON object: per gap, the median µs per INSERT from its send to its answer (the driver's
``execute``), not counting the gap itself. When the answer takes longer with a gap than
without, any code between two enqueues costs more than its own time. Like ``dbqueue_bench``, it
deletes every job: run it on a database of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

GAPS_US = (0, 100, 250)  # the default of --gaps


def busy(microseconds: float) -> None:
    end = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < end:
        pass


def main(count: int, rounds: int, gaps: tuple[int, ...] = GAPS_US) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.db import connections, router

    from django_dbqueue.bench import baseline, runs
    from django_dbqueue.models import Job

    using = router.db_for_write(Job)
    conn = connections[using]
    sql, params = baseline._recorded_insert(using)
    conn.ensure_connection()
    raw = conn.connection
    text = baseline._statement(raw, conn.vendor, sql, params)
    cursor = raw.cursor()
    spent: dict[int, list[float]] = {gap: [] for gap in gaps}
    for _ in range(rounds):
        for gap in gaps:
            waited = 0.0
            for _ in range(count):
                busy(gap)
                started = time.perf_counter()
                cursor.execute(text)
                if cursor.description:
                    cursor.fetchall()
                waited += time.perf_counter() - started
            spent[gap].append(waited / count * 1e6)
    runs.clear_jobs()
    return {f"insert_us_gap_{gap}": round(statistics.median(v), 1) for gap, v in spent.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--gaps", type=int, nargs="+", default=GAPS_US, help="µs of client work to try"
    )
    args = parser.parse_args()
    print(json.dumps(main(args.count, args.rounds, tuple(args.gaps))))
