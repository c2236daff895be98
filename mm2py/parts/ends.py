"""The source's end offsets, recorded on the target every `SOURCE_ENDS_INTERVAL` seconds.

After a disaster, `mm2py failover --disaster` must say what was never copied without
asking the source: the records the source had, as the replicator last saw them, minus
what was copied. This part keeps the first half: every interval it lists the end
offsets (last stable) of every partition the flow copies and writes, with the time it
asked, those that changed since its last write, and all of them every `REWRITE_INTERVAL`
(and at its start), to the flow's progress topic on the target
(`ProgressStore.submit_ends`, in MM2's key shape under connector ``mm2py-source-ends``,
which MM2 reads past). So a recorded end's time is at most REWRITE_INTERVAL older than
the part's last look, and an idle flow of 2,000 partitions writes 33 records a second
instead of 200. It runs once per flow, beside the checkpoint part. A failed round is
logged, counted and tried again at the next interval: its ends count as unwritten.
"""

from __future__ import annotations

import math
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.config import ClusterConfig, FlowConfig
from mm2py.kafka import clients
from mm2py.kafka.topics import TopicAdminError, list_offsets, partition_counts
from mm2py.replication.progress import ProgressStore
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import FlowPart
from mm2py.runtime.scheduler import Scheduler

SOURCE_ENDS_INTERVAL = 10.0
REWRITE_INTERVAL = 60.0
WRITE_TIMEOUT = 30.0


class SourceEndsError(RuntimeError):
    """The ends could not be read or written; says which cluster."""


class SourceEndsPart(FlowPart):
    """Records the flow's source end offsets on the target."""

    name = "source-ends"

    def __init__(
        self,
        flow: FlowConfig,
        source: ClusterConfig,
        target: ClusterConfig,
        metrics: Metrics,
        interval: float = SOURCE_ENDS_INTERVAL,
    ) -> None:
        super().__init__(flow, source, target, metrics)
        self.interval = interval
        self._written: dict[tuple[str, int], int] = {}  # what the target holds, as far as known
        self._rewritten_at = -math.inf  # monotonic: when every end was last written

    def run(self) -> None:
        flow = self.flow
        self._admin = clients.admin_client(self.source.librdkafka("admin"))
        self._store = ProgressStore.of_flow(flow, self.target.librdkafka("producer"))
        try:
            scheduler = Scheduler(f"flow {flow.name}", self.errors)
            scheduler.add(
                "recording the source's end offsets",
                self.record,
                self.interval,
                retry_on=(KafkaException, SourceEndsError),
            )
            scheduler.run(self.stopping)
        finally:
            self._store.close()

    def record(self) -> None:
        flow, timeout = self.flow, self.rules.settings.admin_timeout
        seen_at = int(time.time() * 1000)
        counts = partition_counts(self._admin, timeout)
        latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        specs = {
            TopicPartition(t, p): latest
            for t, n in counts.items()
            if self.rules.should_replicate(t)
            for p in range(n)
        }
        if not specs:
            return
        try:
            ends = list_offsets(self._admin, flow.source, specs, timeout)
        except TopicAdminError as exc:
            raise SourceEndsError(str(exc)) from None
        every = time.monotonic() - self._rewritten_at >= REWRITE_INTERVAL
        changed = {w: end for w, end in ends.items() if every or self._written.get(w) != end}
        if not changed:
            return
        written: set[tuple[str, int]] = set()

        def on_written(where: tuple[str, int], end: int) -> None:
            self._written[where] = end
            written.add(where)

        self._store.submit_ends(changed, seen_at, on_written)
        if not self._store.flush(WRITE_TIMEOUT):
            raise SourceEndsError(
                f"writing the source's end offsets to {flow.offsets_topic} on {flow.target} "
                "timed out"
            )
        if every and len(written) == len(changed):
            self._rewritten_at = time.monotonic()
