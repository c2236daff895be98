"""Spark bulk backfill: copy a flow's history in offset ranges, then hand over to the daemon.

- `plan`: pure planning (time bounds, offset ranges, their order, progress lines);
- `copier`: the copy of one range, run in a Spark task with confluent-kafka;
- `job`: the driver (reads the clusters, runs the ranges, records progress);
- `submit`: the script for `spark-submit`.
"""
