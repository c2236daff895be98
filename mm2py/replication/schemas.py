"""Schema registry replication for one flow: subjects copied, schema ids translated.

A record framed by a Confluent serializer carries its schema's id in the source's
registry (mm2py.compat.schema_framing). On the target that id means nothing, or another
schema, so the copy loop gives every framed key and value the id the same schema has in
the target's registry, and leaves the payload as it is. `SchemaTranslator` knows that
mapping and makes it on demand:

- An id first met in a record of topic T is fetched from the source registry
  (``GET /schemas/ids/{id}``, and ``/schemas/ids/{id}/versions`` for the subjects it is
  registered under), then registered in the target registry: under the remote topic's
  subject when the source has it under T's TopicNameStrategy subject (``T-value`` ->
  ``A.T-value``), else under its own subject's name (other strategies). Its references
  are registered first, under their own (renamed) subjects, and point at the target's
  versions. Registering content the target already holds under that subject returns
  the id it has: nothing is duplicated.
- `copy_subjects` copies T's subjects (``T-key``, ``T-value``) up front, every version
  in order, when the loop starts copying T; the subject's compatibility level (its own,
  else the source registry's global one) is set on the target subject once its first
  version is there (a first version needs no check).
- Results are cached for the life of the translator (a process's copy loop): a
  schema id never changes its content in a registry.

Errors: an id the source registry does not know, or a schema the target refuses
(incompatible, invalid), is `UnresolvedSchema`: the loop stops that partition, naming
the record (or, with ``schema.registry.unresolved.ids = copy``, copies such records as
they are). A registry that cannot be reached or answers 5xx is `RegistryUnavailable`:
the loop ends and the part is restarted with backoff, so nothing is copied with a
wrong id meanwhile.

Invariant: a target header in `heads(T)` is the target registry's id of exactly the
schema whose source id is in the source header it is keyed by (or, in ``copy`` mode
only, that source header itself for an id found unresolvable).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

from mm2py.compat.schema_framing import (
    HEADER_SIZE,
    KEY_SUFFIX,
    VALUE_SUFFIX,
    header,
    remote_subject,
    topic_subjects,
)
from mm2py.config import ClusterConfig
from mm2py.replication.stats import SchemaStats

log = logging.getLogger(__name__)

UnresolvedMode = Literal["fail", "copy"]
# Statuses that say the registry answered and will answer the same again: the schema or
# subject is not there (404), or the target refuses the schema (409 incompatible, 422
# invalid). Anything else (5xx, no answer) may pass.
_DEFINITE = (400, 404, 409, 422)


class UnresolvedSchema(Exception):
    """A schema id that cannot be given a target id (its partition stops); `schema_id` is
    -1 when copying a subject up front failed."""

    def __init__(self, schema_id: int, reason: str) -> None:
        super().__init__(f"schema id {schema_id}: {reason}" if schema_id >= 0 else reason)
        self.schema_id = schema_id
        self.reason = reason


class RegistryUnavailable(RuntimeError):
    """A schema registry could not be asked (the part restarts with backoff)."""


def registry_client(conf: ClusterConfig | Mapping[str, str]) -> Any:
    """The one way to build a schema registry client: from a cluster's config
    (``<alias>.schema.registry.*``) or the settings it gave (a backfill task's)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    # Its HTTP library logs every request at INFO: a line per schema looked up.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if isinstance(conf, ClusterConfig):
        conf = conf.schema_registry_client()
    return SchemaRegistryClient(dict(conf))


def translator_for(
    flow_name: str,
    source: ClusterConfig | Mapping[str, str],
    target: ClusterConfig | Mapping[str, str],
    unresolved: UnresolvedMode,
    stats: SchemaStats | None = None,
) -> SchemaTranslator:
    """A translator between the source's and the target's registries (no request made)."""
    return SchemaTranslator(
        flow_name, registry_client(source), registry_client(target), unresolved, stats
    )


class SchemaTranslator:
    """Source schema id -> target schema id for the records of one flow (one thread)."""

    def __init__(
        self,
        flow_name: str,
        source: Any,
        target: Any,
        unresolved: UnresolvedMode = "fail",
        stats: SchemaStats | None = None,
    ) -> None:
        """`source`, `target`: SchemaRegistryClient-like clients of the two registries."""
        self.flow_name = flow_name
        self.source = source
        self.target = target
        self.unresolved = unresolved
        self.stats = stats if stats is not None else SchemaStats()
        # Per source topic: source framing header -> target framing header.
        self._heads: dict[str, dict[bytes, bytes]] = {}
        # (target subject, source id) -> (target id, the schema as registered there).
        self._registered: dict[tuple[str, int], tuple[int, Any]] = {}
        self._compatibility_done: set[str] = set()
        self._source_global: str | None = None

    def heads(self, topic: str) -> dict[bytes, bytes]:
        """The headers known for records of `topic` (the loop looks framed data up here)."""
        found = self._heads.get(topic)
        if found is None:
            found = self._heads[topic] = {}
        return found

    def close(self) -> None:
        """Close both registry clients' HTTP sessions."""
        for client in (self.source, self.target):
            close = getattr(client, "close", None)
            if close is not None:
                close()

    def translate(self, topic: str, remote_topic: str, data: bytes | None, is_key: bool) -> Any:
        """`data` (a key or value of `topic`) with the target's schema id when it is framed;
        unchanged otherwise. The copy loop inlines this (nothing else in mm2py calls it)."""
        if not data or data[0] != 0 or len(data) < HEADER_SIZE:
            return data
        head = self.heads(topic).get(data[:HEADER_SIZE])
        if head is None:
            head = self.resolve(topic, remote_topic, data[:HEADER_SIZE], is_key)
        self.stats.ids_translated += 1
        return head + data[HEADER_SIZE:]

    # -- on demand -------------------------------------------------------------------

    def resolve(self, topic: str, remote_topic: str, head: bytes, is_key: bool) -> bytes:
        """The target header for source header `head` met in a key (`is_key`) or value of
        `topic`. Raises UnresolvedSchema (in ``fail`` mode) or RegistryUnavailable."""
        source_id = int.from_bytes(head[1:HEADER_SIZE], "big", signed=True)
        try:
            target_id = self._resolve(topic, remote_topic, source_id, is_key)
        except UnresolvedSchema as exc:
            self.stats.failures += 1
            if self.unresolved == "fail":
                raise
            log.warning(
                "flow %s: %s; records of %s with it are copied as they are "
                "(schema.registry.unresolved.ids = copy)",
                self.flow_name,
                exc,
                topic,
            )
            self.heads(topic)[head] = head
            return head
        new = header(target_id)
        self.heads(topic)[head] = new
        return new

    def _resolve(self, topic: str, remote_topic: str, source_id: int, is_key: bool) -> int:
        schema = self._ask(
            source_id, "fetching it from the source registry", "source", "get_schema", source_id
        )
        versions = self._ask(
            source_id,
            "listing its subjects in the source registry",
            "source",
            "get_schema_versions",
            source_id,
        )
        own, other = topic_subjects(topic)
        if not is_key:
            own, other = other, own
        subjects = [v.subject for v in versions if v.subject]
        if own in subjects:
            subject = own
        elif other in subjects:
            subject = other
        elif subjects:
            subject = subjects[0]  # another naming strategy: the subject keeps its name
        else:
            subject = topic + (KEY_SUFFIX if is_key else VALUE_SUFFIX)
        target_subject = remote_subject(subject, topic, remote_topic)
        return self._register(source_id, schema, subject, target_subject, topic, remote_topic)

    # -- up front ---------------------------------------------------------------------

    def copy_subjects(self, topic: str, remote_topic: str) -> None:
        """Copy `topic`'s TopicNameStrategy subjects, every version in order. Raises
        UnresolvedSchema or RegistryUnavailable (the caller logs and goes on: ids are
        resolved again on demand)."""
        heads = self.heads(topic)
        for subject in topic_subjects(topic):
            try:
                versions = self._ask(
                    -1, f"listing subject {subject}", "source", "get_versions", subject
                )
            except UnresolvedSchema:
                continue  # the topic has no such subject
            target_subject = remote_subject(subject, topic, remote_topic)
            for version in versions:
                found = self._ask(
                    -1,
                    f"reading {subject} version {version}",
                    "source",
                    "get_version",
                    subject,
                    version,
                )
                target_id = self._register(
                    found.schema_id, found.schema, subject, target_subject, topic, remote_topic
                )
                heads[header(found.schema_id)] = header(target_id)
            log.info(
                "flow %s: subject %s copied to %s (%d version(s))",
                self.flow_name,
                subject,
                target_subject,
                len(versions),
            )

    # -- registering ------------------------------------------------------------------

    def _register(
        self,
        source_id: int,
        schema: Any,
        subject: str,
        target_subject: str,
        topic: str,
        remote_topic: str,
    ) -> int:
        """Register `schema` (source id `source_id`, under `subject` there) in the target
        under `target_subject`, its references first; the target's id."""
        return self._copy(source_id, schema, subject, target_subject, topic, remote_topic)[0]

    def _copy(
        self,
        source_id: int,
        schema: Any,
        subject: str,
        target_subject: str,
        topic: str,
        remote_topic: str,
    ) -> tuple[int, Any]:
        """`_register`, and the schema as registered (its references the target's)."""
        known = self._registered.get((target_subject, source_id))
        if known is not None:
            return known
        from confluent_kafka.schema_registry import Schema, SchemaReference

        references = []
        for ref in schema.references or []:
            found = self._ask(
                source_id,
                f"reading its reference {ref.subject} version {ref.version}",
                "source",
                "get_version",
                ref.subject,
                ref.version,
            )
            ref_subject = remote_subject(ref.subject, topic, remote_topic)
            _, ref_copy = self._copy(
                found.schema_id, found.schema, ref.subject, ref_subject, topic, remote_topic
            )
            # References name a subject's version: the target's may differ from the source's.
            registered = self._ask(
                source_id,
                f"finding its reference in {ref_subject} in the target registry",
                "target",
                "lookup_schema",
                ref_subject,
                ref_copy,
            )
            references.append(SchemaReference(ref.name, ref_subject, registered.version))
        copy = Schema(schema.schema_str, schema.schema_type, references)
        target_id: int = self._ask(
            source_id,
            f"registering it under {target_subject} in the target registry",
            "target",
            "register_schema",
            target_subject,
            copy,
        )
        self._copy_compatibility(source_id, subject, target_subject)
        self.stats.schemas_copied += 1
        self._registered[(target_subject, source_id)] = (target_id, copy)
        return target_id, copy

    def _copy_compatibility(self, source_id: int, subject: str, target_subject: str) -> None:
        """Give the target subject, once, after its first version is registered (a first
        version needs no check, and some registries, Apicurio, keep no level for a subject
        that does not exist), the compatibility level the source subject has: its own,
        else the source registry's global one. So the target checks the versions that
        follow as the source did, whatever its own default (Confluent's BACKWARD,
        Apicurio's NONE). A level the target refuses is logged, not a failure: the ids
        are right either way."""
        if target_subject in self._compatibility_done:
            return
        self._compatibility_done.add(target_subject)
        level = self._level(source_id, subject)
        if level is None:
            if self._source_global is None:
                self._source_global = self._level(source_id, None) or ""
            level = self._source_global or None
        if level is None:
            return
        try:
            self._ask(
                source_id,
                f"setting {target_subject}'s compatibility to {level} in the target registry",
                "target",
                "set_compatibility",
                target_subject,
                level,
            )
        except UnresolvedSchema as exc:
            log.warning("flow %s: %s; the subject keeps the target's level", self.flow_name, exc)

    def _level(self, source_id: int, subject: str | None) -> str | None:
        try:
            level = self._ask(
                source_id, "reading a compatibility level", "source", "get_compatibility", subject
            )
        except UnresolvedSchema:
            return None  # none set for the subject (Confluent answers 404)
        return str(level).upper() if level else None

    # -- asking -----------------------------------------------------------------------

    def _ask(self, source_id: int, doing: str, which: str, method: str, *args: Any) -> Any:
        """Call `method` of the `which` registry's client, counted; its errors as ours."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        client = self.source if which == "source" else self.target
        self.stats.lookups += 1
        try:
            return getattr(client, method)(*args)
        except SchemaRegistryError as exc:
            status = exc.http_status_code
            if status in _DEFINITE:
                reason = f"{doing} failed: {exc.error_message} (HTTP {status})"
                raise UnresolvedSchema(source_id, reason) from None
            raise RegistryUnavailable(
                f"flow {self.flow_name}: the {which} schema registry failed {doing}"
                f"{_for(source_id)}: {exc.error_message} (HTTP {status})"
            ) from None
        except Exception as exc:  # the client's HTTP errors: connection refused, timeout
            raise RegistryUnavailable(
                f"flow {self.flow_name}: the {which} schema registry could not be asked "
                f"({doing}{_for(source_id)}): {type(exc).__name__}: {_no_userinfo(str(exc))}"
            ) from None


def _for(source_id: int) -> str:
    """ ", for schema id N" in messages (nothing for the up-front copy of subjects)."""
    return f" for schema id {source_id}" if source_id >= 0 else ""


_USERINFO = re.compile(r"//[^/@\s]+@")


def _no_userinfo(text: str) -> str:
    """`text` without the user:password of any URL in it (a registry URL may carry them)."""
    return _USERINFO.sub("//***@", text)
