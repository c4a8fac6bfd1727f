"""Nothing in the repo points outside it: a user has the checkout and nothing else.

The design document and the facts page live in docs/ (docs/design.md,
docs/tpu-facts.md); links in Markdown resolve to files of the checkout.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from model.archive import REPO_ROOT

OUTSIDE = re.compile(r"\.\./shared|\bDESIGN\.md|/work/(main|wt-|helpers)|\.pyenv/versions/\d")
OWN_PAGE = re.compile(r"(?<![\w/.-])(?P<path>[\w./-]*?)(?P<name>design|tpu-facts)\.md")
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    files = []
    for name in names:
        path = REPO_ROOT / name
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 1_000_000:
            try:
                files.append((path, path.read_text()))
            except UnicodeDecodeError:
                continue
    return files


FILES = [(path, text) for path, text in tracked_text_files() if path.name != "test_repo_paths.py"]


def test_no_file_names_a_place_outside_the_repo() -> None:
    found = [f"{path.relative_to(REPO_ROOT)}: {match[0]}"
             for path, text in FILES
             for match in OUTSIDE.finditer(text)]
    assert found == []


def test_the_design_and_facts_pages_are_cited_where_they_are() -> None:
    wrong = []
    for path, text in FILES:
        in_docs = path.parent == REPO_ROOT / "docs"
        for match in OWN_PAGE.finditer(text):
            cited = match["path"] + match["name"] + ".md"
            if cited not in (f"docs/{match['name']}.md", f"{match['name']}.md" if in_docs else ""):
                wrong.append(f"{path.relative_to(REPO_ROOT)}: {cited}")
    assert wrong == []
    assert (REPO_ROOT / "docs" / "design.md").is_file()
    assert (REPO_ROOT / "docs" / "tpu-facts.md").is_file()


@pytest.mark.parametrize("page", [p for p, _ in FILES if p.suffix == ".md"],
                         ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_markdown_links_resolve_inside_the_checkout(page: Path) -> None:
    broken = []
    for match in LINK.finditer(page.read_text()):
        target = match["target"]
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
            broken.append(target)
    assert broken == []
