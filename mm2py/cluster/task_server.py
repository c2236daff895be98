"""What the node's task server imports first, before the copy path (`TASK_PRELOAD` in
mm2py.cluster.task); nothing else imports it.

The task server is multiprocessing's `forkserver`: a process of the node's that forks
its task processes. Importing this module makes the server ignore SIGINT and SIGTERM,
as the task processes do. A signal to the node's whole process group (Ctrl-C in its
terminal) or to every process of its service (systemd's stop) must not end the server
while the node stops its tasks: a task process is killed when its parent, the server,
exits (PR_SET_PDEATHSIG), and would lose the flush and the progress it records on
its way out. The server ends when the node does: it watches a pipe from the node.

The forked task processes inherit both: they ignore the two signals from their first
instruction, before `spare_main` runs.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
