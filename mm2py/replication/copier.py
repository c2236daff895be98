"""What a source part drives, whichever copier copies: the record copier
(mm2py.replication.copy_loop.CopyLoop) or the batch copier
(mm2py.replication.batch_copier.BatchCopier), chosen by ``replication.copy.mode``.

A copier copies the partitions it is given, on the caller's thread, and records what the
target holds through its committer (progress in MM2's format, offset syncs by `SyncRule`,
the replication statistics); the part calls nothing else of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from mm2py.replication.progress import SourcePartition

if TYPE_CHECKING:
    from mm2py.replication.copy_loop import NewPartition


class Copier(Protocol):
    """The source part's view of a copier (see the module docstring)."""

    @property
    def paused(self) -> bool:
        """Whether it reads nothing until resumed."""

    def assign(
        self, found: Sequence[NewPartition], earliest: Mapping[SourcePartition, int]
    ) -> None:
        """Start copying partitions: after their progress, else at `earliest`."""

    def unassign(self, gone: Sequence[SourcePartition]) -> list[str]:
        """Stop copying partitions (their progress stays); the topics let go."""

    def set_paused(self, paused: bool) -> None:
        """Pause in place (positions and progress stay), or resume."""

    def copy_batch(self, give_up: Callable[[], bool]) -> bool:
        """Copy what the source has now; False when `give_up()` stopped it mid-way."""

    def commit_progress(self, wait_until: float | None = None) -> None:
        """The periodic progress write."""

    def update_lag(self) -> None:
        """The periodic lag measurement."""

    def finish(self, deadline: float) -> None:
        """Record what the target holds by `deadline` (monotonic); the copier ends."""

    def failed_partitions(self) -> dict[str, str]:
        """Partitions stopped by a record the target rejected, with the reason."""
