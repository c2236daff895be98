"""mm2py: a cross-cluster Apache Kafka replicator compatible with MirrorMaker 2."""

__version__ = "0.1.0"
