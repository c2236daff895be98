"""What a node tells Prometheus about its place in each flow's cluster.

    mm2py_node_tasks{source,target,node}              tasks of the flow this node runs now
    mm2py_node_rebalances_total{source,target,node}   times tasks came to or left this node
    mm2py_node_info{node,host,pid}                    1; who the node is

`node` is the node's REST address (host:port), as `mm2py status` and GET /cluster
name it; a dashboard sums the other metrics over nodes by Prometheus's target label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mm2py.cluster.member import MemberPart, NodeId


class NodeCollector(Collector):
    """Reads the daemon's member parts at scrape time."""

    def __init__(self, node: NodeId, members: Callable[[], Sequence[MemberPart]]) -> None:
        self._node = node
        self._members = members

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["source", "target", "node"]
        tasks = GaugeMetricFamily(
            "mm2py_node_tasks", "Tasks of the flow this node runs now.", labels=labels
        )
        moves = CounterMetricFamily(
            "mm2py_node_rebalances",
            "Times the flow's group gave tasks to this node or took tasks from it.",
            labels=labels,
        )
        for member in self._members():
            values = [member.flow.source, member.flow.target, self._node.rest]
            tasks.add_metric(values, len(member.owned))
            moves.add_metric(values, member.rebalances)
        info = GaugeMetricFamily(
            "mm2py_node_info", "1; this mm2py node.", labels=["node", "host", "pid"]
        )
        info.add_metric([self._node.rest, self._node.host, str(self._node.pid)], 1)
        yield from (tasks, moves, info)
