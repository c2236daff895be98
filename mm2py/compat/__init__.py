"""MM2's semantics without I/O: wire formats, replication policies, filters, exact offset
translation, a flow's naming rules."""
