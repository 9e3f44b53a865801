"""enqueue_many() with dependencies between its items (item(index)): each job starts
after the jobs it depends on, exactly once, with real worker processes; cycles and
indexes out of range are refused with nothing written."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest

from django_dbqueue import enqueue, enqueue_batch, enqueue_many
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Dependency, Job
from django_dbqueue.workflows.chains import chain, group
from django_dbqueue.workflows.graph import item
from testproject.models import Execution
from tests.support import Processes, flow_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)
S = Job.Status


def record(key: str, **options: object) -> dict[str, object]:
    return {"task": jobs.record, "args": [key], **options}


def test_items_wait_for_items_of_the_same_call_and_for_jobs_that_exist() -> None:
    before = enqueue(flow_jobs.value, [1])
    made = enqueue_many(
        [
            {"task": flow_jobs.sum_dependencies, "depends_on": [item(1), item(2)]},
            {"task": flow_jobs.value, "args": [2]},
            {"task": flow_jobs.value, "args": [3], "depends_on": [before]},
            {"task": flow_jobs.value, "args": [4]},  # no edges: an ordinary job
        ]
    )
    assert [job.status for job in made] == [S.WAITING, S.QUEUED, S.WAITING, S.QUEUED]
    assert [job.args for job in made] == [[], [2], [3], [4]]  # the items' order
    edges = set(Dependency.objects.values_list("job_id", "depends_on_id"))
    assert edges == {(made[0].pk, made[1].pk), (made[0].pk, made[2].pk), (made[2].pk, before.pk)}
    assert set(Job.objects.filter(workflow=True).values_list("id", flat=True)) == {
        before.pk,
        made[1].pk,
        made[2].pk,
    }


def test_a_failed_item_cancels_the_items_after_it_or_they_run_when_asked() -> None:
    from django_dbqueue.worker.loop import Worker

    made = enqueue_many(
        [
            {"task": flow_jobs.explode, "max_attempts": 1},
            {"task": flow_jobs.value, "args": [1], "depends_on": [item(0)]},
            {"task": flow_jobs.value, "args": [2], "depends_on": [item(1)]},
            {
                "task": flow_jobs.value,
                "args": [3],
                "depends_on": [item(0)],
                "on_dependency_failure": "run",
            },
        ]
    )
    Worker(burst=True, handle_signals=False).run()
    assert [job.refresh_status() for job in made] == [S.FAILED, S.CANCELLED, S.CANCELLED, S.DONE]


@pytest.mark.parametrize(
    ("edges", "message"),
    [
        ({0: [1], 1: [2], 2: [0]}, r"cycle: 0 -> 1 -> 2 -> 0"),
        ({1: [1]}, r"job 1: depends_on: item\(1\) is the job itself"),
        ({0: [3]}, r"job 0: depends_on: item\(3\) is out of range \(items 0 to 2\)"),
        ({2: [-1]}, r"job 2: depends_on: item\(-1\) is out of range"),
    ],
)
def test_cycles_and_bad_indexes_are_refused_and_nothing_is_written(edges, message) -> None:
    items = [
        record(str(n), **({"depends_on": [item(i) for i in edges[n]]} if n in edges else {}))
        for n in range(3)
    ]
    with pytest.raises(InvalidJob, match=message):
        enqueue_many(items)
    assert not Job.objects.exists()
    assert not Dependency.objects.exists()


def test_a_bad_item_after_inserted_ones_rolls_everything_back() -> None:
    real = enqueue(flow_jobs.value, [1])
    with pytest.raises(InvalidJob, match="job 2: depends_on: no job with id"):
        enqueue_many(
            [
                record("a"),
                record("b", depends_on=[item(0), real]),
                record("c", depends_on=[item(1), 10**12]),
            ]
        )
    with pytest.raises(InvalidJob, match=r"job 1: .*unique_key"):
        enqueue_many([record("a"), record("b", depends_on=[item(0)], unique_key="k")])
    with pytest.raises(InvalidJob, match=r"item\(\) takes an item's index"):
        item("0")  # type: ignore[arg-type]
    assert list(Job.objects.values_list("id", flat=True)) == [real.pk]
    assert not Dependency.objects.exists()
    assert Job.objects.get(pk=real.pk).workflow is False


def test_chains_groups_and_batches_take_the_items_of_a_call() -> None:
    made = enqueue_many([record("a"), record("b", depends_on=[item(0)])])
    steps = chain(record("c"), record("d"), depends_on=made)
    fan = group(record("e"), record("f"), depends_on=[steps[-1]])
    batch = enqueue_batch([record("g", depends_on=fan), record("h", depends_on=[item(0)])])
    members = list(Job.objects.filter(batch_id=batch.pk).order_by("id"))
    assert [m.args for m in members] == [["g"], ["h"]]
    assert set(Dependency.objects.filter(job_id=members[1].pk).values_list("depends_on_id")) == {
        (members[0].pk,)
    }
    assert set(Dependency.objects.filter(job_id=steps[0].pk).values_list("depends_on_id")) == {
        (made[0].pk,),
        (made[1].pk,),
    }


@pytest.mark.processes
def test_real_workers_run_every_item_once_after_its_dependencies(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    """A diamond per group of 6 items (a -> b, c, d -> e, and f after e and b), 40 groups
    in one call: 2 supervisors x 2 children drain it."""
    items: list[dict[str, object]] = []
    for g in range(40):
        base = len(items)
        items += [
            record(f"{g}a"),
            *[record(f"{g}{x}", depends_on=[item(base)]) for x in "bcd"],
            record(f"{g}e", depends_on=[item(base + 1), item(base + 2), item(base + 3)]),
            record(f"{g}f", depends_on=[item(base + 4), item(base + 1)]),
        ]
    made = enqueue_many(items)
    env = worker_env(POLL_INTERVAL=0.05)
    procs = [processes.run_jobs("--concurrency", "2", env=env) for _ in range(2)]
    output: list[str] = []
    for proc in procs:
        threading.Thread(target=lambda p=proc: output.extend(p.stdout or []), daemon=True).start()
    began = time.monotonic()
    while Job.objects.exclude(status=S.DONE).exists():
        assert time.monotonic() - began < 240, "".join(output)[-2000:]
        time.sleep(0.2)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, "".join(output)[-3000:]
    runs = sorted(Execution.objects.values_list("key", flat=True))
    assert runs == sorted(str(job.args[0]) for job in made)  # each exactly once
    rows = {job.pk: job for job in Job.objects.all()}
    checked = 0
    for edge in Dependency.objects.all():
        dependent, dependency = rows[edge.job_id], rows[edge.depends_on_id]
        assert dependent.started_at >= dependency.finished_at, (dependent, dependency)
        checked += 1
    assert checked == 40 * 8
    assert all(job.attempts == 1 for job in rows.values())
