"""The trace CSV format, written once: Alibaba's production GPU cluster trace (`cluster-trace-gpu-v2023`, "openb")
node and pod lists, as `make bench-trace` and `reservoir simulate` read them and `reservoir record` writes them.

The openb columns come first, in the trace's order (NODE_COLUMNS, POD_COLUMNS); readers find columns by name and
ignore any others, so a recording's extra columns (RECORDED_POD_COLUMNS, after the openb ones) are read by the same
`read_pods`. bench/trace/trace.py re-exports every name here (the trace format was defined there first).

Pure: no Kubernetes, no network, no clock. Resources are integers (millicores, MiB, whole GPUs, thousandths of a
GPU) as the trace writes them; times are seconds, floats.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
               "creation_time", "deletion_time", "scheduled_time")


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file, the line, the column, the value found and what
    was expected, so the user can fix the file rather than guess."""


@dataclass(frozen=True)
class NodeRow:
    """One row of `openb_node_list_all_node.csv`: a node. `model` is "" for a CPU-only node."""

    sn: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str


@dataclass(frozen=True)
class PodRow:
    """One row of `openb_pod_list_*.csv`: a pod as the trace recorded it. `scheduled_time` is None for a pod never
    scheduled, `deletion_time` None for one not deleted when the trace was taken; `gpu_spec` is the `|`-separated
    models the pod may use, "" for any."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    qos: str
    pod_phase: str
    creation_time: float
    deletion_time: float | None
    scheduled_time: float | None
    # read from a recording (its declared_runtime column is there): the maximum runtime the pod declared, None for
    # none. A trace without the column (Alibaba's own) says nothing of it: `declares` False, and a replay assumes,
    # as bench-trace does, that every pod declares its runtime
    declared_runtime: float | None = None
    declares: bool = False


# bench-trace's replay setting (the trace fixture's README): a tenth of each node shape; the trace's 34 days of
# arrivals compressed into 600 s, of which the first 300 s replayed; runtimes divided by 30 and clamped to 2-120 s.
# `make bench-trace`, `reservoir simulate` and `make bench-simulate` default to it (trace.replay's parameters but the
# node fraction). Here because reservoir/cli.py may read it and bench/ is not part of the installed package.
REPLAY_SETTING: dict[str, float] = {"fraction": 0.1, "window": 300.0, "arrival_seconds": 600.0, "runtime_factor": 30.0,
                                    "runtime_floor": 2.0, "runtime_cap": 120.0}


# What `reservoir record` (agent/record.py) writes after POD_COLUMNS, one column each: the pod's uid (a recording's
# rows are deduplicated by it); its namespace (hashed with --anonymize); its controller's kind ("" for a pod no
# controller owns); the maximum runtime it declared (seconds, Reservoir's/Volcano's `volcano.sh/maximum-runtime` as the
# planner reads it; "" when none); the node it was bound to (`sn` of the node list); "yes" when it was seen with
# scheduling gates and the time they were lifted; how its end was seen ("Succeeded", "Failed", "Deleted", "Vanished":
# gone while the recorder was down, "" when it had not ended when the recording stopped) and, for a vanished pod, the
# last time it was known to exist (its end lies between end_after and deletion_time).
RECORDED_POD_COLUMNS = ("uid", "namespace", "owner_kind", "declared_runtime", "node", "gated", "ungated_time", "end",
                        "end_after")


def _columns(path: Path, fieldnames: Sequence[str] | None, required: Sequence[str]) -> None:
    found = list(fieldnames or ())
    missing = [c for c in required if c not in found]
    hint = ""
    if "creation_time" in missing:
        hint = (" (a pod list without creation times, such as the multigpu* variants' five columns, cannot be "
                "replayed: a replay needs each pod's arrival)")
    if missing:
        raise TraceError(f"{path}:1: column {', '.join(repr(c) for c in missing)} missing from the header "
                         f"{','.join(found) or '(empty file)'!r}; expected the columns {','.join(required)}{hint}")


def _field(path: Path, line: int, row: dict[str | None, str | list[str] | None], column: str) -> str:
    value = row.get(column)
    if value is None:
        raise TraceError(f"{path}:{line}: column {column!r}: no value (the row has too few fields); expected a value")
    assert isinstance(value, str)
    return value


def _int(path: Path, line: int, row: dict[str | None, str | list[str] | None], column: str) -> int:
    text = _field(path, line, row, column)
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column!r}: {text!r} is not a whole number >= 0")
    return value


def _time(path: Path, line: int, row: dict[str | None, str | list[str] | None], column: str, *,
          optional: bool) -> float | None:
    text = _field(path, line, row, column)
    if not text.strip() and optional:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        blank = " or empty" if optional else ""
        raise TraceError(f"{path}:{line}: column {column!r}: {text!r} is not a time in seconds (a finite "
                         f"number{blank})")
    return value


def _required_time(path: Path, line: int, row: dict[str | None, str | list[str] | None], column: str) -> float:
    value = _time(path, line, row, column, optional=False)
    assert value is not None
    return value


def _text(path: Path, line: int, row: dict[str | None, str | list[str] | None], column: str) -> str:
    text = _field(path, line, row, column)
    if not text.strip():
        raise TraceError(f"{path}:{line}: column {column!r}: {text!r} is empty; expected a name")
    return text


def _read(path: Path, columns: Sequence[str],
          parse: Callable[[int, dict[str | None, str | list[str] | None]], T]) -> list[T]:
    path = Path(path)
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        _columns(path, reader.fieldnames, columns)
        return [parse(reader.line_num, row) for row in reader]


def read_nodes(path: Path | str) -> list[NodeRow]:
    """The nodes of a node-list CSV (`sn,cpu_milli,memory_mib,gpu,model`; columns found by name, others ignored)."""
    where = Path(path)

    def parse(line: int, row: dict[str | None, str | list[str] | None]) -> NodeRow:
        return NodeRow(sn=_text(where, line, row, "sn"), cpu_milli=_int(where, line, row, "cpu_milli"),
                       memory_mib=_int(where, line, row, "memory_mib"), gpu=_int(where, line, row, "gpu"),
                       model=_field(where, line, row, "model"))
    return _read(where, NODE_COLUMNS, parse)


def read_pods(path: Path | str) -> list[PodRow]:
    """The pods of a pod-list CSV (the trace's eleven columns, found by name, others ignored). The `multigpu*`
    variants, which carry only the first five columns, are refused: a replay needs the creation times."""
    where = Path(path)

    def parse(line: int, row: dict[str | None, str | list[str] | None]) -> PodRow:
        declares = "declared_runtime" in row
        return PodRow(name=_text(where, line, row, "name"), cpu_milli=_int(where, line, row, "cpu_milli"),
                      memory_mib=_int(where, line, row, "memory_mib"), num_gpu=_int(where, line, row, "num_gpu"),
                      gpu_milli=_int(where, line, row, "gpu_milli"), gpu_spec=_field(where, line, row, "gpu_spec"),
                      qos=_field(where, line, row, "qos"), pod_phase=_field(where, line, row, "pod_phase"),
                      creation_time=_required_time(where, line, row, "creation_time"),
                      deletion_time=_time(where, line, row, "deletion_time", optional=True),
                      scheduled_time=_time(where, line, row, "scheduled_time", optional=True),
                      declared_runtime=(_time(where, line, row, "declared_runtime", optional=True) if declares
                                        else None),
                      declares=declares)
    return _read(where, POD_COLUMNS, parse)


def format_time(value: float | None) -> str:
    """A time as the trace writes it: whole seconds without a decimal point, other values exactly (repr); "" for
    none."""
    if value is None:
        return ""
    return str(int(value)) if value.is_integer() else repr(value)


def node_fields(row: NodeRow) -> list[str | int]:
    """A node's NODE_COLUMNS, in order."""
    return [row.sn, row.cpu_milli, row.memory_mib, row.gpu, row.model]


def pod_fields(row: PodRow) -> list[str | int]:
    """A pod's POD_COLUMNS, in order."""
    return [row.name, row.cpu_milli, row.memory_mib, row.num_gpu, row.gpu_milli, row.gpu_spec, row.qos, row.pod_phase,
            format_time(row.creation_time), format_time(row.deletion_time), format_time(row.scheduled_time)]


def csv_writer(handle: TextIO) -> Any:
    """The one CSV dialect every trace file is written in: the csv module's minimal quoting (a field holding a comma,
    a quote or a line break is quoted), lines ended by "\\n"."""
    return csv.writer(handle, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)


def write_nodes(path: Path | str, rows: Iterable[NodeRow]) -> None:
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv_writer(handle)
        writer.writerow(NODE_COLUMNS)
        for r in rows:
            writer.writerow(node_fields(r))


def write_pods(path: Path | str, rows: Iterable[PodRow]) -> None:
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv_writer(handle)
        writer.writerow(POD_COLUMNS)
        for r in rows:
            writer.writerow(pod_fields(r))
