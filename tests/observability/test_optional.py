"""The optional libraries cost nothing when absent or switched off: the app imports,
enqueues and runs jobs without importing prometheus_client or opentelemetry at all."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = """
import json, sys
BLOCKED = sys.argv[1] == "absent"
if BLOCKED:
    # As if neither were installed: importing them raises ImportError.
    for name in ("prometheus_client", "opentelemetry"):
        sys.modules[name] = None
import django
django.setup()
from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.worker.loop import Worker
from tests.support import jobs

enqueue(jobs.add, args=[1, 2])
enqueue_many([{"task": jobs.add, "args": [3, 4]}])
Worker(burst=True, handle_signals=False).run()
loaded = sorted(
    name for name, module in sys.modules.items()
    if module is not None and name.split(".")[0] in ("prometheus_client", "opentelemetry")
)
from django_dbqueue.observability import hooks
print(json.dumps({
    "active": hooks.around(Job.objects.first()) is not None,
    "done": Job.objects.filter(status="done").count(),
    "traced": Job.objects.exclude(trace_context=None).count(),
    "loaded": loaded,
}))
"""


@pytest.mark.parametrize(
    ("case", "settings"),
    [("absent", {}), ("switched off", {"TRACING": False})],
)
def test_no_import_and_no_cost(
    worker_env: Callable[..., dict[str, str]], case: str, settings: dict[str, object]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, case],
        cwd=ROOT,
        env={**worker_env(**settings), "DJANGO_SETTINGS_MODULE": "testproject.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"active": False, "done": 2, "traced": 0, "loaded": []}


def test_the_api_without_an_sdk_makes_no_span(worker_env: Callable[..., dict[str, str]]) -> None:
    """opentelemetry-api installed, no tracer provider set: nothing wraps a job's call,
    and jobs enqueued outside any span carry no trace."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, "installed"],
        cwd=ROOT,
        env={**worker_env(), "DJANGO_SETTINGS_MODULE": "testproject.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["loaded"] and not report["active"]
    assert (report["done"], report["traced"]) == (2, 0)


def test_metrics_port_without_prometheus_client_says_what_to_install(
    worker_env: Callable[..., dict[str, str]],
) -> None:
    blocker = "import sys; sys.modules['prometheus_client'] = None\n"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            blocker + "import runpy; runpy.run_path('manage.py', run_name='__main__')",
            "run_jobs",
            "--skip-checks",  # the test project's URLconf mounts the metrics view
            "--burst",
            "--metrics-port",
            "9",
        ],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "pip install 'django-dbqueue[metrics]'" in proc.stderr


SYSTEMD_UNITS = re.compile(r"```ini\n# (/etc/systemd/system/[\w.-]+)\n(.*?)```", re.S)


@pytest.mark.only_vendor("sqlite")
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_documented_systemd_units_verify(tmp_path: Path) -> None:
    docs = (ROOT / "docs" / "observability.md").read_text()
    units = SYSTEMD_UNITS.findall(docs)
    assert {Path(path).name for path, _ in units} == {
        "dbqueue-worker.service",
        "dbqueue-health.service",
        "dbqueue-health.timer",
    }
    site = tmp_path / "srv" / "mysite"
    (site / ".venv" / "bin").mkdir(parents=True)
    (site / ".venv" / "bin" / "python").symlink_to(sys.executable)
    paths = []
    for path, text in units:
        unit = tmp_path / Path(path).name
        # The documented paths, made to exist here (verify checks the executables).
        unit.write_text(textwrap.dedent(text).replace("/srv/mysite", str(site)))
        paths.append(str(unit))
    proc = subprocess.run(
        ["systemd-analyze", "verify", *paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # verify exits 0 on settings it ignores: a warning is a failure here.
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
