"""The benchmark's replication latency: a record read on the target is paired with the
same record read on the source, by partition and order."""

from bench.replication import replication_only


def test_pairs_each_partitions_records_in_order() -> None:
    on_source = [(0, 100, 1000.0), (1, 101, 1001.0), (0, 102, 1002.0), (1, 103, 1010.0)]
    on_target = [(1, 101, 1004.0), (0, 100, 1003.0), (0, 102, 1006.5), (1, 103, 1011.0)]
    assert replication_only(on_source, on_target) == [
        (101, 3.0),
        (100, 3.0),
        (102, 4.5),
        (103, 1.0),
    ]


def test_records_not_read_on_the_source_are_left_out() -> None:
    on_source = [(0, 100, 1000.0)]
    on_target = [(0, 100, 1002.0), (0, 101, 1003.0), (2, 102, 1004.0)]
    assert replication_only(on_source, on_target) == [(100, 2.0)]
