"""One partition's raw-batch data path, for tools and tests that look at a single partition
(the benchmark's batch census, the pass-through tests). The batch copier uses
mm2py.kafka.raw_clients directly: one loop and one session per cluster for all its
partitions.

- `RawFetcher`: Fetch at read_committed from one source partition; returns the records bytes
  as the broker sent them and the aborted-transactions list (`Fetched`). Retries a
  partition that is retrying until it answers or `retry_timeout` passes.
- `IdempotentRawProducer`: an idempotent producer of one target partition; `produce` returns
  each batch's target base offset, or raises `BatchRejected`.
- Each object runs its session on a `RawLoop` of its own (`SessionsOnLoop`), on the
  thread that calls it: its methods are synchronous and meant for one caller thread.
  Construct (no network), then `open()`; `close()` closes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mm2py.kafka.raw_clients import (
    BatchRejected,
    Fetched,
    FetchSession,
    IdempotentProduceSession,
    OffsetOutOfRange,
    RawPartitionError,
    SessionsOnLoop,
    client_settings,
)
from mm2py.kafka.record_batches import RecordBatch

__all__ = [
    "BatchRejected",
    "Fetched",
    "IdempotentRawProducer",
    "OffsetOutOfRange",
    "RawFetcher",
    "RawPartitionError",
    "client_settings",
]


class _OnePartition(SessionsOnLoop):
    role = "raw"

    def __init__(
        self,
        props: Mapping[str, str],
        topic: str,
        partition: int,
        session: FetchSession | IdempotentProduceSession,
    ) -> None:
        self.bootstrap = props["bootstrap.servers"]
        self.topic = topic
        self.partition = partition
        super().__init__(
            f"mm2py-{self.role}-{topic}-{partition}", f"{self.role} for {self.where()}", [session]
        )

    def where(self) -> str:
        return f"{self.topic}-{self.partition} on {self.bootstrap}"


class RawFetcher(_OnePartition):
    """Fetch raw record batches of one source partition at read_committed."""

    role = "fetcher"

    def __init__(
        self,
        props: Mapping[str, str],
        topic: str,
        partition: int,
        *,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 500,
        retry_timeout: float = 60.0,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.session = FetchSession(
            props,
            max_wait_ms=max_wait_ms,
            partition_max_bytes=max_bytes,
            max_bytes=max_bytes,
            retry_timeout=retry_timeout,
            client_factory=client_factory,
            # every call wants an answer, also at the end of the log, where an incremental
            # session would answer nothing new; for one partition a full Fetch is as small
            incremental=False,
        )
        super().__init__(props, topic, partition, self.session)

    def __enter__(self) -> RawFetcher:
        self.open()
        return self

    def fetch(self, position: int) -> Fetched:
        """The batches from the one holding `position` on (none when it is the end)."""
        return self._run(self._fetch(position))

    async def _fetch(self, position: int) -> Fetched:
        tp = (self.topic, self.partition)
        while True:
            result = (await self.session.fetch({tp: position})).get(tp)
            if isinstance(result, OffsetOutOfRange):
                raise result
            if result is not None:
                return result


class IdempotentRawProducer(_OnePartition):
    """Produce rewritten batches to one target partition as an idempotent producer."""

    role = "producer"

    def __init__(
        self,
        props: Mapping[str, str],
        topic: str,
        partition: int,
        *,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.session = IdempotentProduceSession(
            props,
            retry_timeout=retry_timeout,
            request_timeout_ms=request_timeout_ms,
            client_factory=client_factory,
        )
        super().__init__(props, topic, partition, self.session)

    def __enter__(self) -> IdempotentRawProducer:
        self.open()
        return self

    @property
    def producer_id(self) -> int:
        return self.session.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.session.producer_epoch

    @property
    def next_sequence(self) -> int:
        return self.session.sequences.get((self.topic, self.partition), 0)

    def produce(self, batches: Sequence[RecordBatch]) -> list[int]:
        """Produce PASS batches in order; the target base offset of each."""
        tp = (self.topic, self.partition)
        result = self._run(self.session.produce({tp: batches}))[tp]
        if isinstance(result, BatchRejected):
            raise result
        return result
