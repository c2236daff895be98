"""The replicator daemon: the supervisor, its parts, the REST API, metrics and status."""
