"""The shared-memory table in which each worker process tells its supervisor what it does.

One slot per child process, in memory shared at fork: which jobs it holds, which ones it
is running (one *lane* per executor thread: ``run_jobs --threads T`` gives each child T
lanes) and since when, their timeout deadlines, and the jobs that finished but are not
recorded yet (with their results). The child writes its slot with plain stores (no
system call, no database); the supervisor reads it on its own clock, which no job's code
can hold up, and after the child dies, to settle what it left behind.

Only the child writes its slot, except the cancellation fields, which only the keeper
(the supervisor) writes. Each lane is written by one thread only, under a sequence counter
of its own (odd while a write is under way), so a reader never mixes two jobs' fields. The held ids
need no such care: a reader that catches a batch half-written renews a stale lease
(guarded, so it changes nothing) or misses a new one until the next heartbeat.
"""

from __future__ import annotations

import ctypes
import json
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import Any

# What the running job is doing, as the supervisor needs to know it.
IDLE, RUNNING, RECORDING = 0, 1, 2

# Room for finished-but-unrecorded results per slot. A result that does not fit is
# recorded at once instead (see recording.Recorder.done), so this bounds memory, not results.
LOG_BYTES = 64 * 1024
# job id, start and end (epoch seconds), result length (-1: None)
_RECORD = struct.Struct("<qddi")


class Lane(ctypes.Structure):
    """The job one executor thread runs."""

    _fields_ = [
        ("seq", ctypes.c_int64),
        ("job_id", ctypes.c_int64),
        ("phase", ctypes.c_int64),
        ("started", ctypes.c_double),  # time.monotonic(): the same clock in every process
        ("started_wall", ctypes.c_double),  # time.time(), for started_at
        ("deadline", ctypes.c_double),  # monotonic time the timeout runs out; 0: none
        ("cancel", ctypes.c_int64),  # written by the keeper: interrupt this running job
    ]


class Header(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_int64),  # entries of `ids` in use
        ("log_used", ctypes.c_int64),  # bytes of the done log in use
        ("done", ctypes.c_int64),
        ("failed", ctypes.c_int64),
        ("retried", ctypes.c_int64),
        # Written by the keeper:
        ("cancel_count", ctypes.c_int64),  # entries of `cancels` in use
        ("stop_signal", ctypes.c_int64),  # the signal run_jobs got, passed on as SIGTERM
    ]


@dataclass(frozen=True)
class Running:
    job_id: int
    phase: int
    started: float
    started_wall: float
    deadline: float
    lane: int = 0


@dataclass(frozen=True)
class Done:
    job_id: int
    started_wall: float
    finished_wall: float
    result: Any


