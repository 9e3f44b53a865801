"""named_lock in async code: ``async with`` and ``async def`` functions, on this run's
backend (Redis on SQLite runs, GET_LOCK on MySQL, advisory locks on PostgreSQL).

Each attempt runs in the thread-sensitive sync thread and the waits on the event loop,
so many tasks of one loop wait for one lock without holding up that thread (where its
holder's release runs), and a database lock is taken and released on one session.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_dbqueue.locks import LockNotAcquired, named_lock

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("async_connections"),
]


def test_async_with_holds_the_lock_until_the_block_ends(backend: str, lock_name: str) -> None:
    async def main() -> tuple[bool, bool]:
        async with named_lock(lock_name) as lock:
            # Asked of the server, on the thread (the session) that took it.
            owned = await sync_to_async(lock.owned, thread_sensitive=True)()
            with pytest.raises(LockNotAcquired):
                async with named_lock(lock_name, blocking=False):
                    pass
        async with named_lock(lock_name, blocking=False) as again:
            return owned, again.held

    assert asyncio.run(main()) == (True, True)


def test_tasks_of_one_loop_take_turns_under_the_lock(backend: str, lock_name: str) -> None:
    """20 tasks read, await, then write a shared value under the lock: none is lost, and
    never two are inside at once (each waits on the loop, not in the sync thread)."""
    state = {"value": 0, "inside": 0, "most": 0}

    async def bump() -> None:
        async with named_lock(lock_name, blocking_timeout=60):
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
            value = state["value"]
            await asyncio.sleep(0.002)
            state["value"] = value + 1
            state["inside"] -= 1

    async def main() -> None:
        await asyncio.gather(*(bump() for _ in range(20)))

    asyncio.run(main())
    assert (state["value"], state["most"]) == (20, 1)


def test_a_decorated_async_function_takes_its_lock_by_argument(
    backend: str, lock_name: str
) -> None:
    @named_lock(lock_name + ":{item_id}", blocking=False)
    async def work(item_id: int) -> int:
        await asyncio.sleep(0)
        return item_id * 2

    async def busy(item_id: int) -> str:
        return f"busy {item_id}"

    @named_lock(lock_name + ":{item_id}", blocking=False, on_fail=busy)
    async def work_or_busy(item_id: int) -> Any:
        return item_id

    async def main() -> list[Any]:
        results: list[Any] = [await work(1)]
        async with named_lock(f"{lock_name}:1"):
            with pytest.raises(LockNotAcquired):
                await work(1)
            results += [await work(2), await work_or_busy(1), await work_or_busy(2)]
        return [*results, await work(1)]

    assert asyncio.run(main()) == [2, 4, "busy 1", 2, 2]


def test_a_semaphore_admits_limit_async_holders(backend: str, lock_name: str) -> None:
    async def main() -> None:
        async with named_lock(lock_name, limit=2), named_lock(lock_name, limit=2):
            with pytest.raises(LockNotAcquired, match="2 holders"):
                async with named_lock(lock_name, limit=2, blocking=False):
                    pass
        async with named_lock(lock_name, limit=2, blocking=False):
            pass

    asyncio.run(main())


def test_an_async_waiter_gives_up_after_its_blocking_timeout(backend: str, lock_name: str) -> None:
    async def main() -> None:
        async with named_lock(lock_name):
            with pytest.raises(LockNotAcquired, match=r"gave up after 0\.2 s"):
                async with named_lock(lock_name, blocking_timeout=0.2):
                    pass

    asyncio.run(main())


def test_cancelled_tasks_leave_no_lock_behind(backend: str, lock_name: str) -> None:
    """A task cancelled inside its block releases the lock; one cancelled while it waits
    never holds it (an attempt that took it meanwhile gives it back)."""

    async def inside(entered: asyncio.Event) -> None:
        async with named_lock(lock_name):
            entered.set()
            await asyncio.sleep(60)

    async def main() -> bool:
        entered = asyncio.Event()
        holder = asyncio.ensure_future(inside(entered))
        await entered.wait()
        waiters = [asyncio.ensure_future(inside(asyncio.Event())) for _ in range(3)]
        await asyncio.sleep(0.05)
        for task in [holder, *waiters]:
            task.cancel()
        await asyncio.gather(holder, *waiters, return_exceptions=True)
        await asyncio.sleep(0.2)  # an abandoned attempt's release, if one took it
        async with named_lock(lock_name, blocking_timeout=5) as lock:
            return lock.held

    assert asyncio.run(main())


def test_a_name_from_arguments_needs_the_decorator_in_async_with_too(
    backend: str, lock_name: str
) -> None:
    async def main() -> None:
        async with named_lock(lambda item: f"{lock_name}:{item}"):
            pass

    with pytest.raises(TypeError, match="only works as a decorator"):
        asyncio.run(main())
