"""MkDocs hook: the reference pages (reservoir.reference.PAGES) rendered from the code at each build and added to the
site, never written to docs/, so they cannot drift from what they document."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from reservoir.reference import PAGES, expand_alerts_table, expand_config_tables


def on_files(files: Files, config: Any) -> Files:
    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A page's `<!-- config: FIELD ... -->` lines become tables of those fields, from the model (expand_config_tables),
    and its `<!-- alerts -->` line the table of the alert rules (expand_alerts_table): the pages never hold a copy of
    a default, a description or an alert."""
    return expand_alerts_table(expand_config_tables(markdown))
