"""The house rules every tracked file keeps, checked over ``git ls-files``.

- Present tense: code, tests, benchmarks and docs say what the code does and why, never
  in which sitting it changed; that history lives in ``git log`` and CHANGELOG.md. The
  word below (in any case, alone or inside another word) is the tell. pytest's fixture
  scope of that name is the one use allowed.
- Self-contained: no tracked text file points at documents outside the repository (the
  upper-case design, contract and style notes, or a folder shared beside the checkout);
  the repository's own docs live under ``docs/``.
- README.md stays short: at most ``README_MAX_LINES`` lines.

Each failure lists every offending ``file:line`` so it can be fixed in one pass.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()
README_MAX_LINES = 150
PRESENT_TENSE_SCOPE = ("src/", "tests/", "benchmarks/", "docs/", "README.md", "CHANGELOG.md")
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".safetensors", ".gguf", ".bin", ".pt", ".so", ".pdf"}

PATTERN_MARK = "# house rule pattern"  # lines of this file that define a pattern are not checked
# The word is spelt in two halves so that this file does not carry it whole.
HISTORY = "ses" "sion"
HISTORY_WORD = re.compile(HISTORY, re.IGNORECASE)
FIXTURE_SCOPE = re.compile(r"""scope\s*=\s*["']""" + HISTORY + r"""["']""")
OUTSIDE_DOCS = re.compile(r"(?<!docs/)\b(?:DESIGN|CONTRACT|STYLE)\.md\b|\.\./shared|/work/shared")  # house rule pattern


def _tracked_text_files() -> dict[str, list[str]]:
    """path -> lines, for every tracked text file (binaries and files not on disk skipped)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the house rules are checked over git ls-files")
    files: dict[str, list[str]] = {}
    for raw in listing.split(b"\0"):
        path = raw.decode("utf-8", "surrogateescape")
        if not path or Path(path).suffix.lower() in BINARY_SUFFIXES:
            continue
        try:
            data = (ROOT / path).read_bytes()
        except OSError:  # deleted in the work tree, not yet in the index
            continue
        if b"\0" in data[:8192]:
            continue
        files[path] = data.decode("utf-8", "replace").splitlines()
    return files


FILES = _tracked_text_files() if (ROOT / ".git").exists() else {}


def _hits(pattern: re.Pattern[str], paths: list[str], *, allowed: re.Pattern[str] | None = None) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(FILES[path], start=1):
            if path == THIS_FILE and line.rstrip().endswith(PATTERN_MARK):
                continue
            text = allowed.sub("", line) if allowed is not None else line
            if pattern.search(text):
                found.append(f"{path}:{number}: {line.strip()[:120]}")
    return found


@pytest.mark.skipif(not FILES, reason="not a git checkout")
def test_code_tests_and_docs_are_written_in_the_present_tense():
    paths = [p for p in FILES if p.startswith(PRESENT_TENSE_SCOPE)]
    hits = _hits(HISTORY_WORD, paths, allowed=FIXTURE_SCOPE)
    assert not hits, ("history belongs in git log and CHANGELOG.md; say what the code does instead:\n"
                      + "\n".join(hits))


@pytest.mark.skipif(not FILES, reason="not a git checkout")
def test_no_tracked_file_refers_to_documents_outside_the_repository():
    hits = _hits(OUTSIDE_DOCS, sorted(FILES))
    assert not hits, ("point at docs/design.md, docs/api.md or docs/benchmarks.md instead:\n"
                      + "\n".join(hits))


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail to docs/")


def test_the_patterns_catch_what_they_are_for():
    word = "Ses" "sions"  # split, so that this file does not trip its own check
    assert HISTORY_WORD.search(f"the fourteenth {word}' numbers")
    assert not HISTORY_WORD.search(FIXTURE_SCOPE.sub("", f'@pytest.fixture(scope="{word[:-1].lower()}")'))
    assert OUTSIDE_DOCS.search("as DESIGN" ".md says") and OUTSIDE_DOCS.search("see .." "/shared/notes")
    assert not OUTSIDE_DOCS.search("see docs/DESIGN" ".md, docs/design.md and docs/api.md")
