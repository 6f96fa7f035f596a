"""Multi30k (WMT16 multimodal task 1) files: checksummed download into the cache, or a local copy.

The files are the gzipped raw text of the GitHub repository ``multi30k/dataset`` at a pinned commit,
``data/task1/raw/{train,val,test_2016_flickr}.{de,en,fr}.gz``. They are stored gunzipped as
``{train,val,test2016}.{de,en,fr}`` and checked against SHA-256 digests carried in this module, so a
moved branch, a wrong mirror or a corrupted transfer is an error rather than a silently different corpus.

Two sources (:func:`multi30k_paths`):

* ``root=<dir>``: the files are read from a directory the user filled (offline machines, a shared
  copy); nothing touches the network, and the files must be byte-identical to the official ones.
* ``root=None``: the files live in ``<cache_dir>/multi30k/<commit[:12]>/``. Cached files are trusted
  only after their SHA-256 is checked again on every call (about 10 ms for all nine files, cheaper and
  more robust than a marker file: a truncated or edited cache file is noticed and fetched again).
  Missing files are downloaded under a lock on that directory, so concurrent processes fetch each file
  once, and each is written atomically after its checksum passed.

Torch-free: standard library only.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.client
import io
import logging
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab import __version__
from attnlab.data.cache import file_sha256
from attnlab.io import FileLock, atomic_write_bytes

logger = logging.getLogger(__name__)

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_BASE_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/data/task1/raw"
MULTI30K_LANGS = ("de", "en", "fr")
MULTI30K_SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
"""Stored split name -> upstream file stem."""

MULTI30K_SHA256: dict[str, str] = {
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test2016.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
}
"""SHA-256 of each gunzipped file at `MULTI30K_COMMIT`, by stored name."""

_LAYOUT = "train.de, train.en, val.de, ..., test2016.en (gunzipped, as in shared/data/multi30k/)"
_OFFLINE_FIX = (
    f"download the files yourself (the official layout is {MULTI30K_BASE_URL}/<split>.<lang>.gz with "
    "<split> in train, val, test_2016_flickr), gunzip them, rename test_2016_flickr to test2016, and set "
    f"data.root=<directory holding {_LAYOUT}>"
)


# The most a Multi30k file may take, gzipped as downloaded or gunzipped (the largest, train.fr, is 2.1 MB):
# a wrong mirror's payload, or a gzip bomb, is refused before it fills the memory.
MAX_FILE_BYTES = 32 << 20
# A transfer must be complete within this many times its per-read timeout (fetch_gzipped's default 60 s:
# 10 minutes for at most 32 MB).
TOTAL_TIMEOUTS = 10


class DataError(RuntimeError):
    """A corpus file is missing, unreachable or not the expected bytes; the message names it and the fix."""


def make_cache_dir(path: Path) -> None:
    """Create the cache directory `path` (and its parents) unless it exists.

    Raises:
        DataError: It cannot be made (a file in its place or on its path, no permission), naming it and
            the fix.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the cache directory {path} ({exc.strerror or exc}): set data.cache_dir (or "
            "$ATTNLAB_CACHE_DIR) to a writable directory"
        ) from None


def _download(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": f"attnlab/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = _read_capped(response, time.monotonic() + TOTAL_TIMEOUTS * timeout)
            if len(payload) <= MAX_FILE_BYTES and getattr(response, "length", None):
                # (read(n), unlike read(), returns what came when the connection drops early)
                raise http.client.IncompleteRead(payload, response.length)
        if len(payload) > MAX_FILE_BYTES:
            raise _too_large(url, "is")
        return payload
    except urllib.error.HTTPError as exc:
        reason = f"HTTP {exc.code} {exc.reason}"
        exc.close()
    except urllib.error.URLError as exc:
        reason = str(exc.reason)
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    reason = " ".join(reason.split())  # (urllib's reason for a redirect loop spans three lines)
    raise DataError(f"could not download {url} ({reason}). If this machine is offline, {_OFFLINE_FIX}.")


def _read_capped(response: Any, deadline: float) -> bytes:
    """The response's body, at most `MAX_FILE_BYTES` + 1 bytes of it, read by the piece as it comes, until
    `deadline` (`time.monotonic()`): the socket's timeout bounds each read, not a server sending a byte
    now and then.

    Raises:
        TimeoutError: The deadline passed.
    """
    pieces, size = [], 0
    while size <= MAX_FILE_BYTES:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the transfer was not complete after {TOTAL_TIMEOUTS} times the timeout")
        piece = response.read1(1 << 16)
        if not piece:
            break
        pieces.append(piece)
        size += len(piece)
    return b"".join(pieces)


def _too_large(url: str, what: str) -> DataError:
    return DataError(
        f"{url} {what} more than {MAX_FILE_BYTES >> 20} MB, and no Multi30k file is that large: the mirror "
        f"is wrong; nothing was written. Set data.base_url to a mirror of the official files, or "
        f"{_OFFLINE_FIX}."
    )


def fetch_gzipped(url: str, dest: Path, sha256: str, *, timeout: float = 60.0) -> Path:
    """Download the gzipped file `url`, check the SHA-256 of its decompressed bytes, write them to `dest`.

    `dest` is written atomically and only after the checksum passed: on any error no file (and no
    temporary file) is left at `dest`.

    Args:
        url: Address of a ``.gz`` file.
        dest: Where the decompressed bytes go; parent directories are created.
        sha256: Expected hex SHA-256 of the decompressed bytes.
        timeout: Seconds allowed for connecting and for each read; the whole transfer gets
            `TOTAL_TIMEOUTS` times as long.

    Returns:
        `dest`.

    Raises:
        DataError: The download failed (network error, HTTP error, timeout), the payload is not gzip,
            or the checksum differs. The message names the URL and how to supply the files offline.
    """
    compressed = _download(url, timeout)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(compressed)) as file:
            data = file.read(MAX_FILE_BYTES + 1)  # (at most that much of a gzip bomb is inflated)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{url} is not a valid gzip file ({exc}): the mirror is wrong or the download was corrupted; "
            f"nothing was written to {dest}. Retry, or {_OFFLINE_FIX}."
        ) from exc
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(url, "unpacks to")
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise DataError(
            f"SHA-256 checksum mismatch for {url}: expected {sha256}, got {actual}. The mirror is wrong "
            f"or its file is corrupt; nothing was written to {dest}. Retry later, or {_OFFLINE_FIX}."
        )
    atomic_write_bytes(dest, data)
    return dest


