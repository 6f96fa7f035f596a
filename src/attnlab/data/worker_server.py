"""Imported only in the fork server that DataLoader workers start from (`attnlab.data.examples.worker_context`
preloads it there, before the main module).

A worker forked from the server runs the main module's top level again as `__mp_main__`, as `spawn` does;
when that module was run by name (`python -m attnlab.cli.train`) and the server preloaded it, `runpy` warns
that it is already in `sys.modules` ("this may result in unpredictable behaviour"), twice an epoch on the
run's stderr. The server preloads it so that workers start without importing its dependencies again;
running its top level again is the point of `__mp_main__`. The warning is silenced in the server, whose
filters its workers inherit, and nowhere else.

The server ignores SIGINT from here on, and its workers from their start: each worker is given the SIGINT
handler the server had before it began serving (Python's KeyboardInterrupt, had this not ignored it).
A terminal's Ctrl-C reaches every process of the foreground group, and a worker that got its
KeyboardInterrupt while starting (before `attnlab.data.examples.end_with` ignores SIGINT in it) would end
and leave the run, which stops at the end of its step (`Preemption`), without batches. The run's own
process keeps its handler, and so does any other process that imports this module (`_in_fork_server`).
"""

from __future__ import annotations

import signal
import sys
import warnings
from multiprocessing import forkserver


def _in_fork_server() -> bool:
    """Whether the fork server is importing this module as it preloads (`multiprocessing.forkserver.main`
    on the stack): any other process that imports it (a tool walking the package) keeps its warnings and
    its Ctrl-C."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not forkserver.main.__code__:
        frame = frame.f_back
    return frame is not None


if _in_fork_server():
    warnings.filterwarnings(
        "ignore", message=r"'[\w.]+' found in sys\.modules after import of package", category=RuntimeWarning
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
