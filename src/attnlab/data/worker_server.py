"""Imported only in the fork server that DataLoader workers start from (`attnlab.data.examples.worker_context`
preloads it there, before the main module).

A worker forked from the server runs the main module's top level again as `__mp_main__`, as `spawn` does;
when that module was run by name (`python -m attnlab.cli.train`) and the server preloaded it, `runpy` warns
that it is already in `sys.modules` ("this may result in unpredictable behaviour"), twice an epoch on the
run's stderr. The server preloads it so that workers start without importing its dependencies again;
running its top level again is the point of `__mp_main__`. The warning is silenced in the server, whose
filters its workers inherit, and nowhere else.
"""

from __future__ import annotations

import warnings

warnings.filterwarnings(
    "ignore", message=r"'[\w.]+' found in sys\.modules after import of package", category=RuntimeWarning
)
