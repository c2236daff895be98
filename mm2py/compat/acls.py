"""Which topic ACLs a remote topic gets, as MM2's MirrorSourceConnector decides (pure).

LITERAL topic ACLs of replicated topics are copied to the remote topic name;
ALLOW WRITE is dropped (only replication writes to a remote topic), ALLOW ALL
becomes ALLOW READ, DENY entries are copied as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class TopicAcl:
    """One ACL binding on a topic resource (names as Kafka spells them: READ, ALLOW, ...)."""

    topic: str
    principal: str
    host: str
    operation: str
    permission: str
    pattern: str = "LITERAL"

    def __str__(self) -> str:
        return (
            f"{self.permission} {self.operation} for {self.principal} from {self.host} "
            f"on topic {self.topic}"
        )


def should_replicate_acl(acl: TopicAcl) -> bool:
    """MM2's shouldReplicateAcl: ALLOW WRITE never reaches a remote topic."""
    return not (acl.permission == "ALLOW" and acl.operation == "WRITE")


def target_acl(acl: TopicAcl, remote_topic: str) -> TopicAcl:
    """MM2's targetAclBinding: the remote name, ALLOW ALL downgraded to ALLOW READ."""
    operation = acl.operation
    if acl.permission == "ALLOW" and operation == "ALL":
        operation = "READ"
    return TopicAcl(remote_topic, acl.principal, acl.host, operation, acl.permission)


def target_acls(
    source: Iterable[TopicAcl],
    should_replicate_topic: Callable[[str], bool],
    remote_topic: Callable[[str], str],
) -> list[TopicAcl]:
    """The ACLs the target should have for the source's topic ACLs (sorted, no repeats)."""
    wanted = {
        target_acl(acl, remote_topic(acl.topic))
        for acl in source
        if acl.pattern == "LITERAL"
        and should_replicate_acl(acl)
        and should_replicate_topic(acl.topic)
    }
    return sorted(wanted)


def missing_acls(wanted: Iterable[TopicAcl], existing: Iterable[TopicAcl]) -> list[TopicAcl]:
    """The wanted ACLs the target does not have yet."""
    have = set(existing)
    return [acl for acl in wanted if acl not in have]