class Slot:
    """One child's entry; the same object is used on both sides of the fork."""

    def __init__(
        self, header: Header, lanes: Any, ids: Any, cancels: Any, log: memoryview, capacity: int
    ) -> None:
        self._h = header
        self._lanes = lanes
        self._lane0 = lanes[0]  # --threads 1 (most workers): no indexing per job
        self.lanes = len(lanes)
        self._ids = ids
        self._cancels = cancels
        self._log = log
        self.capacity = capacity

    # -- written by the child ----------------------------------------------------------

    def hold(self, ids: Sequence[int]) -> None:
        """A new batch: these ids are held until released one by one."""
        for index, job_id in enumerate(ids):
            self._ids[index] = job_id
        self._h.count = len(ids)

    def release(self, index: int) -> None:
        self._ids[index] = 0

    def put(self, index: int, job_id: int) -> None:
        """Hold one more job at a free entry (threaded workers: batches overlap)."""
        self._ids[index] = job_id
        if self._h.count <= index:
            self._h.count = index + 1

    def start(
        self, job_id: int, timeout: float | None, lane: int = 0, wall: float | None = None
    ) -> float:
        """A job starts now (at ``wall``, a time.time(), when the caller has it already);
        returns the time.monotonic() it started at."""
        h = self._lanes[lane] if lane else self._lane0
        h.seq += 1
        h.job_id = job_id
        h.phase = RUNNING
        h.started = now = time.monotonic()
        h.started_wall = time.time() if wall is None else wall
        h.deadline = now + timeout if timeout else 0.0
        h.seq += 1
        return now

    def returned(self, lane: int = 0) -> None:
        """The job's code is over; its outcome is being recorded (no deadline applies)."""
        h = self._lanes[lane] if lane else self._lane0
        h.seq += 1
        h.phase = RECORDING
        h.deadline = 0.0
        h.seq += 1

    def end(self, lane: int = 0) -> None:
        h = self._lanes[lane] if lane else self._lane0
        h.seq += 1
        h.job_id = 0
        h.phase = IDLE
        h.seq += 1

    def log_done(self, job_id: int, started_wall: float, finished_wall: float, result: Any) -> bool:
        """Note a finished job, its start and end and its result; False when the log has
        no room for it."""
        data = b"" if result is None else json.dumps(result).encode()
        used = self._h.log_used
        end = used + _RECORD.size + len(data)
        if end > len(self._log):
            return False
        length = -1 if result is None else len(data)
        _RECORD.pack_into(self._log, used, job_id, started_wall, finished_wall, length)
        self._log[used + _RECORD.size : end] = data
        self._h.log_used = end  # the record exists from this store on
        return True

    def clear_log(self) -> None:
        """The logged jobs are recorded in the database now."""
        self._h.log_used = 0

    def count(self, done: int, failed: int, retried: int) -> None:
        h = self._h
        h.done, h.failed, h.retried = done, failed, retried

    def cancel_requested(self, job_id: int) -> bool:
        count = self._h.cancel_count
        return bool(count) and job_id in self._cancels[:count]

    # -- read (and the cancellations written) by the keeper ----------------------------

    def running(self, writer_gone: bool = False, lane: int = 0) -> Running | None:
        """A lane's running job, or None. Once the writer is gone, a write it left half
        done is read as it stands; while it lives, a reader that keeps catching it
        mid-write (a child stopped with SIGSTOP) gives up and sees nothing this time."""
        h = self._lanes[lane]
        for _ in range(1000):
            seq = h.seq
            entry = Running(h.job_id, h.phase, h.started, h.started_wall, h.deadline, lane)
            if writer_gone or (seq % 2 == 0 and h.seq == seq):
                return entry if entry.job_id else None
        return None

    def runs(self, writer_gone: bool = False) -> list[Running]:
        """The running job of every lane that has one."""
        if self.lanes == 1:
            entry = self.running(writer_gone)
            return [] if entry is None else [entry]
        found = (self.running(writer_gone, lane) for lane in range(self.lanes))
        return [entry for entry in found if entry is not None]

    def held(self) -> list[int]:
        count = min(self._h.count, self.capacity)
        return [job_id for job_id in self._ids[:count] if job_id]

    def done_log(self) -> list[Done]:
        entries = []
        offset, used = 0, min(self._h.log_used, len(self._log))
        while offset + _RECORD.size <= used:
            job_id, started_wall, finished_wall, length = _RECORD.unpack_from(self._log, offset)
            offset += _RECORD.size
            result = None
            if length >= 0:
                try:
                    result = json.loads(bytes(self._log[offset : offset + length]))
                except ValueError:
                    break  # not what the worker wrote: the rest is settled as unfinished
                offset += length
            entries.append(Done(job_id, started_wall, finished_wall, result))
        return entries

    def totals(self) -> tuple[int, int, int]:
        return self._h.done, self._h.failed, self._h.retried

    def request_cancel(self, ids: Iterable[int], running: Iterable[Running] = ()) -> None:
        wanted = list(ids)[: self.capacity]
        self._h.cancel_count = 0
        for index, job_id in enumerate(wanted):
            self._cancels[index] = job_id
        self._h.cancel_count = len(wanted)
        for entry in running:
            self._lanes[entry.lane].cancel = entry.job_id

    def pass_stop(self, signum: int) -> None:
        """The keeper is stopping because of ``signum``: the child names it (a Ctrl-C is
        passed on as SIGTERM, and must not be reported as one)."""
        self._h.stop_signal = signum

    def stop_signal(self) -> int:
        """The signal the keeper stopped for (0: none passed on)."""
        return int(self._h.stop_signal)

    def cancel_running(self, lane: int = 0) -> int:
        """The job the keeper asked this lane to interrupt (0: none)."""
        return int(self._lanes[lane].cancel)

    def reset(self) -> None:
        """Empty the slot for a new process."""
        ctypes.memset(ctypes.addressof(self._h), 0, ctypes.sizeof(Header))
        ctypes.memset(ctypes.addressof(self._lanes), 0, ctypes.sizeof(self._lanes))


class SlotTable:
    """``size`` slots of ``capacity`` held jobs and ``lanes`` running jobs each, in memory
    that forked children share."""

    def __init__(
        self, size: int, capacity: int, log_bytes: int = LOG_BYTES, lanes: int = 1
    ) -> None:
        self.size, self.capacity, self.lanes = size, capacity, lanes
        self._headers: Any = RawArray(Header, size)
        self._lanes: Any = RawArray(Lane, size * lanes)
        self._ids: Any = RawArray(ctypes.c_int64, size * capacity)
        self._cancels: Any = RawArray(ctypes.c_int64, size * capacity)
        self._logs: Any = RawArray(ctypes.c_ubyte, size * log_bytes)
        self._log_bytes = log_bytes

    def __getitem__(self, index: int) -> Slot:
        if not 0 <= index < self.size:
            raise IndexError(index)
        cap, log = self.capacity, self._log_bytes
        ids = (ctypes.c_int64 * cap).from_buffer(self._ids, index * cap * 8)
        cancels = (ctypes.c_int64 * cap).from_buffer(self._cancels, index * cap * 8)
        view = memoryview(self._logs).cast("B")[index * log : (index + 1) * log]
        offset = index * self.lanes * ctypes.sizeof(Lane)
        lanes = (Lane * self.lanes).from_buffer(self._lanes, offset)
        return Slot(self._headers[index], lanes, ids, cancels, view, cap)
