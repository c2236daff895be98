"""MM2 keys that mm2py accepts but does not act on.

Every key mm2py accepts is honoured or said to be ignored: the keys below are
logged once per load, in one line naming the file and every place the key is
set (``offset.lag.max, A->B.offset.lag.max``), never a value.

The exactly-once keys are honoured (mm2py.config.exactly_once):
``<target>.exactly.once.source.support = enabled`` copies the flows into that cluster
exactly-once, ``exactly.once.support = required`` makes a flow that cannot have it a
configuration error, ``transaction.boundary(.interval.ms)`` sets how often a task
commits; only ``transaction.boundary = connector`` is refused, as Connect refuses it
for MM2's connectors.
"""

from __future__ import annotations

# Keys whose meaning mm2py does not implement (yet), said at WARNING level.
NOT_HONOURED = {
    "offset.lag.max": (
        "not needed: mm2py writes an offset sync wherever source and target offsets stop"
        " advancing together, so translation is exact whatever the lag"
    ),
}
# Connect worker keys that only MM2's own worker uses (its internal topics, its offset
# flushes, its plug-in loading); kept in files shared with MM2 (configs/mm2.properties),
# at the top or under the target cluster's prefix (MirrorMakerConfig.workerConfig), so
# said at INFO level: nothing the user asked for is lost.
_OFFSET_FLUSH = (
    "ignored: mm2py records progress every second, or in each transaction exactly-once"
    " (Connect's offset flush)"
)
_PLUGINS = "ignored: mm2py loads no Connect plug-ins"
MM2_ONLY = {
    "config.storage.replication.factor": "ignored: mm2py has no Connect config topic (MM2's)",
    "status.storage.replication.factor": "ignored: mm2py has no Connect status topic (MM2's)",
    "offset.flush.interval.ms": _OFFSET_FLUSH,
    "offset.flush.timeout.ms": _OFFSET_FLUSH,
    "plugin.discovery": _PLUGINS,
    "plugin.path": _PLUGINS,
}
