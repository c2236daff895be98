"""What the daemon and the backfill share to copy records: progress, offset syncs,
remote topics, the copy loop."""
