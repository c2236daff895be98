"""What the REST API reports about flows and how `mm2py status` prints it (pure).

The models are the REST API's response schemas (they make its OpenAPI document)
and what `mm2py status` parses back. Latency quantiles come from the copy loop's
histograms: the difference between now and a snapshot about a minute old.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from mm2py.replication.stats import LATENCY_BUCKETS

# UNREACHABLE: a cluster the part uses has not answered for cluster.unreachable.grace.ms.
# STANDBY: a once-per-flow part that runs on another node of the cluster (with task 0).
# JOINING: the node's member part, until the flow's group has given it its tasks.
PartState = Literal["RUNNING", "PAUSED", "FAILED", "UNREACHABLE", "STANDBY", "JOINING"]


class PartStatus(BaseModel):
    """One part of a flow (as a task of a Kafka Connect connector)."""

    part: str = Field(
        description="source (one per task on this node), member, checkpoint, sync or heartbeat"
    )
    state: PartState
    task: int | None = Field(default=None, description="the task of the flow (source parts)")
    pid: int | None = Field(default=None, description="the task's process on this node")
    partitions: list[str] = Field(
        default_factory=list,
        description="the remote topic partitions the task copies, as `topic-partition`",
    )
    restarts: int = Field(description="failures since the daemon started (each one restarted)")
    trace: str | None = Field(
        default=None, description="the error of the last failure, while FAILED"
    )
    failed_partitions: dict[str, str] = Field(
        default_factory=dict,
        description="remote topic partitions stopped by a record the target rejected "
        "(or whose schema id cannot be resolved), with the reason (source part); a restart "
        "of the flow retries them",
    )
    unreachable: list[str] = Field(
        default_factory=list,
        description="clusters the part uses that have not answered for "
        "cluster.unreachable.grace.ms, as `cluster B (host:port) since 12:03:04` "
        "(state UNREACHABLE)",
    )


class TopicStatus(BaseModel):
    """Replication of one topic, summed over its partitions."""

    topic: str = Field(description="the remote topic, on the target")
    partitions: int
    records: int = Field(description="records copied since the daemon started")
    lag_records: int | None = Field(
        description="source end offsets minus the next offsets to copy; "
        "null (unknown) while the source or target cluster is unreachable"
    )
    latency_p50_seconds: float | None = Field(
        default=None,
        description="record timestamp to target acknowledgement, median of the last minute",
    )
    latency_p99_seconds: float | None = None
    skipped_records: int = Field(
        default=0,
        description="records deleted on the source (retention, truncation, delete_records) "
        "before they were copied, since the daemon started; the log names their offsets",
    )


class FlowStatus(BaseModel):
    """A flow A->B with its parts and topics."""

    name: str = Field(description="A->B")
    source: str
    target: str
    replicating: bool = Field(description="A->B.enabled; false for a pair that only heartbeats")
    delivery: Literal["exactly-once", "at-least-once"] = Field(
        description="exactly-once when its records and progress are written in transactions "
        "(B.exactly.once.source.support = enabled, and the target accepted them at start); "
        "readers see each record once only with isolation.level = read_committed"
    )
    # A node of a release before the field copied records in every mode.
    copier: Literal["batch", "record"] = Field(
        "record",
        description="batch when the source's record batches are passed through as they are, "
        "record when each record is read and produced again (replication.copy.mode; under "
        "auto, copier_reason says why a flow copies records)",
    )
    copier_reason: str = Field(
        "", description="under replication.copy.mode = auto, what keeps the flow from batch"
    )
    state: PartState = Field(
        description="FAILED if a part failed or a partition stopped, else UNREACHABLE if a "
        "cluster does not answer, else PAUSED if paused, else JOINING until the flow's "
        "group has given this node its tasks"
    )
    parts: list[PartStatus]
    topics: list[TopicStatus]
    lag_records: int | None = Field(description="null (unknown) while a cluster is unreachable")


class Health(BaseModel):
    """Ready when every enabled flow runs: no part failed, paused or unreachable, no
    partition stopped."""

    ready: bool
    problems: list[str]


class Version(BaseModel):
    name: str = "mm2py"
    version: str


class Problem(BaseModel):
    """An error answer, mm2py's and Kafka Connect's alike (``{"error_code", "message"}``)."""

    error_code: int
    message: str


def flow_state(parts: Sequence[PartStatus]) -> PartState:
    """The worst state of a flow's parts."""
    if any(p.state == "FAILED" or p.failed_partitions for p in parts):
        return "FAILED"
    if any(p.state == "UNREACHABLE" for p in parts):
        return "UNREACHABLE"
    if any(p.state == "PAUSED" for p in parts):
        return "PAUSED"
    if any(p.state == "JOINING" for p in parts):
        return "JOINING"
    return "RUNNING"


def health(flows: Iterable[FlowStatus]) -> Health:
    """Ready only when every replicating flow runs."""
    problems: list[str] = []
    for flow in flows:
        if not flow.replicating:
            continue
        for part in flow.parts:
            if part.state == "UNREACHABLE":
                problems.append(
                    f"flow {flow.name}: {part.part} part UNREACHABLE: {'; '.join(part.unreachable)}"
                )
            elif part.state not in ("RUNNING", "STANDBY"):  # STANDBY: runs on another node
                problems.append(f"flow {flow.name}: {part.part} part {part.state}")
            for partition, reason in sorted(part.failed_partitions.items()):
                problems.append(f"flow {flow.name}: partition {partition} stopped: {reason}")
    return Health(ready=not problems, problems=problems)


