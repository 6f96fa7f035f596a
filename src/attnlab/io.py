"""Writing files so that a reader never sees half of one, an inter-process lock (torch-free, POSIX), and
reading past the byte-order mark an editor saved before UTF-8 text (`without_bom`).

Every file attnlab writes that another process or a later run reads (checkpoints, run records, the data
cache) goes through here: a temporary file beside the target, flushed and fsynced, renamed over it.

`without_bom` is here, in the lowest layer, rather than among the text helpers of `attnlab.data.text`:
its readers are in every layer (data files, standard input, a run's files), and importing
`attnlab.data.text` imports the data package (numpy, the tokenizer) into commands that read run files only.
"""

from __future__ import annotations

import codecs
import errno
import fcntl
import logging
import os
import re
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import IO, Any, AnyStr

_POLL_S = 0.05  # seconds between tries of a lock held by another process
_LOOK_S = 1.0  # seconds a lock that only looks hold (`held_elsewhere`) is tried every `_LOOK_POLL_S` past a
# timeout (a look holds it for an instant); then every `_POLL_S`, for as long as only looks hold it
_LOOK_POLL_S = 0.001

log = logging.getLogger(__name__)


class WriteError(OSError):
    """Files could not be written (a full disk, no permission); its message, one line, names the file,
    what is unchanged and the fix (`write_fix`), and is told without a traceback. `str()` is the message
    alone, without OSError's `[Errno 28] ` before it."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def error_reason(exc: BaseException) -> str:
    """The first line of `exc`'s text, for a one-line message that names why something failed (the name of
    its type where it has no text)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_fix(failure: OSError) -> str:
    """The first step of the fix for a write that failed with `failure`: free disk space for a full disk
    or quota, another file system for a file too large for this one, else make the place writable."""
    if failure.errno in (errno.ENOSPC, errno.EDQUOT):
        return "Free disk space"
    if failure.errno == errno.EFBIG:
        return "Write to a file system that holds files this large"
    return "Make it writable"


