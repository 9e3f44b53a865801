"""A brand-new project, the app installed from its built wheel, the README's tour
followed to the letter.

The wheel and sdist are built once per session (`python -m build`, as the README says),
checked with `twine check`, and installed into uv virtualenvs beside this test run's
Python and Django. Each configuration gets a new `django-admin startproject mysite` with
`startapp myapp`, the README's `# mysite/settings.py`, `# myapp/*.py` and `# mysite/urls.py`
blocks appended to those files, and the tour's commands run: migrate, the sign-up view
enqueueing inside `transaction.atomic()`, `run_jobs --burst`, the admin pages. With and
without `django.contrib.admin`, Django Tasks (`TASKS`, plus the backport on Django 5.2)
and django-redis (Redis named locks). SQLite only: the point is the package.
"""

from __future__ import annotations

import ast
import email
import itertools
import os
import re
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import django
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.support import ROOT, parse_source
from tests.support.markdown import Block, blocks, shell_commands

pytestmark = [pytest.mark.fresh, pytest.mark.only_vendor("sqlite")]

DJANGO_5 = django.VERSION[0] == 5
README = blocks(ROOT / "README.md")
TOUR = "A five-minute tour"
TASKS_SECTION = "Django Tasks (`@task`)"
LOCKS_SECTION = "Named locks"


def uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing of this test run's project or venv."""
    drop = ("DJANGO_", "DBQUEUE_", "PYTHON", "VIRTUAL_ENV", "COVERAGE_", "UV_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, timeout: float = 300, **env: str) -> str:
    proc = subprocess.run(
        args, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{output}"
    return output


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    out = tmp_path_factory.mktemp("dist")
    # From the clone, as the README says; uv installs the build requirements (faster).
    run(
        [sys.executable, "-m", "build", "--installer", "uv", "--outdir", str(out), str(ROOT)],
        cwd=ROOT,
        PATH=f"{Path(uv()).parent}{os.pathsep}{os.environ['PATH']}",
    )
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist, wheel)


def test_twine_check_passes(dist: Dist) -> None:
    out = run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist.sdist), str(dist.wheel)],
        cwd=ROOT,
    )
    assert out.count("PASSED") == 2, out


def test_wheel_holds_every_file_of_the_app_and_nothing_else(dist: Dist) -> None:
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "django_dbqueue"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert tracked, "git ls-files found nothing"
    app_files = {name for name in tracked if (ROOT / name).exists()}
    assert app_files - names == set()
    assert any(n.startswith("django_dbqueue/templates/") for n in names)
    assert any(n.startswith("django_dbqueue/migrations/0001") for n in names)
    assert "django_dbqueue/py.typed" in names
    static = {n for n in app_files if n.startswith("django_dbqueue/static/")}
    assert static <= names
    outside = {n for n in names if not n.startswith(("django_dbqueue/", "django_dbqueue-"))}
    assert outside == set()
    assert not any("/tests/" in n or "testproject" in n for n in names)


