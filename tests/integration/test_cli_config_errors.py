"""`mm2py run` with a bad config: one line naming file and key, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mm2py.dev.launcher import LocalCluster
from tests.daemon_harness import mm2_properties
from tests.kafka_helpers import create_topic, produce, topic_names

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Never-Print"

BAD_PROPERTIES = {
    "unknown-cluster-in-flow": ("A->C.enabled = true\n", "A->C"),
    "invalid-topics-regex": ("A->B.topics = orders(\n", "A->B.topics"),
    "negative-interval": (
        "refresh.topics.interval.seconds = -5\n",
        "refresh.topics.interval.seconds",
    ),
    "unknown-policy": ("replication.policy.class = com.example.Mine\n", "replication.policy.class"),
    "wrong-type": ("replication.factor = many\n", "replication.factor"),
    "bad-location": ("offset-syncs.topic.location = nowhere\n", "offset-syncs.topic.location"),
    # Exactly-once required where it cannot be had; nothing runs at-least-once instead.
    "exactly-once-read-uncommitted": (
        "B.exactly.once.source.support = enabled\nA->B.exactly.once.support = required\n"
        "A.consumer.isolation.level = read_uncommitted\n",
        "A.consumer.isolation.level",
    ),
    "exactly-once-required": (
        "A->B.exactly.once.support = required\n",
        "A->B.exactly.once.support",
    ),
    "untranslatable-java-regex": ("A->B.topics = \\\\p{L}+\n", "A->B.topics"),
    "unmappable-jaas": (
        'A.sasl.jaas.config = com.example.Login required password="' + SECRET + '";\n',
        "A.sasl.jaas.config",
    ),
}


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "run", str(config), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("case", sorted(BAD_PROPERTIES))
def test_bad_properties_exit_2_with_one_line_and_write_nothing(
    case: str, cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    extra, key = BAD_PROPERTIES[case]
    offsets_topic = f"progress-{unique}"
    config = tmp_path / "mm2.properties"
    base = mm2_properties(cluster_a, cluster_b, unique, **{"offset.storage.topic": offsets_topic})
    config.write_text(base + extra)
    # A daemon that accepted the config would copy this topic and record progress.
    create_topic(cluster_a, unique)
    produce(cluster_a, unique, [(0, None, b"x")])

    done = _run(config)

    assert done.returncode == 2, done.stderr
    # Warnings (e.g. a key set twice) may be logged; the error itself is one line.
    lines = [ln for ln in done.stderr.strip().splitlines() if " WARNING " not in ln]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mm2py: ")
    assert str(config) in lines[0] and key in lines[0]
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
    written = {t for t in topic_names(cluster_b) if unique in t}
    assert written == set(), f"a refused config wrote {written} to B"


def test_missing_file_and_yaml_typo(tmp_path: Path) -> None:
    missing = _run(tmp_path / "nope.properties")
    assert missing.returncode == 2 and "nope.properties" in missing.stderr

    typo = tmp_path / "mm2.yaml"
    typo.write_text("clusters:\n  A: {bootstrap.servers: 'x:1'}\nreplicaton.factor: 1\n")
    done = _run(typo)
    assert done.returncode == 2
    assert "replicaton.factor" in done.stderr and "replication.factor" in done.stderr
