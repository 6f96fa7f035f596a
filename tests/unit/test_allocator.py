"""allocator=keep: blocks the size of a training step's tensors come from the heap, which keeps them when
they are freed, instead of from mappings handed back to the system at every free."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnlab.training.allocator import check_mode, configure_allocator, glibc

HAS_MALLINFO2 = glibc() is not None and hasattr(glibc(), "mallinfo2")  # the probe's counters

# Ten 16 MB blocks (the size of a base step's larger activations) allocated, written and freed in a fresh
# process; glibc's own counters say where they lived: in mmapped regions (`hblkhd`) or the heap (`arena`).
PROBE = """
import ctypes, sys, torch
from attnlab.training.allocator import configure_allocator
FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
          "keepcost")  # struct mallinfo2
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
applied = configure_allocator(sys.argv[1])
heap_before = libc.mallinfo2().arena
blocks = [torch.empty(4 << 20).fill_(1.0) for _ in range(10)]
held = libc.mallinfo2()
del blocks
freed = libc.mallinfo2()
print(applied, held.hblkhd >> 20, (held.arena - heap_before) >> 20, (freed.arena - heap_before) >> 20)
"""


def where_blocks_live(mode: str) -> tuple[bool, int, int, int]:
    """(options applied, MB in mmapped regions while held, heap growth in MB while held, after freeing)."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    applied, mapped, heap_held, heap_freed = out.stdout.split()
    return applied == "True", int(mapped), int(heap_held), int(heap_freed)


@pytest.mark.skipif(not HAS_MALLINFO2, reason="glibc's malloc options and its mallinfo2 (glibc 2.33+)")
def test_keep_serves_step_sized_blocks_from_the_heap_and_keeps_them_after_free() -> None:
    applied, mapped, heap_held, heap_freed = where_blocks_live("system")
    assert not applied and mapped >= 150 and heap_held < 16  # glibc's defaults: each block its own mapping
    applied, mapped, heap_held, heap_freed = where_blocks_live("keep")
    assert applied and mapped < 16 and heap_held >= 150  # from the heap...
    assert heap_freed >= 150  # ...which keeps them for the next step instead of returning them


def test_an_unknown_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="allocator='tcmalloc' is not an allocator setting: use keep"):
        configure_allocator("tcmalloc")
    assert check_mode("system") == "system"


@pytest.mark.skipif(glibc() is None, reason="the malloc options are glibc's")
def test_system_after_keep_in_one_process_reports_the_options_still_set_and_warns() -> None:
    """glibc cannot restore its own thresholds: a `system` run after a `keep` one in the same process (the
    jobs of an in-process sweep) is told the options are in force, with a warning, and never records
    glibc's settings it does not have."""
    code = (
        "import logging; logging.basicConfig(); "
        "from attnlab.training.allocator import configure_allocator as c; "
        "print(c('system'), c('keep'), c('system'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
    assert "allocator=system: an earlier run in this process set glibc's malloc options" in out.stderr
    assert "hydra/launcher=local" in out.stderr


def test_keep_without_glibc_changes_nothing_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a C library other than glibc (macOS, musl) `keep` sets nothing, says so, and the run records the
    options as not in force."""
    from attnlab.training import allocator

    monkeypatch.setattr(allocator, "_set_here", False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert glibc() is None
    with caplog.at_level("INFO", logger=allocator.__name__):
        assert configure_allocator("keep") is False
        assert configure_allocator("system") is False
    assert "allocator=keep: this C library is not glibc; its allocator is left as it is" in caplog.text
    assert "an earlier run in this process" not in caplog.text and not allocator.in_force()
