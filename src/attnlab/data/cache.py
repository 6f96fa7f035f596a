"""The on-disk cache: where it lives, cache keys, an inter-process lock and atomic writes (torch-free).

Everything the data pipeline derives from a corpus (downloaded files, trained tokenizers, encoded
splits) is built once and reused. Three rules keep that safe when several processes share one cache
(DDP ranks, DataLoader workers, two experiments started at once):

* A cache entry is named by a :func:`fingerprint` of everything it depends on, so a changed input
  gives a new entry rather than a stale hit.
* Only one process builds an entry: builders hold a :class:`FileLock` (``fcntl.flock``, so the lock
  is released by the kernel when its holder dies, and a crashed builder never blocks the next one).
  The same lock, recording its holder, keeps a second run out of a run directory (its `.lock`,
  `attnlab.runs.layout.RUN_LOCK`).
* Nothing half-written is ever visible under an entry's final name: files are written with
  :func:`atomic_write_bytes`, directories with :func:`building`, both rename into place. A builder's
  temporary directory is ``.<name>.building-<pid>`` beside the entry (`attnlab.io.temporary_name`);
  those of builders that died are removed by the next builder.

POSIX only (``fcntl``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnlab.io import FileLock, atomic_write_bytes, fsync_directory, left_temporaries, temporary_name

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
RACY_SECONDS = 1.0  # a file changed this recently is hashed again next time (`remembered_sha256`)
FILE_HASHES = "file-hashes"  # the cache root's directory of remembered file digests (`remembered_sha256`)
BUILDING = "building"  # the tag of a cache directory's temporary: `.<name>.building-<pid>`


def default_cache_dir() -> Path:
    """The cache root: ``$ATTNLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``."""
    explicit = os.environ.get("ATTNLAB_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "attnlab"
    return Path.home() / ".cache" / "attnlab"


def file_sha256(path: Path) -> str:
    """The full hex SHA-256 of the file at `path`, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def remembered_sha256(path: Path, memo: Path | None) -> str:
    """`file_sha256(path)`, remembered in directory `memo` (when given) under the file's identity: its
    resolved path, device, inode, size and modification and change times in nanoseconds. Writing to the
    file changes its change time (which no user call can set back), so a remembered digest is used only
    for the unchanged file, and opening a prepared 1.5 GB corpus does not read the corpus again. A
    remembered entry that is not a hex digest is ignored and rewritten. As in git's index, a digest is
    remembered only when the file did not change while it was read and its change time lies
    `RACY_SECONDS` before the reading started (a write within the file system's time granularity of
    the reading could otherwise keep the same identity)."""
    if memo is None:
        return file_sha256(path)
    resolved = path.resolve()
    stat = resolved.stat()
    fields = (resolved, stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    identity = "\0".join(map(str, fields))
    entry = memo / hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()
    try:
        remembered = entry.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        remembered = ""
    if len(remembered) == 64 and all(c in "0123456789abcdef" for c in remembered):
        return remembered
    started = time.time_ns()
    digest = file_sha256(resolved)
    after = resolved.stat()
    settled = started - stat.st_ctime_ns > RACY_SECONDS * 1e9
    if not settled or (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != fields[3:]:
        return digest
    try:
        memo.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(entry, digest.encode("ascii"))
    except OSError as exc:  # a read-only cache still works, hashing every time
        log.debug("cannot remember the SHA-256 of %s in %s: %s", path, memo, exc)
    return digest


def _json_default(value: Any, memo: Path | None = None) -> Any:
    if isinstance(value, Path):
        return {"__file_sha256__": remembered_sha256(value, memo)}
    raise TypeError(
        f"fingerprint() cannot encode {value!r} of type {type(value).__name__}: "
        "use Path, dict, list, tuple, str, int, float, bool or None"
    )


def fingerprint(*parts: object, memo: Path | None = None) -> str:
    """A stable cache key: the first 16 hex characters of a SHA-256 over `parts`.

    Each part contributes, in order and length-prefixed (so parts never run into each other):

    * a ``Path``: the SHA-256 of the file's *content* (read in chunks). The path itself does not
      count, so the same bytes at another path give the same key, and edited bytes a new one.
    * anything else: its canonical JSON (sorted keys, no whitespace, UTF-8). Supported are dict
      (with str keys), list, tuple, str, int, float, bool and None, nested freely; a ``Path``
      nested inside them is replaced by its content hash as above.

    The key depends on values only, never on the process, the Python version or dict order. Tuples and
    lists encode alike (both JSON arrays, as a Hydra list and a dataclass tuple should), whereas
    ``1`` and ``1.0`` and ``"1"`` differ.

    Args:
        *parts: What the cached artefact depends on: input files, settings, a format version.
        memo: A directory where file digests are remembered (`remembered_sha256`): an unchanged file is
            then hashed once, not on every call.

    Returns:
        16 lowercase hex characters.

    Raises:
        TypeError: A part (or a nested value) has an unsupported type such as a set.
        OSError: A ``Path`` part cannot be read (e.g. ``FileNotFoundError``).
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            encoded = b"file:" + remembered_sha256(part, memo).encode("ascii")
        else:
            text = json.dumps(
                part, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                default=functools.partial(_json_default, memo=memo),
            )  # fmt: skip
            encoded = b"json:" + text.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "big"))
        digest.update(encoded)
    return digest.hexdigest()[:16]


def _remove_stale_builds(target: Path) -> None:
    """Delete temporary directories left beside `target` by builders that died (call under the lock)."""
    for entry in left_temporaries(target, BUILDING):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _fsync_files(directory: Path) -> None:
    """Flush every file directly in `directory`, and the directory, to disk: what a builder wrote is
    durable before its rename makes it visible (a crash never leaves a renamed directory of empty files)."""
    for entry in directory.iterdir():
        if entry.is_file() and not entry.is_symlink():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_directory(directory)


def _lock_of(target: Path, timeout: float | None) -> FileLock:
    """The lock ``<target>.lock``; when another process holds it, it says so (once) before waiting: a
    build of a large corpus may take minutes, and the waiting process would print nothing meanwhile."""
    path = target.with_name(target.name + ".lock")
    notice = functools.partial(
        log.info, "another process is building %s (it holds %s): waiting for it", target, path
    )
    return FileLock(path, timeout=timeout, waiting=notice)


@contextmanager
def building(
    target: Path, *, timeout: float | None = None, damaged: Callable[[Path], str | None] | None = None
) -> Iterator[Path | None]:
    """Build the cache directory `target` once, atomically, whichever process gets there first.

    Holds the lock ``<target>.lock`` for the whole block. If `target` is a directory once the lock is held
    (built earlier, or by another process while this one waited), yields None and touches nothing —
    unless `damaged(target)` gives a reason: then `target` is removed, with a warning naming it and the
    reason, and built again. A file or a link to nothing at `target` is never a build: it is removed the
    same way (the file or the link itself, not what a link points to).
    Otherwise yields a fresh, empty temporary directory beside `target` (same filesystem) for the
    caller to fill; on normal exit its files are flushed to disk and it is renamed to `target`, on an
    exception it is deleted and
    `target` stays absent. So a reader never sees a half-built `target`::

        with building(target) as tmp:
            if tmp is not None:
                fill(tmp)
        use(target)

    Temporary directories of builders that were killed mid-build are removed by the next builder.

    Args:
        target: The directory to build.
        timeout: Seconds to wait for the lock; None waits forever.
        damaged: Checks an existing `target` (under the lock): why it cannot be used, or None.

    Yields:
        The temporary directory to fill, or None when `target` already exists (and is not damaged).

    Raises:
        TimeoutError: The lock was not obtained within `timeout` seconds.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock_of(target, timeout):
        present = target.exists() or target.is_symlink()  # (a dangling link is in the way too)
        reason = damaged(target) if damaged is not None and present else None
        if present and reason is None and not target.is_dir():  # a file, or a link to none: never a build
            reason = "it is not a directory (a file or a broken link)"
        if present and reason is None:
            yield None
            return
        _remove_stale_builds(target)
        tmp = temporary_name(target, BUILDING)
        if reason is not None:
            log.warning("%s; building it again", reason if str(target) in reason else f"{target}: {reason}")
            os.rename(target, tmp)  # out of readers' way at once; deleted as a stale build if this fails
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:  # a file or a link where the directory belongs
                tmp.unlink()
        tmp.mkdir()
        try:
            yield tmp
            _fsync_files(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_directory(target.parent)
