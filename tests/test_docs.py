"""The README stays the front door and the pages it links stay reachable (issue 34).

The README holds what a newcomer reads first (what Latch is, the two commands, running it
against a cluster, the guarantees in short, the headline figures) and links the rest, which
lives under ``docs/``. These tests keep it short, and keep every relative link of the README
and of ``docs/*.md`` pointing to a file that exists and, where the link names a heading
(``page.md#anchor``), to a heading of that page, as GitHub renders its anchor.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 260

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks, code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax kept as its text, lowercased, everything
    but letters, digits, ``_``, ``-`` and spaces dropped, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text, a repeated one numbered as GitHub does."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(text: str) -> list[str]:
    """The targets of the inline links of a Markdown text that point into the repository."""
    return [target for line in prose_lines(text) for target in LINK.findall(line)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)]


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or heading anchor, does not exist."""
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and (dest.is_dir() or dest.suffix != ".md"
                         or anchor not in anchors(dest.read_text(encoding="utf-8"))):
            broken.append(f"{target} (no such heading)")
    return broken


def test_the_readme_stays_short() -> None:
    """The README is the front door: at most 260 lines; the rest lives under ``docs/``."""
    lines = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_every_relative_link_resolves() -> None:
    """Every relative link in README.md and docs/*.md names an existing file, and a heading
    of it where the link gives an anchor."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = {str(page.relative_to(REPO)): found for page in pages
              if (found := broken_links(page))}
    assert not broken, broken


def test_the_readme_links_each_moved_topic() -> None:
    """The topics that moved out of the README are linked from it: the contract, the
    providers, policies and approvals, the guarantees in full, operations, the figures."""
    links = {target.partition("#")[0] for target in
             relative_links((REPO / "README.md").read_text(encoding="utf-8"))}
    for page in ("docs/contract.md", "docs/providers.md", "docs/policies.md",
                 "docs/guarantees.md", "docs/operations.md", "docs/benchmarks.md"):
        assert page in links, page


def test_the_link_checks_catch_what_they_exist_for(tmp_path: Path) -> None:
    """The checks above break on what they forbid: a missing file, a missing heading, a
    repeated heading's second anchor taken as present only when numbered; links inside code
    are not links; GitHub's anchors drop punctuation and keep ``_``."""
    assert slug("Which engine: `worker.engine`") == "which-engine-workerengine"
    assert slug("Throughput, the faust engine: `bench/bench_worker.py`, one run") == \
        "throughput-the-faust-engine-benchbench_workerpy-one-run"
    assert slug("Today's figures (2026-12-02, 15:20 to 15:45 UTC)") == \
        "todays-figures-2026-12-02-1520-to-1545-utc"
    (tmp_path / "other.md").write_text("# Title\n\n## Part\n\n## Part\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[a](other.md#part) [b](other.md#part-1) [c](#page)\n"
                    "[d](https://example.com/x) `[e](missing.md)`\n```\n[f](missing.md)\n```\n",
                    encoding="utf-8")
    assert broken_links(page) == []
    page.write_text("[a](missing.md) [b](other.md#part-2) [c](#nowhere)\n", encoding="utf-8")
    assert broken_links(page) == ["missing.md (no such file)", "other.md#part-2 (no such heading)",
                                  "#nowhere (no such heading)"]
