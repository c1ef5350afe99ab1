"""The command blocks of the docs pages a reader follows on `make up` (Getting started and the concepts), and the
marker each must carry so that the docs cannot rot:

    <!-- example: NAME -->          the block is run, in page order with the other blocks of NAME, by
                                    tests/e2e/test_docs_examples.py on the local control plane
    <!-- not run: REASON -->        the page's reader runs it, a test cannot as written (REASON says why)

on the line just above the block's opening fence. tests/unit/test_docs_examples.py checks every block has one and
every NAME has a story in the e2e test.

An example block may be followed (blank lines between, nothing else) by what it printed on `make up`:

    <!-- output -->                 a fenced `text` block: the block's output, lines `$ COMMAND` naming the command
                                    that printed the lines below them

which its story compares with what the block prints in the test (`shown`), after `normalized`: columns re-spaced and
what differs from run to run (times, ages, uids, which of make up's nodes) written as a placeholder, so a page
cannot show output the code no longer prints. `RESERVOIR_DOCS_CAPTURE=DIR` writes each block's real output
to DIR while the stories run, to paste into the page."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKER = re.compile(r"^\s*<!--\s*(example|not run):\s*(.*?)\s*-->\s*$")
OUTPUT = re.compile(r"^\s*<!--\s*output\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to docs/
    line: int  # the opening fence's, 1-based
    kind: str  # "example", "not run" or "" (no marker)
    name: str  # the example's NAME, or the reason it is not run
    text: str  # the commands, indentation removed
    output: str | None = None  # the `<!-- output -->` block after it: what it printed on make up


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
                             marker.group(2) if marker else "", "\n".join(body) + "\n", _output(lines, end + 1)))
        i = end + 1
    return out


def _output(lines: list[str], start: int) -> str | None:
    """The `<!-- output -->` text block starting at or after lines[start] (blank lines between), if any."""
    i = next((j for j in range(start, len(lines)) if lines[j].strip()), len(lines))
    if i + 1 >= len(lines) or not OUTPUT.match(lines[i]) or FENCE.match(lines[i + 1]) is None:
        return None
    indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
    end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), len(lines))
    return "\n".join(line[indent:] for line in lines[i + 2:end]) + "\n"


def outputs(page: Path) -> list[int]:
    """The lines (1-based) of the page's `<!-- output -->` markers, whether or not a block owns them."""
    return [n for n, line in enumerate(page.read_text().splitlines(), 1) if OUTPUT.match(line)]


# What differs from run to run in a block's output, each replaced by a placeholder before comparing, in this order:
# an age only in the places `reservoir status` prints one (its AGE column, before EXPIRES; "N ago"), so that a
# threshold or a quantity ("older than 30s", "500m") is compared as written.
VOLATILE = (
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d(:\d\d)?\b"), "<time>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uid>"),
    (re.compile(r"\b(\d+(\.\d+)?(ms|s|m|h|d))+(?= ago\b| <time> | - )"), "<age>"),
    (re.compile(r"\bkwok-node-\d\b"), "kwok-node-<n>"),
    (re.compile(r"\bunknown: \d+ pods\b"), "unknown: <n> pods"),  # how many pods without a runtime run just then
)


def normalized(text: str) -> list[str]:
    """The output's lines as compared: `$ COMMAND` lines and blank lines dropped, runs of spaces made one, VOLATILE
    parts replaced."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("$ "):
            continue
        line = " ".join(line.split())
        for pattern, placeholder in VOLATILE:
            line = pattern.sub(placeholder, line)
        out.append(line)
    return out


def examples() -> dict[str, list[Block]]:
    """Each example NAME -> its blocks, in page order."""
    out: dict[str, list[Block]] = {}
    for page in pages():
        for block in blocks(page):
            if block.kind == "example":
                out.setdefault(block.name, []).append(block)
    return out
