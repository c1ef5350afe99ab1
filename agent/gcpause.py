"""Planning with the cyclic garbage collector paused.

The watch caches hold one view per pod and node (150,000+ long-lived objects on a large cluster); every full
collection walks all of them, and one plan allocates enough short-lived tuples to trigger several (measured:
5,000 nodes, 1.03 s with the collector on, 0.70 s paused). A plan creates no reference cycles, so reference
counting frees everything it allocates; the collector runs again, as usual, right after.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
