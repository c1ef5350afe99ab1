"""The docs' command blocks (tests/docs_examples.py): every block on Getting started and the concept pages is either
run by tests/e2e/test_docs_examples.py (`<!-- example: NAME -->`) or says why not (`<!-- not run: REASON -->`)."""

from __future__ import annotations

from pathlib import Path

from tests.docs_examples import blocks, examples, pages


def test_every_command_block_is_run_or_says_why_not() -> None:
    unmarked = [f"{b.page}:{b.line}" for page in pages() for b in blocks(page) if not b.kind or not b.name]
    assert not unmarked, f"command blocks with neither `<!-- example: NAME -->` nor `<!-- not run: REASON -->` " \
                         f"on the line above: {unmarked}"


def test_getting_started_is_run() -> None:
    assert [b.page for b in examples()["seed-000"]] == ["getting-started.md"] * 4


def test_the_parser_reads_markers_indented_blocks_and_other_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- example: one -->\n```sh\nkubectl get nodes\n```\n\n1. step\n\n"
                    "    <!-- not run: needs a real GPU -->\n    ```sh\n    nvidia-smi\n    ```\n\n"
                    "```yaml\na: 1\n```\n\n```sh\nls\n```\n")
    got = blocks(page)
    assert [(b.kind, b.name, b.text) for b in got] == [
        ("example", "one", "kubectl get nodes\n"), ("not run", "needs a real GPU", "nvidia-smi\n"), ("", "", "ls\n")]
