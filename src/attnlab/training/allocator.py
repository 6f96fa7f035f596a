"""The C heap during training: glibc's malloc told to keep freed memory for the next step.

Every training step frees and reallocates the same few hundred MB of activations, gradients and
temporaries. With glibc's defaults, a freed block above the mmap threshold (at most 32 MiB, raised
dynamically) is unmapped, and free memory at the top of the heap beyond the trim threshold is returned
to the system: the next step maps those pages again, and the kernel zeroes each one on its first touch.
With glibc's settings, attnlab's `base` step of `scripts/bench_train.py` made 14,000-21,000 page faults
a step and its `small` step about 12,500; with `keep`, from none to a few thousand (docs/benchmarks.md,
the training step's "This round"). How many depends on glibc's dynamic mmap threshold.

`allocator=keep` (the default of `attnlab-train`, conf/train.yaml) raises the trim threshold to 2 GiB and
fixes the mmap threshold at glibc's 32 MiB maximum, so freed memory stays in the process and is reused;
blocks above 32 MiB (the output layer's gradient with a large vocabulary and width, say) are still mapped
and unmapped each time. The cost: the resident set stays near its peak instead of shrinking between steps.
`allocator=system` leaves glibc's settings alone. The setting lasts for the process (glibc cannot restore
its own: see `configure_allocator`); without glibc (macOS, musl) `keep` changes nothing and says so in the
log.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

MODES = ("keep", "system")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit systems


def check_mode(mode: object) -> str:
    """`mode` if it is one of `MODES`, else a ValueError saying what to use."""
    if mode not in MODES:
        raise ValueError(f"allocator={mode!r} is not an allocator setting: use keep (freed memory stays "
                         "in the process for the next step) or system (glibc's own settings)")  # fmt: skip
    return str(mode)


_set_here = False  # whether this process has set the options: glibc has no call that restores its own


def configure_allocator(mode: str) -> bool:
    """Apply `mode` (see the module docstring) to this process; True when glibc's options are in force
    in it afterwards.

    Once set, the options stay for the process: glibc cannot go back to its dynamic thresholds. So
    `system` after a `keep` in the same process (the jobs of an in-process sweep) returns True and warns
    that the run goes on with them.

    Raises:
        ValueError: `mode` is not one of `MODES`.
    """
    global _set_here
    if check_mode(mode) == "system":
        if _set_here:
            log.warning("allocator=system: an earlier run in this process set glibc's malloc options "
                        "(allocator=keep), and glibc cannot restore its own, so this run keeps them; "
                        "for glibc's settings run it in a process of its own (a sweep: "
                        "hydra/launcher=local)")  # fmt: skip
        return _set_here
    libc = glibc()
    if libc is None:
        log.info("allocator=keep: this C library is not glibc; its allocator is left as it is")
        return False
    applied = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    applied = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and applied
    if not applied:
        log.warning("allocator=keep: glibc refused the malloc options; its defaults stay")
    _set_here = _set_here or applied
    return _set_here


def in_force() -> bool:
    """Whether `keep`'s options have been set in this process (by `configure_allocator`): they then stay
    for its life, whatever a later call asks."""
    return _set_here


def glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None
