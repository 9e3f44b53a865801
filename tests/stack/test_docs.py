"""Every command and import path in README.md and docs/*.md is checked here.

Shell blocks: each command is either run by a test (the README's tour by
test_fresh_project, `make demo` and `make test` by scripts/test.sh itself) or checked:
`manage.py` commands exist and accept their arguments, `pip install` names extras that
exist, files and make targets exist, a `pytest -k` selection selects something. A command
this file does not know how to check fails the test: teach it, do not skip it.
Python blocks: each parses, and each import in it imports (the reader's own `myapp` and
`mysite` aside).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest
from django.core.management import get_commands, load_command_class

from tests.support import ROOT, parse_source
from tests.support.markdown import DOCS, SHELL, Block, all_blocks, inline_commands, shell_commands

pytestmark = pytest.mark.only_vendor("sqlite")  # the docs are the same on every database

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
VERSION = PYPROJECT["project"]["version"]
READERS_OWN = {"myapp", "mysite"}
PYTHONS = {"python", "python3", ".venv/bin/python"}


def simple_commands(command: str) -> list[tuple[dict[str, str], list[str]]]:
    """Split `a; b && c`, `for x in y z; do ...; done`, `X=1 cmd` into (environment,
    arguments) pairs."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    for token in lexer:
        if token in {";", "&&", "||", "|", "&"}:
            parts.append([])
        else:
            parts[-1].append(token)
    loop_values: dict[str, str] = {}
    result = []
    for words in parts:
        if words[:1] == ["for"] and len(words) >= 4 and words[2] == "in":
            loop_values[words[1]] = words[3]
            continue
        if words[:1] == ["do"]:
            words = words[1:]
        if not words or words == ["done"]:
            continue
        words = [re.sub(r"\$(\w+)", lambda m: loop_values.get(m[1], m[0]), w) for w in words]
        env: dict[str, str] = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if words:
            result.append((env, words))
    return result


def check_manage_py(command: str, args: list[str]) -> None:
    # A database alias is the reader's own (`migrate --database queue`): the option is
    # what can be checked here, against this project's aliases.
    args = ["default" if i and args[i - 1] == "--database" else arg for i, arg in enumerate(args)]
    commands = get_commands()
    assert command in commands, f"no management command {command!r}"
    instance = load_command_class(commands[command], command)
    parser = instance.create_parser("manage.py", command)
    parser.parse_args(args)  # CommandError on arguments it does not take


def check_pip_install(args: list[str]) -> None:
    targets = [a for a in args if not a.startswith("-")]
    assert targets, "pip install of nothing"
    for target in targets:
        match = re.fullmatch(
            r"(\.|dist/django_dbqueue-([\w.]+)-py3-none-any\.whl)(\[(.*)\])?", target
        )
        assert match, f"pip install {target}: not the clone (.) or its built wheel"
        if match[2]:
            assert match[2] == VERSION, f"{target}: the version is {VERSION}"
        extras = set(filter(None, (match[4] or "").split(",")))
        assert extras <= EXTRAS, f"{target}: no extra {sorted(extras - EXTRAS)}"