def noxfile_cells() -> list[tuple[str, str]]:
    tree = parse_source((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CELLS":
            return list(ast.literal_eval(node.value))
    raise AssertionError("noxfile.py has no CELLS")


def test_wheel_metadata_promises_what_the_matrix_tests(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as wheel:
        (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(wheel.read(name))
    cells = noxfile_cells()
    pythons = sorted({py for py, _ in cells})
    djangos = sorted({dj for _, dj in cells})
    classifiers = metadata.get_all("Classifier") or []
    assert sorted(c.rsplit(" :: ", 1)[1] for c in classifiers if "Django :: " in c) == djangos
    assert (
        sorted(c.rsplit(" :: ", 1)[1] for c in classifiers if re.search(r"Python :: 3\.\d+$", c))
        == pythons
    )

    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    (django_req,) = [r for r in requires if r.name == "Django" and r.marker is None]
    for version in djangos:
        assert django_req.specifier.contains(f"{version}.0"), django_req
        assert django_req.specifier.contains(f"{version}.99"), django_req
    assert not django_req.specifier.contains("5.1.99") and not django_req.specifier.contains("6.2")
    # The backport is an extra: markers cannot say "only on Django 5.2".
    backport = [r for r in requires if r.name == "django-tasks"]
    assert [str(r.marker) for r in backport] == ['extra == "tasks"']
    python_req = SpecifierSet(metadata["Requires-Python"])
    assert all(python_req.contains(f"{py}.0") for py in pythons)
    assert not python_req.contains("3.10.99")


@dataclass(frozen=True)
class Config:
    admin: bool
    tasks: bool
    redis: bool

    @property
    def id(self) -> str:
        return "-".join(
            f"{'' if on else 'no-'}{name}"
            for name, on in (("admin", self.admin), ("tasks", self.tasks), ("redis", self.redis))
        )

    @property
    def extras(self) -> list[str]:
        # Django 6 has django.tasks; only Django 5.2 needs the backport.
        return (["tasks"] if self.tasks and DJANGO_5 else []) + (["redis"] if self.redis else [])


CONFIGS = [Config(*flags) for flags in itertools.product([True, False], repeat=3)]


@pytest.fixture(scope="session")
def venvs(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[str]], Path]:
    """The Python of a virtualenv with this Python, this Django and the wheel with these
    extras; made once per set of extras."""
    made: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("venvs")

    def python_for(extras: list[str]) -> Path:
        key = ",".join(extras)
        if key not in made:
            venv = root / (key.replace(",", "-") or "base")
            run([uv(), "venv", "-q", "--python", sys.executable, str(venv)], cwd=root)
            wheel = f"{dist.wheel}[{key}]" if key else str(dist.wheel)
            python = venv / "bin" / "python"
            run(
                [
                    uv(),
                    "pip",
                    "install",
                    "-q",
                    "--python",
                    str(python),
                    f"Django=={django.__version__}",
                    wheel,
                ],
                cwd=root,
            )
            made[key] = python
        return made[key]

    return python_for


def file_blocks(section: str) -> list[Block]:
    return [b for b in README if b.section == section and b.lang == "python" and b.target]


def shell_lines(section: str) -> list[str]:
    return [
        command
        for b in README
        if b.section == section and b.lang == "bash"
        for command in shell_commands(b)
    ]


def apply(project: Path, block: Block) -> None:
    assert block.target is not None
    path = project / block.target
    assert path.parent.is_dir(), f"{block.where}: {block.target} is not in a new project"
    with path.open("a") as f:
        f.write("\n\n" + block.text)


# The test client outside a test run: allows the testserver host, keeps response context.
SHELL_SCRIPT_PREFIX = (
    "from django.test.utils import setup_test_environment\nsetup_test_environment()\n"
)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_readme_tour_in_a_new_project(
    config: Config, venvs: Callable[[list[str]], Path], tmp_path: Path
) -> None:
    python = venvs(config.extras)
    bin_dir = python.parent

    def manage(*args: str, **env: str) -> str:
        return run([str(python), "manage.py", *args], cwd=project, **env)

    def shell(code: str) -> str:
        return manage("shell", "-c", SHELL_SCRIPT_PREFIX + code)

    run([str(bin_dir / "django-admin"), "startproject", "mysite"], cwd=tmp_path)
    project = tmp_path / "mysite"
    manage("startapp", "myapp")

    settings = project / "mysite" / "settings.py"
    urls = project / "mysite" / "urls.py"
    if not config.admin:
        # What a project without the admin looks like: no app, no URLs.
        text = settings.read_text()
        settings.write_text(re.sub(r"\n\s*['\"]django\.contrib\.admin['\"],", "", text))
        urls.write_text(
            re.sub(r"\n\s*path\(['\"]admin/['\"], admin\.site\.urls\),", "", urls.read_text())
        )

    for block in file_blocks(TOUR):
        apply(project, block)
    if config.tasks:
        for block in file_blocks(TASKS_SECTION):
            if "Django 5.2 only" in block.text.split("\n", 1)[0] and not DJANGO_5:
                continue
            apply(project, block)
    if config.redis:
        for block in file_blocks(LOCKS_SECTION):
            apply(project, block)
    settings.write_text(settings.read_text() + "\nALLOWED_HOSTS = ['testserver']\n")

    checked = manage("check")
    assert "System check identified no issues" in checked, checked

    # The tour's own commands, as written.
    tour_commands = shell_lines(TOUR)
    assert "python manage.py migrate" in tour_commands
    manage("migrate")

    shell(
        "from django.db import IntegrityError\n"
        "from django.test import Client\n"
        "from django_dbqueue.models import Job\n"
        "client = Client()\n"
        "assert client.post('/sign-up/', {'username': 'ada'}).status_code == 200\n"
        "try:\n"
        "    client.post('/sign-up/', {'username': 'ada'})\n"
        "except IntegrityError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('a second ada was created')\n"
        "assert Job.objects.count() == 1, list(Job.objects.values())\n"
    )

    assert "python manage.py run_jobs --burst" in tour_commands
    out = manage("run_jobs", "--burst")
    assert "Welcome mail for user 1 (en)" in out, out
    assert "1 done, 0 failed" in out, out

    # The tour's test: the sign-up view, its job run by run_due_jobs() in the test.
    assert "python manage.py test myapp" in tour_commands
    tested = manage("test", "myapp")
    assert "Ran 1 test" in tested and "\nOK" in tested, tested

    inspect = next(b for b in README if b.section == TOUR and "Job.objects.filter(" in b.text)
    shell(inspect.text + "assert Job.objects.filter(status=Job.Status.DONE).count() == 1\n")

    if config.admin:
        manage(
            "createsuperuser",
            "--noinput",
            "--username",
            "admin",
            "--email",
            "admin@example.com",
            DJANGO_SUPERUSER_PASSWORD="fresh-project-pw",
        )
        shell(
            "from django.test import Client\n"
            "client = Client()\n"
            "assert client.login(username='admin', password='fresh-project-pw')\n"
            "jobs = client.get('/admin/django_dbqueue/job/')\n"
            "assert jobs.status_code == 200, jobs.status_code\n"
            "assert b'myapp.jobs.send_welcome_mail' in jobs.content\n"
            "dashboard = client.get('/admin/django_dbqueue/job/dashboard/')\n"
            "assert dashboard.status_code == 200, dashboard.status_code\n"
            "assert dashboard.context['title'], dashboard.context\n"
        )
    else:
        shell(
            "from django.apps import apps\n"
            "from django.test import Client\n"
            "assert not apps.is_installed('django.contrib.admin')\n"
            "assert Client().get('/admin/').status_code == 404\n"
        )

    if config.tasks:
        shell(
            "from myapp.tasks import send_receipt\n"
            "result = send_receipt.enqueue(7)\n"
            "open('result-id', 'w').write(result.id)\n"
        )
        out = manage("run_jobs", "--burst")
        assert "1 done, 0 failed" in out, out
        shell(
            "from myapp.tasks import send_receipt\n"
            "result = send_receipt.get_result(open('result-id').read())\n"
            "assert result.status == 'SUCCESSFUL', result.status\n"
            "assert result.return_value == {'receipt_for': 7}, result.return_value\n"
        )
    else:
        # Django 6 has a TASKS default (its immediate backend); ours is not in it.
        shell(
            "from django.conf import settings\n"
            "assert 'DBQueueBackend' not in repr(getattr(settings, 'TASKS', None))\n"
        )

    if config.redis:
        name = f"fresh-{uuid.uuid4().hex}"
        shell(
            "from django_dbqueue.conf import settings\n"
            "from django_dbqueue.locks import named_lock, LockNotAcquired\n"
            "assert settings.LOCK_BACKEND == 'redis'\n"
            f"with named_lock({name!r}, blocking_timeout=5):\n"
            "    try:\n"
            f"        with named_lock({name!r}, blocking=False):\n"
            "            raise AssertionError('held twice')\n"
            "    except LockNotAcquired:\n"
            "        pass\n"
        )
    else:
        shell("import importlib.util\nassert importlib.util.find_spec('django_redis') is None\n")
