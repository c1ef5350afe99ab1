"""The planner: pure functions from a snapshot, the config and `now` to the locks that should exist.

No I/O, no clock reads, no randomness. One module per policy (`starvation`, `windows`); `plan` runs them in
DESIGN's precedence (reservation > queue guarantee > window > starvation) under one global cap.
"""