def check_pytest(args: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^\d+ tests? collected", proc.stdout, re.M) or "::" in proc.stdout


def nox_sessions() -> set[str]:
    """The session names noxfile.py defines (read, not imported: nox is not installed in
    the test environments)."""
    tree = parse_source((ROOT / "noxfile.py").read_text())
    cells: list[tuple[str, str]] = []
    kinds: list[str] = []
    single: set[str] = set()  # @nox.session(python=...): one session, not a cell each
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CELLS" for t in node.targets
        ):
            cells = ast.literal_eval(node.value)
        elif isinstance(node, ast.FunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if "nox.session" in decorators:
                kinds.append(node.name)
            elif any(d.startswith("nox.session(") for d in decorators):
                single.add(node.name)
    return {f"{kind}({py}-django{dj})" for kind in kinds for py, dj in cells} | single


def check_nox(args: list[str]) -> None:
    ours = args[: args.index("--")] if "--" in args else args
    named = [ours[i + 1] for i, arg in enumerate(ours) if arg == "-s"]
    assert named or ours == ["-l"], f"nox {' '.join(args)}: name a session"
    assert set(named) <= nox_sessions(), f"no such session: {set(named) - nox_sessions()}"


def check_command(words: list[str], env: dict[str, str]) -> None:
    program, *args = words
    if program in PYTHONS and args[:1] == ["manage.py"]:
        assert len(args) >= 2, "manage.py with no command"
        check_manage_py(args[1], args[2:])
    elif program == "django-admin":
        check_manage_py(args[0], args[1:])
    elif program in PYTHONS and args[:2] == ["-m", "build"]:
        pass  # run by test_fresh_project's wheel fixture
    elif program in PYTHONS and args[:2] == ["-m", "pytest"]:
        check_pytest(args[2:], env)
    elif program in PYTHONS and args[:2] == ["-m", "pip"] and args[2:3] == ["install"]:
        check_pip_install(args[3:])
    elif program == "pip" and args[:1] == ["install"]:
        check_pip_install(args[1:])
    elif program == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in args:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make {target}"
    elif program in {"nox", ".venv/bin/nox"}:
        check_nox(args)
    elif program == "bash":
        assert (ROOT / args[0]).is_file(), f"no {args[0]}"
    elif program == "export":
        assert all("=" in a for a in args)
    elif program in {"mariadb", "psql"}:
        # Database clients for setting up a server by hand: they must exist where the
        # docs say they are used (the test machine has both servers).
        assert shutil.which(program), f"{program} is not installed"
    else:
        raise AssertionError(f"no check for {' '.join(words)!r}: add one to this file")


def shell_cases() -> list[tuple[str, str]]:
    cases = []
    for block in all_blocks():
        if block.lang in SHELL:
            cases += [(block.where, command) for command in shell_commands(block)]
    for path in DOCS:
        cases += [(str(path.relative_to(ROOT)), command) for command in inline_commands(path)]
    return cases


@pytest.mark.parametrize(("where", "command"), shell_cases())
def test_shell_command(where: str, command: str) -> None:
    words_list = simple_commands(command)
    assert words_list, f"{where}: {command!r} has no command"
    for env, words in words_list:
        check_command(words, env)


def python_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.lang == "python"]


def test_nox_sessions_are_read_from_the_noxfile() -> None:
    sessions = nox_sessions()
    assert {"full(3.11-django5.2)", "smoke(3.12-django6.0)", "fresh(3.13-django6.1)"} <= sessions
    assert "full(3.11-django6.0)" not in sessions  # Django 6 needs Python 3.12


def test_there_are_blocks_to_check() -> None:
    assert len(python_blocks()) >= 10
    assert len(shell_cases()) >= 10


def importable(node: ast.Import | ast.ImportFrom) -> str | None:
    """None when the import works, else why not."""
    if isinstance(node, ast.Import):
        modules = [(alias.name, None) for alias in node.names]
    else:
        modules = [(node.module or "", alias.name) for alias in node.names]
    for module, name in modules:
        if module.split(".")[0] in READERS_OWN:
            continue
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            return f"import {module}: {exc}"
        if name is not None and not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                return f"from {module} import {name}: no such name"
    return None


def import_problems(tree: ast.AST) -> list[str]:
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError"}
            for h in node.handlers
        ):
            # `try: from django.tasks import task / except ImportError: from django_tasks
            # import task`: one of the spellings must work here.
            branches = [node.body, *(h.body for h in node.handlers)]
            outcomes = [
                [importable(n) for n in branch if isinstance(n, ast.Import | ast.ImportFrom)]
                for branch in branches
            ]
            if not any(all(o is None for o in outcome) for outcome in outcomes):
                problems.append(f"line {node.lineno}: no branch imports: {outcomes}")
            for branch in branches:
                for n in branch:
                    n._checked = True  # type: ignore[attr-defined]
        elif isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "_checked", False):
            problem = importable(node)
            if problem:
                problems.append(f"line {node.lineno}: {problem}")
    return problems


@pytest.mark.parametrize("block", python_blocks(), ids=lambda block: block.where)
def test_python_block_parses_and_its_imports_import(block: Block) -> None:
    tree = parse_source(block.text, block.where)
    assert import_problems(tree) == []


def test_the_repository_tracks_no_build_artefacts() -> None:
    """Wheels, sdists, build and egg-info directories, bytecode and databases are made,
    not kept (a 17 MB uv wheel once sat at the root)."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "git ls-files found nothing"
    made = re.compile(r"(\.whl|\.tar\.gz|\.pyc|\.sqlite3|\.egg-info/.*)$|^(dist|build)/")
    assert [name for name in tracked if made.search(name)] == []
