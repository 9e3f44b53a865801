"""Code blocks of the README and docs/, for the tests that run or check them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    section: str  # the nearest "## " heading above it
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def target(self) -> str | None:
        """The file a block belongs in, when its first line says so (`# mysite/urls.py`)."""
        first = self.text.split("\n", 1)[0]
        match = re.fullmatch(r"# ([\w/]+\.py)\b(.*)", first)
        return match.group(1) if match else None


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    section = ""
    lang: str | None = None
    start = 0
    lines: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if lang is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif line.startswith("```"):
                lang, start, lines = line[3:].strip(), number, []
        elif line.startswith("```"):
            found.append(Block(path, start, lang, section, "\n".join(lines) + "\n"))
            lang = None
        else:
            lines.append(line)
    return found


def all_blocks() -> list[Block]:
    return [block for path in DOCS for block in blocks(path)]


def shell_commands(block: Block) -> list[str]:
    """One string per command: continuations joined, comments and blank lines dropped."""
    commands: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        code = strip_comment(line).strip()
        if code:
            commands.append(code)
    return commands


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes stays)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def inline_commands(path: Path) -> list[str]:
    """`python manage.py ...` written inline in the text."""
    return re.findall(r"`((?:python|\.venv/bin/python) manage\.py [^`]+)`", path.read_text())
