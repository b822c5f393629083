"""Every relative link in README.md and docs/*.md points at a file of the tree, and every
``#anchor`` into a Markdown file at one of its headings (GitHub's heading ids), so that a
renamed file or heading does not leave users' documentation pointing nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target): the target up to a space or the closing parenthesis; images too.
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def _outside_fences(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings: lower case, punctuation but ``-`` and ``_``
    dropped, spaces to ``-``; a repeated id gets ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _outside_fences(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path) -> list[str]:
    out = []
    for line in _outside_fences(doc.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if target.startswith(EXTERNAL):
                continue
            file_part, _, anchor = target.partition("#")
            dest = doc if not file_part else (doc.parent / file_part).resolve()
            if not dest.exists():
                out.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    return out


def test_every_relative_link_resolves() -> None:
    assert [b for doc in DOCS for b in broken_links(doc)] == []


def test_upgrade_guide_is_linked_from_the_entry_points() -> None:
    for name in ("README.md", "docs/DEPLOY.md", "docs/CLUSTER.md"):
        assert "UPGRADE.md" in (ROOT / name).read_text(encoding="utf-8"), name


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "A.md").write_text("# Title\n\n## Two words\n")
    doc = tmp_path / "B.md"
    doc.write_text("[ok](A.md#two-words) [gone](C.md) [bad](A.md#three) [self](#nothing)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken_links(doc) == [
            "B.md: C.md (no such file)",
            "B.md: A.md#three (no such heading)",
            "B.md: #nothing (no such heading)",
        ]
    finally:
        ROOT = saved
