"""Runs N worker processes, replaces those that die, and stops them on a signal."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from django.db import connections

from django_dbqueue.worker.loop import Stats, Worker
from django_dbqueue.worker.progress import Progress

logger = logging.getLogger("django_dbqueue.supervisor")


def _child_main(slot: int, counters: Any, options: dict[str, Any], parent: int) -> None:
    # Forked from the supervisor, which forwards SIGTERM to us. A Ctrl-C reaches the whole
    # process group, so children ignore SIGINT: otherwise one Ctrl-C would arrive twice
    # (directly and forwarded) and count as the second, "stop now" signal.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def report(stats: Stats) -> None:
        base = slot * 3
        counters[base], counters[base + 1], counters[base + 2] = (
            stats.done,
            stats.failed,
            stats.retried,
        )

    Worker(on_progress=report, ignore_sigint=True, parent_pid=parent, **options).run()
    connections.close_all()
    sys.exit(0)


class Supervisor:
    def __init__(
        self,
        concurrency: int,
        worker_options: dict[str, Any],
        progress: Progress | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.options = worker_options
        self.progress = progress
        self.burst = bool(worker_options.get("burst"))
        self._ctx = multiprocessing.get_context("fork")
        self._counters: Any = self._ctx.Array("q", 3 * concurrency, lock=False)
        self._retired = Stats()  # counts of children that exited, so totals never go back
        self._children: dict[int, BaseProcess] = {}
        self._signals = 0

    def _options_for(self, slot: int) -> dict[str, Any]:
        options = dict(self.options)
        max_jobs = options.get("max_jobs")
        if max_jobs is not None:
            share = max_jobs // self.concurrency + (1 if slot < max_jobs % self.concurrency else 0)
            options["max_jobs"] = share
        return options

    def _spawn(self, slot: int) -> None:
        base = slot * 3
        self._retired.done += self._counters[base]
        self._retired.failed += self._counters[base + 1]
        self._retired.retried += self._counters[base + 2]
        self._counters[base] = self._counters[base + 1] = self._counters[base + 2] = 0
        options = self._options_for(slot)
        if options.get("max_jobs") == 0:
            return
        # Never let a child inherit an open database socket.
        connections.close_all()
        process = self._ctx.Process(
            target=_child_main,
            args=(slot, self._counters, options, os.getpid()),
            name=f"dbqueue-worker-{slot}",
            daemon=False,
        )
        process.start()
        self._children[slot] = process

    def totals(self) -> Stats:
        stats = Stats(self._retired.done, self._retired.failed, self._retired.retried)
        for slot in range(self.concurrency):
            stats.done += self._counters[slot * 3]
            stats.failed += self._counters[slot * 3 + 1]
            stats.retried += self._counters[slot * 3 + 2]
        return stats

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        logger.info(
            "Supervisor: %s received, stopping %s worker(s)%s",
            signal.Signals(signum).name,
            len(self._children),
            " now" if self._signals > 1 else " after their current job",
        )
        for process in self._children.values():
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    def run(self) -> Stats:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in range(self.concurrency):
                self._spawn(slot)
            while self._children:
                # Wakes as soon as a child exits (its sentinel), else every 0.2 s for progress.
                wait([p.sentinel for p in self._children.values()], timeout=0.2)
                for slot, process in list(self._children.items()):
                    if process.is_alive():
                        continue
                    process.join()
                    del self._children[slot]
                    code = process.exitcode
                    # Exit code 0: the worker ran out of work (--burst, --max-jobs) or was
                    # told to stop. Anything else is a crash, and its slot is refilled.
                    if self._signals or code == 0:
                        continue
                    logger.warning(
                        "Supervisor: worker %s (pid %s) died with exit code %s; "
                        "starting a replacement",
                        slot,
                        process.pid,
                        code,
                    )
                    self._spawn(slot)
                if self.progress is not None:
                    self.progress.update(self.totals())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.totals()
