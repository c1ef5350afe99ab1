"""What build this is, said in one place: the CLI's `--version` and both programs' `reservoir_build_info` metric."""

from __future__ import annotations

import os
from importlib import metadata

REVISION_ENV = "RESERVOIR_REVISION"  # the source revision, set in the image by Containerfile (`make image`)


def version() -> str:
    """The installed package's version (its metadata), or `unknown` when run from a tree that is not installed."""
    try:
        return metadata.version("reservoir")
    except metadata.PackageNotFoundError:
        return "unknown"


def revision() -> str:
    """The source revision the image was built from ($RESERVOIR_REVISION, a short git hash), or `unknown` (a tree
    run in place: its revision is whatever git says, not something the program can know)."""
    return os.environ.get(REVISION_ENV) or "unknown"