def _stored_names(langs: Sequence[str]) -> list[str]:
    """``<split>.<lang>`` for every split and every (validated, de-duplicated) language."""
    if isinstance(langs, str):
        raise DataError(f"langs={langs!r} must be a list of language codes such as ['de', 'en']")
    known = ", ".join(MULTI30K_LANGS)
    for lang in langs:
        if lang not in MULTI30K_LANGS:
            raise DataError(f"unknown Multi30k language {lang!r}: known languages are {known}")
    if not langs:
        raise DataError(f"langs is empty: name at least one Multi30k language ({known})")
    return [f"{split}.{lang}" for split in MULTI30K_SPLITS for lang in dict.fromkeys(langs)]


def _local_paths(names: list[str], root: Path) -> dict[str, Path]:
    paths = {name: root / name for name in names}
    missing = [name for name, path in paths.items() if not path.is_file()]
    if missing:
        raise DataError(
            f"data.root={root} lacks {', '.join(missing)}. It must hold the gunzipped Multi30k files "
            f"{_LAYOUT}; or unset data.root to download them into the cache."
        )
    for name, path in paths.items():
        actual = file_sha256(path)
        if actual != MULTI30K_SHA256[name]:
            raise DataError(
                f"SHA-256 checksum mismatch for {path}: expected {MULTI30K_SHA256[name]} (official "
                f"Multi30k at commit {MULTI30K_COMMIT[:12]}), got {actual}. Replace it with the official "
                "file, or load a modified copy through the `files` data source, which does not expect the "
                "official bytes."
            )
    return paths


def _intact(path: Path, name: str) -> bool:
    """Whether the cached file `path` exists with the official checksum of `name`."""
    if not path.is_file():
        return False
    if file_sha256(path) == MULTI30K_SHA256[name]:
        return True
    logger.warning("cached %s has the wrong SHA-256; it will be downloaded again", path)
    return False


def multi30k_paths(
    langs: Sequence[str],
    *,
    root: Path | None,
    cache_dir: Path,
    base_url: str = MULTI30K_BASE_URL,
) -> dict[str, Path]:
    """The verified Multi30k files of `langs` for every split, downloading missing ones into the cache.

    Args:
        langs: Language codes among `MULTI30K_LANGS`.
        root: A directory holding the gunzipped official files (``train.de``, ...). When given, the
            network is never touched.
        cache_dir: The cache root (see :func:`attnlab.data.cache.default_cache_dir`); files go to
            ``<cache_dir>/multi30k/<commit[:12]>/``. Unused when `root` is given.
        base_url: The folder holding ``<upstream split>.<lang>.gz`` (tests point it at a local server).

    Returns:
        ``{"train.de": path, "train.en": path, "val.de": ..., "test2016.en": ...}`` for every split in
        `MULTI30K_SPLITS` and every language, each file checked against `MULTI30K_SHA256`.

    Raises:
        DataError: An unknown language; a file missing from or modified in `root`; a download that
            failed or delivered other bytes.
    """
    names = _stored_names(langs)
    if root is not None:
        return _local_paths(names, Path(root).expanduser())
    directory = Path(cache_dir).expanduser() / "multi30k" / MULTI30K_COMMIT[:12]
    paths = {name: directory / name for name in names}
    todo = [name for name in names if not _intact(paths[name], name)]
    if not todo:
        return paths
    # Another process may be fetching the same files: wait for it, then fetch only what is still missing.
    make_cache_dir(directory)
    lock = directory / ".lock"
    waiting = "another process is downloading into %s (it holds %s): waiting for it"
    notice = functools.partial(logger.info, waiting, directory, lock)
    with FileLock(lock, waiting=notice):
        for name in todo:
            if paths[name].is_file() and file_sha256(paths[name]) == MULTI30K_SHA256[name]:
                continue
            split, lang = name.split(".")
            url = f"{base_url.rstrip('/')}/{MULTI30K_SPLITS[split]}.{lang}.gz"
            logger.info("downloading %s -> %s", url, paths[name])
            fetch_gzipped(url, paths[name], MULTI30K_SHA256[name])
    return paths
