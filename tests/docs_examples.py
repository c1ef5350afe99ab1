"""The command blocks of the docs pages a reader follows on `make up` (Getting started and the concepts), and the
marker each must carry so that the docs cannot rot:

    <!-- example: NAME -->          the block is run, in page order with the other blocks of NAME, by
                                    tests/e2e/test_docs_examples.py on the local control plane
    <!-- not run: REASON -->        the page's reader runs it, a test cannot as written (REASON says why)

on the line just above the block's opening fence. tests/unit/test_docs_examples.py checks every block has one and
every NAME has a story in the e2e test."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKER = re.compile(r"^\s*<!--\s*(example|not run):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to docs/
    line: int  # the opening fence's, 1-based
    kind: str  # "example", "not run" or "" (no marker)
    name: str  # the example's NAME, or the reason it is not run
    text: str  # the commands, indentation removed


def pages() -> list[Path]:
    """The pages whose command blocks are checked: Getting started and every concept page."""
    return [DOCS / "getting-started.md", *sorted((DOCS / "concepts").glob("*.md"))]


def blocks(page: Path, language: str = "sh") -> list[Block]:
    """The page's fenced blocks of `language`, with the marker above each."""
    lines = page.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, lang = fence.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        if lang == language:
            marker = MARKER.match(lines[i - 1]) if i > 0 else None
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end]]
            where = str(page.relative_to(DOCS)) if page.is_relative_to(DOCS) else page.name
            out.append(Block(where, i + 1, marker.group(1) if marker else "",
                             marker.group(2) if marker else "", "\n".join(body) + "\n"))
        i = end + 1
    return out


def examples() -> dict[str, list[Block]]:
    """Each example NAME -> its blocks, in page order."""
    out: dict[str, list[Block]] = {}
    for page in pages():
        for block in blocks(page):
            if block.kind == "example":
                out.setdefault(block.name, []).append(block)
    return out
