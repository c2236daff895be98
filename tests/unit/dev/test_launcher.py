"""Pure parts of the local cluster launcher."""

import pytest

from mm2py.dev.launcher import (
    BROKER_PORTS,
    PORT_OFFSET_VARIABLE,
    _cluster_id,
    _listed,
    all_ports,
)


def test_cluster_ids_never_look_like_an_option() -> None:
    # The storage tool parses "-t -abc" as a missing value; ids are drawn until safe.
    ids = [_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_reserved_port_ranges_are_read_as_the_kernel_writes_them() -> None:
    # /proc/sys/net/ipv4/ip_local_reserved_ports reads back as ranges.
    assert _listed(19093, "19092-19093,29092")
    assert _listed(29092, "19092-19093,29092")
    assert not _listed(29093, "19092-19093,29092")
    assert not _listed(19092, "")


def test_every_cluster_port_is_reserved_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_OFFSET_VARIABLE, "100")
    ports = all_ports()
    assert len(ports) == 2 * len(BROKER_PORTS)
    assert {39192, 39193, 61192, 61193} <= set(ports)
