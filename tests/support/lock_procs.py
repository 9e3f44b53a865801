"""Start lock_worker processes together and collect what they report."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.support import ROOT, reap


def run_lock_workers(
    env: dict[str, str] | list[dict[str, str]], count: int, **params: Any
) -> list[dict[str, Any]]:
    """Run ``count`` workers with the same params, released at once; all their reports.
    A list of environments is used in turn (the Galera tests: one node each)."""
    defaults = {"limit": 1, "lock": True, "increment": False, "hold": 0.0}
    args = json.dumps({**defaults, **params})
    envs = env if isinstance(env, list) else [env]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.lock_worker", args],
            cwd=ROOT,
            env=envs[i % len(envs)],
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                _, err = proc.communicate(timeout=30)
                raise AssertionError(f"lock worker failed to start: {line}{err}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        reports = []
        for proc in procs:
            assert proc.stdout is not None
            out = proc.stdout.read()
            proc.wait(timeout=120)
            assert proc.stderr is not None
            assert proc.returncode == 0, proc.stderr.read()
            reports.extend(json.loads(line) for line in out.splitlines())
        return reports
    finally:
        reap(procs)


def max_overlap(reports: list[dict[str, Any]]) -> int:
    """Most holders at one moment, from the [start, end] intervals they reported."""
    events = sorted(
        [(r["start"], 1) for r in reports] + [(r["end"], -1) for r in reports],
        key=lambda e: (e[0], e[1]),  # at a tie, a release counts before an acquisition
    )
    current = highest = 0
    for _, delta in events:
        current += delta
        highest = max(highest, current)
    return highest
