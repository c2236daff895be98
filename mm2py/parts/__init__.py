"""The parts of a flow that the daemon runs: source, checkpoint, heartbeat, config/ACL sync."""