class FileLock:
    """An exclusive inter-process lock held on `path` with ``fcntl.flock``.

    The lock file is created (with its parent directories) and left in place when released; only its
    holder deletes it (`release(delete=True)`), and a process that locked a file no longer at `path`
    (deleted or replaced after it opened it) drops it and locks the file now there, so two processes never
    hold two files of the same name. The kernel drops the lock when the holder closes it or dies. Not
    reentrant: acquiring a held lock again from another ``FileLock`` in the same process waits like any
    other process would (`held_here` says whether this process holds a path's lock).

    With `record_holder`, the holder writes ``<pid> <host>`` into the file while it holds the lock (and
    empties it on release), so a process that cannot take the lock can say who holds it (`holder()`).
    A file left with the pid of a process that died is not held: the kernel freed its lock, and the
    next process takes it over.

    A forked child (a DataLoader worker) does not hold its parent's locks: an ``flock`` belongs to the
    open file, which a fork shares, so the child closes its inherited descriptors at once
    (`_close_locks_in_child`); a lock is freed when its holder dies, even while its workers still run.
    A ``FileLock`` dropped unreleased stays held until the process ends (it is not released when garbage
    collected), and a child still does not hold it.

    Example::

        with FileLock(cache / ".lock", timeout=600):
            ...  # only one process at a time runs this

    Args:
        path: The lock file.
        timeout: Seconds to wait for the lock; None waits forever, 0 tries once. A lock that only
            `held_elsewhere` looks hold when the time is up (each for an instant) is tried on for as long
            as only looks hold it, so a look is never taken for a holder: a look paused while it holds the
            lock (its process stopped, a slow NFS server) delays the lock but does not refuse it; past
            `_LOOK_S` a warning says which process holds it and what to do (`_tell_looks_wait`). A holder
            found then refuses it at once.
        record_holder: Write this process's pid and host into the lock file while holding it.
        waiting: Called once, before waiting, when another process holds the lock (to say why nothing
            happens meanwhile: a build or download can take minutes); not called when the lock is free or
            only a `held_elsewhere` look holds it.
    """

    def __init__(
        self,
        path: Path,
        *,
        timeout: float | None = None,
        record_holder: bool = False,
        waiting: Callable[[], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.record_holder = record_holder
        self.waiting = waiting
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, waiting at most `timeout` seconds.

        Raises:
            RuntimeError: This object already holds the lock.
            TimeoutError: The lock stayed taken for `timeout` seconds; the message names the lock file.
        """
        if self._fd is not None:
            raise RuntimeError(f"FileLock({self.path}) is already held by this object")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        notice = self.waiting is not None and self.timeout != 0
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not (notice and _try_lock(fd)):
                    if notice and not _looked_at(fd):  # (a look holds it for an instant: no wait to tell)
                        self.waiting()
                    notice = False
                    if deadline is None:
                        fcntl.flock(fd, fcntl.LOCK_EX)
                    else:
                        self._wait(fd, deadline)
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its holder deleted it meanwhile: the lock is the file now at the path
        self._fd = fd
        _HELD.add(self)
        if self.record_holder:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)

    def holder(self) -> str:
        """Who holds the lock as its holder recorded it (`pid 12 on host x`), or `another process`; a holder
        of this host that is stopped (Ctrl-Z, SIGSTOP), which would hold it until resumed, is said to be, with
        the fix (`pid 12 on host x (stopped: resume it ... or end it ...)`)."""
        recorded = self.recorded_holder()
        if recorded is None:
            return "another process"
        pid, host = recorded
        if host != socket.gethostname() or not process_stopped(pid):
            return f"pid {pid} on host {host}"
        return f"pid {pid} on host {host} (stopped: {_resume_or_end(pid)})"

    def recorded_holder(self) -> tuple[int, str] | None:
        """The `(pid, host)` a holder with `record_holder` wrote into the file, or None (an empty file: no
        one holds it, or its holder did not record itself). A record left by a holder that died stays."""
        with suppress(OSError, ValueError):
            pid, host = self.path.read_text().split()
            return int(pid), host
        return None

    def holder_died(self) -> int | None:
        """The pid of a holder that recorded itself on this host and is gone (killed, or crashed without
        releasing the lock), or None: the record names no one, another host, or a live process. Reads the
        file only (never takes the lock); a pid reused by another process reads as alive."""
        recorded = self.recorded_holder()
        return recorded[0] if recorded is not None and process_gone(*recorded) else None

    def _wait(self, fd: int, deadline: float) -> None:
        """Try the lock until `deadline`, and past it for as long as only looks hold it (`_looked_at`); a
        look that holds it past `_LOOK_S` is told once (`_tell_looks_wait`), as it would wait silently for
        as long as the look's process stays stopped."""
        looks_since: float | None = None
        told = False
        while not _try_lock(fd):
            remaining = deadline - time.monotonic()
            if remaining <= 0 and _looked_at(fd):
                looks_since = looks_since or time.monotonic()
                remaining = _LOOK_POLL_S if time.monotonic() - looks_since < _LOOK_S else _POLL_S
                if remaining == _POLL_S and not told:
                    told = True
                    _tell_looks_wait(self.path, fd)
            if remaining <= 0:
                raise TimeoutError(
                    f"could not lock {self.path} within {self.timeout} s: "
                    f"{self.holder() if self.record_holder else 'another process'} holds it. "
                    "Wait for it to finish, or stop it if it is stuck (the lock is freed when it exits)."
                )
            time.sleep(min(_POLL_S, remaining))

    def release(self, *, delete: bool = False) -> None:
        """Drop the lock (a no-op when not held); with `delete`, delete the lock file first (while still
        holding it: a process waiting on the deleted file then takes the one created after it)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.discard(self)
        try:
            if delete:
                with suppress(FileNotFoundError):
                    self.path.unlink()
            elif self.record_holder:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _tell_looks_wait(path: Path, fd: int) -> None:
    """Log once, as a warning, that a `FileLock` on `path` (open as `fd`) waits past `_LOOK_S` for
    `held_elsewhere` looks, which hold it for an instant unless their process is stopped (Ctrl-Z, SIGSTOP)
    or hung: which processes hold it (`flock_holders`), their command lines and whether they are stopped
    (`process_description`), and what to do."""
    pids = flock_holders(fd)
    stopped = [pid for pid in pids if process_stopped(pid)]
    who = ", ".join(process_description(pid) for pid in pids) or "another process"
    fix = _resume_or_end(*stopped) if stopped else "if it hangs (a slow network file system), end it"
    log.warning("waiting for the lock %s: %s has held it for %.0f s to look at it (a look takes an instant); "
                "%s, and this command goes on", path, who, _LOOK_S, fix)  # fmt: skip


def _resume_or_end(*pids: int) -> str:
    """What to do about the stopped processes `pids` holding a lock: resume them or end them."""
    shown = " ".join(map(str, pids))
    return f"resume it (fg in its shell, or kill -CONT {shown}) or end it (kill {shown})"


def flock_holders(fd: int) -> list[int]:
    """The pids of the other processes holding an ``flock`` on the file open as `fd`, as Linux lists them
    in ``/proc/locks`` (the process that took each lock); [] where there is no such list."""
    held = os.fstat(fd)
    file_id = f"{os.major(held.st_dev):02x}:{os.minor(held.st_dev):02x}:{held.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            rows = [line.split() for line in locks]
    except OSError:
        return []
    pids = {int(row[4]) for row in rows if len(row) > 5 and row[1] == "FLOCK" and row[5] == file_id
            and row[4].isdigit()}  # fmt: skip
    return sorted(pids - {os.getpid()})


def process_stopped(pid: int) -> bool:
    """Whether process `pid` of this host is stopped (Ctrl-Z, SIGSTOP, a debugger), as Linux says in
    ``/proc/<pid>/stat`` (its state `T` or `t`); False where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat_file:
            return stat_file.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def process_description(pid: int) -> str:
    """`pid 12 (<its command line, shortened>, stopped)`, as far as ``/proc`` says (`pid 12` alone where it
    does not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = " ".join(cmdline.read().decode("utf-8", "replace").replace("\0", " ").split())
    except OSError:
        command = ""
    if len(command) > 80:
        command = command[:77] + "..."
    said = [part for part in (command, "stopped" if process_stopped(pid) else "") if part]
    return f"pid {pid} ({', '.join(said)})" if said else f"pid {pid}"


def process_gone(pid: int, host: str) -> bool:
    """Whether the process `pid` of host `host` is known to have ended: `host` is this one and no process
    has that pid (one of another host cannot be seen: False; a pid reused by another process reads as
    alive)."""
    if host != socket.gethostname() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by another user
        return False
    return False


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        found, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def held_here(path: Path) -> FileLock | None:
    """The `FileLock` on `path` this process holds (one its holder dropped unreleased too), or None."""
    wanted = Path(path).resolve()
    return next((lock for lock in list(_HELD) if lock.path.resolve() == wanted), None)


def held_elsewhere(path: Path) -> bool:
    """Whether another live process holds the `FileLock` on `path` (this process's own: False; no file: False,
    and none is made). Reads it by taking a shared lock without waiting and freeing it at once: a process
    that tries the lock in that instant finds it held shared only, and tries on for as long as it is
    (`FileLock`'s `timeout`: a look paused there, its process stopped, delays it but never refuses it);
    other processes looking at once do not take each other for its holder; and the file is opened for
    reading alone, where NFS takes an exclusive lock only on a file opened for writing (`flock(2)`)."""
    if held_here(path) is not None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        return not _try_lock(fd, shared=True)
    finally:
        os.close(fd)  # (frees the lock, if taken)


def _looked_at(fd: int) -> bool:
    """Whether the lock `fd` could not take is held shared only (a `held_elsewhere` look, for an instant),
    not by a holder: a shared lock is then free to take (and freed at once)."""
    if not _try_lock(fd, shared=True):
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _try_lock(fd: int, shared: bool = False) -> bool:
    """Take the ``flock`` of `fd` (exclusive, or `shared`) if no one holds it: whether it was taken."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# The locks this process holds, kept until released: one its holder dropped unreleased stays held (its
# descriptor open) until the process ends, so a forked child must still close it, and `held_here` finds it.
_HELD: set[FileLock] = set()


def _close_locks_in_child() -> None:
    """In a child made by ``fork``: close the descriptors of the parent's locks (without unlocking,
    which would free the parent's lock) and forget them, so the locks stay the parent's alone."""
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort: not every filesystem allows it)."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def written_in_place(path: str | Path) -> bool:
    """Whether `path` names something that is not a regular file (nor a directory): a character device
    such as ``/dev/null``, a FIFO, ``/dev/stdout`` on a pipe. Such a target is written directly; renaming
    a new regular file over it would replace the device or pipe itself."""
    try:
        mode = os.stat(path).st_mode  # follows symbolic links (and /dev/stdout's /proc link)
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def temporary_name(target: Path, tag: str) -> Path:
    """The hidden temporary `.<name>.<tag>-<pid>` beside `target` in which this process builds it."""
    return target.with_name(f".{target.name}.{tag}-{os.getpid()}")


def left_temporaries(target: Path, tag: str) -> list[Path]:
    """Every `temporary_name(target, tag)` of any process beside `target`: those a process killed while it
    wrote `target` left (and this process's own, if any)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{re.escape(tag)}-\d+")
    try:
        return [entry for entry in target.parent.iterdir() if pattern.fullmatch(entry.name)]
    except FileNotFoundError:
        return []


@contextmanager
def _temporary_beside(
    path: Path, encoding: str | None, tag: str | None = None
) -> Iterator[tuple[IO[Any], str]]:
    """A temporary file in `path`'s directory (created if needed), with the permission bits of the file
    at `path` (0o666 less the umask for a new one, as `open` gives): yields it and its name; flushed and
    fsynced on normal exit (it stays, for the caller to rename), removed on any error. Named
    `.<name>.<random>.tmp`, unique; with `tag`, `temporary_name(path, tag)`, once those that other
    processes left are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None  # a new file: 0o666 less the umask, as `open` gives
    if tag is None:
        tmp_name = str(path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp"))
    else:
        for stale in left_temporaries(path, tag):
            stale.unlink(missing_ok=True)
        tmp_name = str(temporary_name(path, tag))
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if tag is None else os.O_TRUNC)
    fd = os.open(tmp_name, flags, 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "w" if encoding else "wb", encoding=encoding) as f:
            yield f, tmp_name
            f.flush()
            os.fsync(f.fileno())
            if mode is not None:
                os.fchmod(f.fileno(), mode)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


@contextmanager
def atomic_writer(path: Path, *, encoding: str | None = None, tag: str | None = None) -> Iterator[IO[Any]]:
    """Stream a new file into place so that readers see either the old `path` or the whole new one.

    Yields a file opened on a temporary file in the same directory (created if needed): binary, or
    text in `encoding` when one is given. On normal exit it is flushed, fsynced and renamed over
    `path` with ``os.replace``; on any error (or a KeyboardInterrupt) the temporary file is removed and
    `path` is unchanged. The new file keeps the permission bits of the file it replaces (0o666 less the
    umask for a new one, as `open` gives); a symbolic link at `path` stays, its target is replaced. A
    process killed outright may leave the hidden ``.<name>.*.tmp`` behind, never a half-written `path`.

    With `tag` (for a file only one process writes at a time, such as a checkpoint), the temporary file
    is ``.<name>.<tag>-<pid>`` (`temporary_name`), and those left by killed processes are removed first.

    A `path` that exists and is not a regular file (a character device such as ``/dev/null``, a FIFO,
    ``/dev/stdout`` on a pipe) is written directly, without a temporary file or a rename, so the device
    or pipe stays what it is.
    """
    if written_in_place(path):
        with open(path, "w" if encoding else "wb", encoding=encoding) as direct:
            yield direct
        return
    path = Path(os.path.realpath(path))
    with _temporary_beside(path, encoding, tag) as (f, tmp_name):
        yield f
    try:
        os.replace(tmp_name, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_directory(path.parent)


def atomic_write_files(files: Mapping[Path, bytes]) -> None:
    """Write several files so that they change together: each is first written completely to a
    temporary file beside it (`atomic_writer`'s rules), and only when every one is written are they all
    renamed into place. A failed write (a full disk, a directory where a file goes) removes the temporary
    files and leaves every file as it was; the `OSError` names the file whose write failed (`filename`).
    Targets that are not regular files (devices, FIFOs) are written directly, after all regular files are
    written.
    """
    staged: list[tuple[str | None, Path, bytes]] = []
    try:
        for target, data in files.items():
            if written_in_place(target):
                staged.append((None, Path(target), data))
                continue
            path = Path(os.path.realpath(target))
            if path.is_dir():  # the rename would fail, after the files before it were replaced
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
            try:
                with _temporary_beside(path, None) as (f, tmp_name):
                    f.write(data)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = str(target)
                raise
            staged.append((tmp_name, path, data))
        for tmp_name, path, data in staged:
            if tmp_name is None:
                with open(path, "wb") as direct:
                    direct.write(data)
            else:
                os.replace(tmp_name, path)
    except BaseException:
        for tmp_name, _, _ in staged:
            if tmp_name is not None:
                with suppress(FileNotFoundError):
                    os.unlink(tmp_name)
        raise
    for directory in dict.fromkeys(path.parent for tmp_name, path, _ in staged if tmp_name is not None):
        fsync_directory(directory)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one
    (`atomic_writer`: a temporary file in the same directory, renamed over `path`; on any error it is
    removed and `path` is unchanged)."""
    with atomic_writer(path) as f:
        f.write(data)


def too_long_path(path: str | Path) -> str | None:
    """Why the file system would refuse `path` as too long (``ENAMETOOLONG``), or None: the first name on
    it (a directory's or the file's) longer than a name can be there (``NAME_MAX``: 255 bytes on ext4),
    shown shortened with its length in bytes and the limit; or the whole path, made absolute, longer than a
    path can be (``PATH_MAX``: 4096 bytes with the terminating NUL on Linux). The limits are those of the
    deepest directory on the path that exists (255 and 4096 where it cannot say). Nothing is created."""
    absolute = Path(os.path.abspath(path))
    existing = next((p for p in absolute.parents if os.path.isdir(p)), Path(absolute.anchor))
    name_max, path_max = (_path_limit(existing, name, default) for name, default in (
        ("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)))  # fmt: skip
    for name in absolute.parts[1:]:
        size = len(os.fsencode(name))
        if size > name_max:
            shown = name if len(name) <= 40 else f"{name[:20]}...{name[-12:]}"
            return f"its name {shown!r} is {size} bytes, over the {name_max} bytes a name can have there"
    size = len(os.fsencode(str(absolute)))
    if size >= path_max:
        return f"it is {size} bytes long as an absolute path, over the {path_max - 1} bytes a path can have"
    return None


def _path_limit(directory: Path, name: str, default: int) -> int:
    """`os.pathconf(directory, name)`, or `default` where the file system does not say."""
    try:
        limit = os.pathconf(directory, name)
    except (OSError, ValueError):
        return default
    return limit if limit > 0 else default


def make_writable_directory(directory: Path) -> None:
    """Create `directory` (with its parents) if it is missing, and check that a file can be written in it.

    Raises:
        OSError: It cannot be created (a file in its place, no permission) or written.
    """
    Path(directory).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
        pass


# What looking at a path that cannot exist fails with: a name the file system refuses as too long (where its
# real limit is below the one `os.pathconf` says: eCryptfs, some FUSE), a file where a directory is on the
# path, a loop of symbolic links; and a path that does not exist
_CANNOT_EXIST = (errno.ENOENT, errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP)


def path_exists(path: str | Path) -> bool:
    """Whether `path` exists (following symbolic links): False also for a path that cannot exist
    (`_CANNOT_EXIST`: a name too long for the file system, on which Python 3.11's `Path.exists` raises).
    Another error (no permission to look) is raised."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in _CANNOT_EXIST:
            return False
        raise
    except ValueError:  # (a NUL byte in it)
        return False
    return True


def missing_directories(directories: Iterable[Path]) -> set[Path]:
    """Each of `directories` and their parents that does not exist now (absolute, resolved): what
    `remove_empty_directories` may remove after a refused command. The parents are those of the path as
    written, as `mkdir(parents=True)` makes them: `a/../b` with `a` missing makes `a` too. One that cannot
    exist (`path_exists`: a name too long for the file system) is missing too."""
    resolved = (path.resolve() for directory in directories
                for path in (Path(directory).absolute(), *Path(directory).absolute().parents))  # fmt: skip
    return {path for path in resolved if not path_exists(path)}


def remove_empty_directories(directories: Iterable[Path]) -> None:
    """Remove each of `directories` that is empty, deepest first; one that holds anything (or is gone) is
    kept."""
    for path in sorted(directories, key=lambda p: len(p.parts), reverse=True):
        with suppress(OSError):  # not empty, or not made: kept
            path.rmdir()


@contextmanager
def removing_new_directories(directories: Iterable[Path]) -> Iterator[None]:
    """Run the block; when it raises, remove each of `directories` and their parents that was missing
    before it and is empty after it (deepest first): a refused command leaves no directory it made, and
    never removes one that existed before or that holds anything."""
    missing = missing_directories(directories)
    try:
        yield
    except BaseException:
        remove_empty_directories(missing)
        raise


def without_bom(data: AnyStr) -> AnyStr:
    """`data`, the first bytes read of UTF-8 text (a file, a stream), without the byte-order mark that an
    editor (Notepad, a spreadsheet) may have saved before the text: the mark is no part of the first line.
    Text already decoded (a stream without a byte buffer) loses the mark's character, U+FEFF.
    One mark at the very start only: pass a file's or a stream's first bytes, never a later block or line,
    where a U+FEFF (files joined with `cat`) is text, left to the reader.

    Cut off from the bytes, not by the "utf-8-sig" codec, so that the reader decodes the rest as "utf-8"
    and can say where a bad byte is: its error's offset counts from the text after the mark (the file's
    byte is `len(data) - len(without_bom(data))` further), and the line feeds before it are all there.
    Every attnlab reader that reads past the mark does so here: data files (`attnlab.data.corpora`),
    attnlab-translate's input, a run's JSON, CSV and saved lines (`attnlab.runs.layout`)."""
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    return data.removeprefix(codecs.BOM_UTF8)