def resolve_flow(name: str, known: Iterable[str]) -> str | None:
    """The flow `name` means: `A->B` as it is, or `A-B` when exactly one flow reads so."""
    known = list(known)
    if name in known:
        return name
    dashed = [flow for flow in known if flow.replace("->", "-", 1) == name]
    return dashed[0] if len(dashed) == 1 else None


# -- latency quantiles ----------------------------------------------------------------

BucketCounts = list[int]  # per bucket of LATENCY_BUCKETS, then the overflow bucket


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile of a histogram, interpolated inside its bucket as Prometheus does.

    None without observations; the largest finite bound when it falls in the overflow.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    running = 0
    for i, count in enumerate(counts):
        if running + count >= rank and count > 0:
            if i >= len(LATENCY_BUCKETS):
                return LATENCY_BUCKETS[-1]
            lower = LATENCY_BUCKETS[i - 1] if i > 0 else 0.0
            upper = LATENCY_BUCKETS[i]
            return lower + (upper - lower) * (rank - running) / count
        running += count
    return LATENCY_BUCKETS[-1]


class LatencyWindow:
    """Snapshots of per-topic latency histograms, for quantiles over about `span` seconds."""

    def __init__(self, span: float = 60.0, every: float = 5.0) -> None:
        self.span = span
        self.every = every
        self._snapshots: deque[tuple[float, dict[str, BucketCounts]]] = deque()

    def due(self, now: float) -> bool:
        """Whether `record` would keep a snapshot now (the last one is `every` seconds old)."""
        return not self._snapshots or now - self._snapshots[-1][0] >= self.every

    def record(self, now: float, counts: Mapping[str, Sequence[int]]) -> None:
        """Keep a snapshot if the last one is `every` seconds old; forget old ones."""
        if not self.due(now):
            return
        self._snapshots.append((now, {t: list(c) for t, c in counts.items()}))
        while len(self._snapshots) > 1 and now - self._snapshots[1][0] >= self.span:
            self._snapshots.popleft()

    def quantiles(
        self, counts: Mapping[str, Sequence[int]], qs: Sequence[float] = (0.5, 0.99)
    ) -> dict[str, list[float | None]]:
        """Quantiles per topic of what was observed since the oldest snapshot kept."""
        base = self._snapshots[0][1] if self._snapshots else {}
        out: dict[str, list[float | None]] = {}
        for topic, now_counts in counts.items():
            before = base.get(topic, [0] * len(now_counts))
            delta = [max(a - b, 0) for a, b in zip(now_counts, before, strict=False)]
            out[topic] = [quantile(delta, q) for q in qs]
        return out


# -- the table of `mm2py status` ------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.1f} s"


def _lag(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def text_table(rows: Sequence[Sequence[str]], indent: str) -> list[str]:
    """Rows as left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def format_status(flows: Sequence[FlowStatus], health: Health | None = None) -> str:
    """A table per flow: its parts with their states, then its topics with lag and latency."""
    lines: list[str] = []
    if health is not None:
        lines.append("health: ready" if health.ready else "health: NOT READY")
        lines.extend(f"  {problem}" for problem in health.problems)
        lines.append("")
    if not flows:
        lines.append("no flows")
    for flow in flows:
        kind = (
            f"  {flow.delivery}, {flow.copier} copier"
            if flow.replicating
            else ("  (heartbeats only)")
        )
        lag = "lag unknown" if flow.lag_records is None else f"lag {flow.lag_records} records"
        lines.append(f"{flow.name}  {flow.state}  {lag}{kind}")
        part_rows = [["PART", "STATE", "RESTARTS", "ERROR"]]
        for part in flow.parts:
            error = ""
            if part.unreachable:
                error = "; ".join(part.unreachable)
            elif part.trace:
                error = part.trace.strip().splitlines()[-1]
            elif part.failed_partitions:
                error = f"stopped partitions: {', '.join(sorted(part.failed_partitions))}"
            name = part.part if part.task is None else f"{part.part} task {part.task}"
            part_rows.append([name, part.state, str(part.restarts), error])
        lines.extend(text_table(part_rows, "  "))
        if flow.topics:
            topic_rows = [["TOPIC", "PARTITIONS", "RECORDS", "LAG", "LATENCY p50", "p99"]]
            for topic in flow.topics:
                topic_rows.append(
                    [
                        topic.topic,
                        str(topic.partitions),
                        str(topic.records),
                        _lag(topic.lag_records),
                        _seconds(topic.latency_p50_seconds),
                        _seconds(topic.latency_p99_seconds),
                    ]
                )
            lines.append("")
            lines.extend(text_table(topic_rows, "  "))
            lines.extend(
                f"  {topic.topic}: {topic.skipped_records} records were deleted on "
                f"{flow.source} before they were copied (the log names their offsets)"
                for topic in flow.topics
                if topic.skipped_records
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
