"""Pure parts of the local cluster launcher."""

from mm2py.dev.launcher import _cluster_id


def test_cluster_ids_never_look_like_an_option() -> None:
    # The storage tool parses "-t -abc" as a missing value; ids are drawn until safe.
    ids = [_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
