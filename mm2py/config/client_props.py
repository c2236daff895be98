"""Java Kafka client properties (as in mm2.properties) mapped to librdkafka properties.

Keys librdkafka knows pass through; Java-only keys are mapped where there is an obvious
equivalent and otherwise dropped with one warning each. Never logs a value.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from mm2py.config.errors import ConfigError

log = logging.getLogger(__name__)

# Settable librdkafka properties (CONFIGURATION.md, callbacks left out), checked against
# the librdkafka that confluent-kafka ships.
LIBRDKAFKA_PROPERTIES = frozenset(
    """
    client.id metadata.broker.list bootstrap.servers message.max.bytes
    message.copy.max.bytes receive.message.max.bytes max.in.flight.requests.per.connection
    max.in.flight metadata.recovery.strategy metadata.recovery.rebootstrap.trigger.ms
    topic.metadata.refresh.interval.ms metadata.max.age.ms
    topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.sparse
    topic.metadata.propagation.max.ms topic.blacklist debug socket.timeout.ms
    socket.send.buffer.bytes socket.receive.buffer.bytes socket.keepalive.enable
    socket.nagle.disable socket.max.fails broker.address.ttl broker.address.family
    socket.connection.setup.timeout.ms connections.max.idle.ms reconnect.backoff.ms
    reconnect.backoff.max.ms statistics.interval.ms log_level log.queue log.thread.name
    enable.random.seed log.connection.close internal.termination.signal api.version.request
    api.version.request.timeout.ms api.version.fallback.ms broker.version.fallback
    allow.auto.create.topics security.protocol ssl.cipher.suites ssl.curves.list
    ssl.sigalgs.list ssl.key.location ssl.key.password ssl.key.pem ssl.certificate.location
    ssl.certificate.pem ssl.ca.location https.ca.location https.ca.pem ssl.ca.pem
    ssl.ca.certificate.stores ssl.crl.location ssl.keystore.location ssl.keystore.password
    ssl.providers ssl.engine.location ssl.engine.id enable.ssl.certificate.verification
    ssl.endpoint.identification.algorithm sasl.mechanisms sasl.mechanism
    sasl.kerberos.service.name sasl.kerberos.principal sasl.kerberos.kinit.cmd
    sasl.kerberos.keytab sasl.kerberos.min.time.before.relogin sasl.username sasl.password
    sasl.oauthbearer.config enable.sasl.oauthbearer.unsecure.jwt sasl.oauthbearer.method
    sasl.oauthbearer.client.id sasl.oauthbearer.client.credentials.client.id
    sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.client.secret
    sasl.oauthbearer.scope sasl.oauthbearer.extensions sasl.oauthbearer.token.endpoint.url
    sasl.oauthbearer.grant.type sasl.oauthbearer.assertion.algorithm
    sasl.oauthbearer.assertion.private.key.file
    sasl.oauthbearer.assertion.private.key.passphrase
    sasl.oauthbearer.assertion.private.key.pem sasl.oauthbearer.assertion.file
    sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
    sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
    sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub
    sasl.oauthbearer.assertion.jwt.template.file
    sasl.oauthbearer.metadata.authentication.type plugin.library.paths group.id
    group.instance.id partition.assignment.strategy session.timeout.ms heartbeat.interval.ms
    group.protocol.type group.protocol group.remote.assignor coordinator.query.interval.ms
    max.poll.interval.ms enable.auto.commit auto.commit.interval.ms enable.auto.offset.store
    queued.min.messages queued.max.messages.kbytes fetch.wait.max.ms fetch.queue.backoff.ms
    fetch.message.max.bytes max.partition.fetch.bytes fetch.max.bytes fetch.min.bytes
    fetch.error.backoff.ms isolation.level enable.partition.eof check.crcs client.rack
    transactional.id transaction.timeout.ms enable.idempotence enable.gapless.guarantee
    queue.buffering.max.messages queue.buffering.max.kbytes queue.buffering.max.ms linger.ms
    message.send.max.retries retries retry.backoff.ms retry.backoff.max.ms
    queue.buffering.backpressure.threshold compression.codec compression.type
    batch.num.messages batch.size delivery.report.only.error sticky.partitioning.linger.ms
    client.dns.lookup enable.metrics.push request.required.acks acks request.timeout.ms
    message.timeout.ms delivery.timeout.ms partitioner compression.level auto.offset.reset
    """.split()  # noqa: SIM905 - a word list reads better than 150 quoted lines
)

# Java name -> librdkafka name, where the meaning is the same.
_RENAMED = {
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "max.request.size": "message.max.bytes",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "sasl.mechanisms": "sasl.mechanism",
    "ssl.keystore.key": "ssl.key.pem",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",
    "ssl.truststore.certificates": "ssl.ca.pem",
}

# Login modules whose username/password librdkafka takes as sasl.username/sasl.password.
_MAPPED_LOGIN_MODULES = ("PlainLoginModule", "ScramLoginModule")
_JAAS_FLAGS = [("word", flag) for flag in ("required", "requisite", "sufficient", "optional")]


def to_librdkafka(props: Mapping[str, str], prefix: str, path: Path) -> dict[str, str]:
    """Map one level of client properties (top level, ``A.``, ``A.consumer.``) to librdkafka.

    ``prefix`` is how the user wrote the level, for messages. Explicit librdkafka keys win
    over ones derived from Java keys (``sasl.jaas.config``, keystores, renamed keys).
    """
    derived: dict[str, str] = {}
    direct: dict[str, str] = {}
    truststore_type = props.get("ssl.truststore.type", "JKS").strip().upper()
    keystore_type = props.get("ssl.keystore.type", "JKS").strip().upper()
    for key, value in props.items():
        name = prefix + key
        if key == "sasl.jaas.config":
            derived.update(parse_jaas(value, name, path))
        elif key in ("ssl.truststore.type", "ssl.keystore.type"):
            continue  # consumed by the store keys below
        elif key == "ssl.truststore.location" and truststore_type == "PEM":
            derived["ssl.ca.location"] = value
        elif key == "ssl.keystore.location" and keystore_type == "PEM":
            # A PEM keystore holds both; OpenSSL picks the matching block from the same file.
            derived["ssl.certificate.location"] = value
            derived["ssl.key.location"] = value
        elif key in _RENAMED:
            derived[_RENAMED[key]] = value
        elif key.startswith("ssl.truststore.") or (
            key.startswith("ssl.keystore.") and keystore_type != "PKCS12"
        ):
            _ignore(
                path,
                name,
                f"librdkafka reads only PEM stores (and PKCS12 keystores); convert to PEM and set"
                f" {prefix}ssl.ca.location / {prefix}ssl.certificate.location",
            )
        elif key == "ssl.endpoint.identification.algorithm":
            direct[key] = value or "none"  # Java's "" disables host name checks
        elif key == "partition.assignment.strategy" and "." in value:
            _ignore(path, name, "Java assignor classes have no librdkafka equivalent")
        elif key in LIBRDKAFKA_PROPERTIES:
            direct[key] = value
        else:
            close = difflib.get_close_matches(key, LIBRDKAFKA_PROPERTIES, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            _ignore(path, name, f"not a librdkafka client property{hint}")
    return derived | direct


def _ignore(path: Path, name: str, why: str) -> None:
    log.warning("%s: %s: ignored: %s", path, name, why)


def parse_jaas(text: str, key: str, path: Path) -> dict[str, str]:
    """Map a PLAIN or SCRAM ``sasl.jaas.config`` line to sasl.username/sasl.password.

    Accepts ``<LoginModule> <flag> name="value" ... ;`` with quoted values and escaped
    quotes. Errors never quote the line, which holds the password.
    """
    tokens = _jaas_tokens(text, key, path)
    if tokens and tokens[-1][0] == ";":
        tokens = tokens[:-1]
    if any(kind == ";" for kind, _ in tokens):
        raise ConfigError(path, key, "expected exactly one login module entry")
    if len(tokens) < 2 or tokens[0][0] != "word" or tokens[1] not in _JAAS_FLAGS:
        raise ConfigError(
            path, key, 'expected \'<LoginModule> required username="..." password="...";\''
        )
    module = tokens[0][1].rsplit(".", 1)[-1]
    if module not in _MAPPED_LOGIN_MODULES:
        # Name the module only if it looks like a class name: the text may be garbled.
        shown = tokens[0][1] if re.fullmatch(r"[\w$]+(\.[\w$]+)+", tokens[0][1]) else "this"
        raise ConfigError(
            path,
            key,
            f"login module {shown} cannot be mapped to librdkafka; only PlainLoginModule and"
            " ScramLoginModule can — remove sasl.jaas.config and set librdkafka's sasl.* keys",
        )
    options: dict[str, str] = {}
    rest = tokens[2:]
    while rest:
        if len(rest) < 3 or rest[0][0] != "word" or rest[1][0] != "=" or rest[2][0] == "=":
            raise ConfigError(path, key, 'expected name="value" options after the control flag')
        options[rest[0][1]] = rest[2][1]
        rest = rest[3:]
    missing = [opt for opt in ("username", "password") if opt not in options]
    if missing:
        raise ConfigError(path, key, f"{module} entry has no {' or '.join(missing)} option")
    return {"sasl.username": options["username"], "sasl.password": options["password"]}


def _jaas_tokens(text: str, key: str, path: Path) -> list[tuple[str, str]]:
    """Split a JAAS entry into ("word"|"quoted"|"="|";", text) tokens."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif char in "=;":
            tokens.append((char, char))
            i += 1
        elif char == '"':
            value: list[str] = []
            i += 1
            while i < len(text) and text[i] != '"':
                if text[i] == "\\" and i + 1 < len(text):
                    i += 1
                value.append(text[i])
                i += 1
            if i >= len(text):
                raise ConfigError(path, key, "unterminated quoted value")
            tokens.append(("quoted", "".join(value)))
            i += 1
        else:
            start = i
            while i < len(text) and not text[i].isspace() and text[i] not in '=;"':
                i += 1
            tokens.append(("word", text[start:i]))
    return tokens
