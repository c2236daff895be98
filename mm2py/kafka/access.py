"""The start-up access check: does every cluster accept our login and certificate?"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from confluent_kafka import KafkaError

from mm2py.config import MirrorConfig
from mm2py.errors import Mm2pyError
from mm2py.kafka import clients


class ClusterAccessError(Mm2pyError):
    """A cluster refuses the configured credentials or certificate; retrying cannot help."""


def check_cluster_access(config: MirrorConfig, aliases: Iterable[str]) -> None:
    """Raise ClusterAccessError naming the cluster if a login or TLS handshake fails.

    All clusters are asked at once; unreachable ones pass (the parts retry them).
    """
    aliases = sorted(set(aliases))
    found: dict[str, KafkaError | None] = {}

    def ask(alias: str) -> None:
        found[alias] = clients.access_error(config.cluster(alias).librdkafka("admin"))

    askers = [threading.Thread(target=ask, args=(alias,), daemon=True) for alias in aliases]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    for alias in aliases:
        err = found.get(alias)
        if err is not None:
            raise ClusterAccessError(
                clients.access_problem(alias, config.cluster(alias).librdkafka("admin"), err)
            )
