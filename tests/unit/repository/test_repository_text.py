"""Code and docs speak for themselves: no pointers to the issue tracker or to files
that are not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SKIPPED = {".git", ".venv", "build", "target", "node_modules", "schemas", "__pycache__"}
SUFFIXES = {".py", ".md", ".rs", ".toml", ".yaml", ".yml", ".json", ".txt", ".cfg"}
# "issue 14", "Issue #3"; and the design notes that live outside the repository.
FORBIDDEN = re.compile(r"\bissues? #?\d+\b|(?<![./\w])DESIGN\.md", re.IGNORECASE)


def text_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        if set(path.relative_to(ROOT).parts) & SKIPPED or path.name.startswith("."):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile"):
            found.append(path)
    return found


def test_no_issue_numbers_or_missing_design_notes() -> None:
    files = text_files()
    assert len(files) > 100
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in files if path != Path(__file__)
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                     .splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits)
