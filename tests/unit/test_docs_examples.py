"""The docs' command blocks (tests/docs_examples.py): every block on Getting started and the concept pages is either
run by tests/e2e/test_docs_examples.py (`<!-- example: NAME -->`) or says why not (`<!-- not run: REASON -->`)."""

from __future__ import annotations

from pathlib import Path

from tests.docs_examples import blocks, examples, normalized, outputs, pages


def test_every_command_block_is_run_or_says_why_not() -> None:
    unmarked = [f"{b.page}:{b.line}" for page in pages() for b in blocks(page) if not b.kind or not b.name]
    assert not unmarked, f"command blocks with neither `<!-- example: NAME -->` nor `<!-- not run: REASON -->` " \
                         f"on the line above: {unmarked}"


def test_getting_started_is_run() -> None:
    assert [b.page for b in examples()["seed-000"]] == ["getting-started.md"] * 5


def test_the_parser_reads_markers_indented_blocks_and_other_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- example: one -->\n```sh\nkubectl get nodes\n```\n\n1. step\n\n"
                    "    <!-- not run: needs a real GPU -->\n    ```sh\n    nvidia-smi\n    ```\n\n"
                    "```yaml\na: 1\n```\n\n```sh\nls\n```\n")
    got = blocks(page)
    assert [(b.kind, b.name, b.text) for b in got] == [
        ("example", "one", "kubectl get nodes\n"), ("not run", "needs a real GPU", "nvidia-smi\n"), ("", "", "ls\n")]


def test_every_shown_output_belongs_to_a_run_block() -> None:
    owned = {(b.page, b.line) for page in pages() for b in blocks(page) if b.output is not None and b.kind == "example"}
    for page in pages():
        markers = outputs(page)
        mine = [b for b in blocks(page) if b.output is not None and b.kind == "example"]
        assert len(markers) == len(mine), f"{page.name}: an `<!-- output -->` block not right after a run example " \
                                          f"block (markers at lines {markers}, owned by blocks {sorted(owned)})"


def test_the_parser_reads_output_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("1. step\n\n    <!-- example: one -->\n    ```sh\n    reservoir status\n    ```\n\n"
                    "    <!-- output -->\n    ```text\n    $ reservoir status\n    NODE   KIND\n    ```\n\n"
                    "<!-- example: one -->\n```sh\nls\n```\n\nprose\n\n<!-- output -->\n```text\nx\n```\n")
    got = blocks(page)
    assert [b.output for b in got] == ["$ reservoir status\nNODE   KIND\n", None]


def test_normalized_keeps_what_a_page_promises_and_drops_what_differs_between_runs() -> None:
    run_1 = "$ reservoir status\nNODE          OWNER             AGE   EXPIRES                REASON\n" \
            "kwok-node-0   default/Pod/big   35s   2026-11-27T12:05:11Z   older than 30s\n\n" \
            "plan published at 12:05:11, 2s ago\n"
    run_2 = "NODE    OWNER    AGE   EXPIRES   REASON\n" \
            "kwok-node-2 default/Pod/big 1m3s 2026-11-28T01:00:00+00:00 older than 30s\n" \
            "plan published at 01:00:00, 1.5s ago\n"
    assert normalized(run_1) == normalized(run_2) == [
        "NODE OWNER AGE EXPIRES REASON", "kwok-node-<n> default/Pod/big <age> <time> older than 30s",
        "plan published at <time>, <age> ago"]
    assert normalized("older than 30s\n") != normalized("older than 20s\n")
    assert normalized("cpu: 500m\n") != normalized("cpu: 400m\n")
    assert normalized("job-default-Pod-big-bb0eb6\n") != normalized("job-default-Pod-big-0a12f9\n")
