"""Multi30k download and the cache helpers, against a real HTTP server on loopback (no internet)."""

from __future__ import annotations

import contextlib
import gc
import gzip
import logging
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from attnlab.data import cache, download
from attnlab.data.cache import building, file_sha256, fingerprint
from attnlab.data.download import (
    MULTI30K_COMMIT,
    MULTI30K_SHA256,
    DataError,
    fetch_gzipped,
    multi30k_paths,
)
from attnlab.io import FileLock, atomic_write_bytes, held_elsewhere, process_stopped
from helpers import Mirror, serve_mirror, upstream_path

LANGS = ("de", "en")
NAMES = [f"{split}.{lang}" for split in ("train", "val", "test2016") for lang in LANGS]


@pytest.fixture(scope="module")
def gzipped(shared_data: Path) -> dict[str, bytes]:
    """Gzipped copies of the shared de/en files (level 1: the test is about transfer, not size)."""
    return {name: gzip.compress((shared_data / "multi30k" / name).read_bytes(), 1) for name in NAMES}


@pytest.fixture
def mirror(tmp_path: Path, gzipped: dict[str, bytes]) -> Iterator[Mirror]:
    with serve_mirror(tmp_path / "www", gzipped) as served:
        yield served


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cache_files(cache_dir: Path) -> set[str]:
    """The names in the Multi30k cache directory (empty when it does not exist)."""
    directory = cache_dir / "multi30k" / MULTI30K_COMMIT[:12]
    return set(os.listdir(directory)) if directory.is_dir() else set()


# --- download ------------------------------------------------------------------------------------------


def test_download_once_then_reuse_then_refetch_only_what_is_missing(
    mirror: Mirror, shared_data: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    paths = multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url)

    assert list(paths) == NAMES
    for name, path in paths.items():
        assert path == cache / "multi30k" / MULTI30K_COMMIT[:12] / name
        assert path.read_bytes() == (shared_data / "multi30k" / name).read_bytes()
    assert mirror.counts == Counter({upstream_path(name): 1 for name in NAMES})
    assert cache_files(cache) == {*NAMES, ".lock"}

    assert multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url) == paths
    assert sum(mirror.counts.values()) == len(NAMES)

    paths["val.en"].unlink()
    multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url)
    assert paths["val.en"].read_bytes() == (shared_data / "multi30k" / "val.en").read_bytes()
    assert mirror.counts == Counter({upstream_path(n): 2 if n == "val.en" else 1 for n in NAMES})


def test_a_download_waiting_for_another_process_says_so_then_fetches_what_is_missing(
    mirror: Mirror, shared_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process waiting for another's download of the same files (a DDP rank, a second job) printed
    nothing for as long as the download took."""
    cache = tmp_path / "cache"
    directory = cache / "multi30k" / MULTI30K_COMMIT[:12]
    caplog.set_level("INFO", logger="attnlab.data.download")
    got: list[dict[str, Path]] = []
    with FileLock(directory / ".lock"):  # another process downloading
        waiter = threading.Thread(
            target=lambda: got.append(
                multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url)
            )
        )
        waiter.start()
        deadline = time.monotonic() + 10
        while "another process is downloading" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not got and not mirror.counts  # still waiting, nothing fetched
        for name in ("train.de", "train.en"):  # what the other process fetched meanwhile
            atomic_write_bytes(directory / name, (shared_data / "multi30k" / name).read_bytes())
    waiter.join(60)
    assert [path.read_bytes() for path in got[0].values()] == [
        (shared_data / "multi30k" / name).read_bytes() for name in NAMES
    ]
    assert mirror.counts == Counter({upstream_path(name): 1 for name in NAMES if name[:5] != "train"})
    notices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("another process")]
    assert notices == [
        f"another process is downloading into {directory} (it holds {directory / '.lock'}): waiting for it"
    ]


def test_cached_file_with_wrong_bytes_is_fetched_again(
    mirror: Mirror, shared_data: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    paths = multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url)
    paths["test2016.de"].write_text("edited\n", encoding="utf-8")
    os.link(paths["test2016.de"], tmp_path / "linked")  # another name of the cached file's bytes
    multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url)
    assert paths["test2016.de"].read_bytes() == (shared_data / "multi30k" / "test2016.de").read_bytes()
    # written atomically: a new file renamed over the old one, whose bytes were not written into
    assert (tmp_path / "linked").read_text(encoding="utf-8") == "edited\n"
    assert mirror.counts[upstream_path("test2016.de")] == 2


def test_a_base_url_ending_in_a_slash_names_the_same_files(mirror: Mirror, tmp_path: Path) -> None:
    multi30k_paths(["de"], root=None, cache_dir=tmp_path, base_url=mirror.base_url + "/")
    assert mirror.counts == Counter(
        {upstream_path(f"{split}.de"): 1 for split in ("train", "val", "test2016")}
    )


def test_multi30k_data_reads_each_split_from_its_source_and_target_files(shared_data: Path) -> None:
    from attnlab.data.corpora import Multi30kData

    root = (shared_data / "multi30k").resolve()
    spec = Multi30kData(src_lang="fr", tgt_lang="de", root=str(root))
    splits = ("train", "val", "test2016")
    assert spec.files() == {split: (root / f"{split}.fr", root / f"{split}.de") for split in splits}
    assert spec.test_split_names() == ["test2016"]


def test_root_is_used_without_network(
    mirror: Mirror, shared_data: Path, tmp_path: Path, closed_port: int
) -> None:
    root = shared_data / "multi30k"
    expected = {name: root / name for name in NAMES}
    assert multi30k_paths(LANGS, root=root, cache_dir=tmp_path, base_url=mirror.base_url) == expected
    offline = f"http://127.0.0.1:{closed_port}/raw"
    assert multi30k_paths(LANGS, root=root, cache_dir=tmp_path, base_url=offline) == expected
    assert sum(mirror.counts.values()) == 0
    assert not (tmp_path / "multi30k").exists()


def test_corrupt_mirror_file_is_rejected_and_nothing_is_left(mirror: Mirror, tmp_path: Path) -> None:
    mirror.file("val.en").write_bytes(gzip.compress(b"A dog runs.\n"))
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=r"SHA-256 checksum mismatch.*val\.en\.gz.*data\.root="):
        multi30k_paths(LANGS, root=None, cache_dir=cache, base_url=mirror.base_url)
    # Files before val.en were fetched and verified; val.en itself and any temporary file are absent.
    assert cache_files(cache) == {"train.de", "train.en", "val.de", ".lock"}


@pytest.mark.parametrize("payload", ["html", "truncated"])
def test_payload_that_is_not_gzip_is_rejected(
    mirror: Mirror, tmp_path: Path, gzipped: dict[str, bytes], payload: str
) -> None:
    """A captive portal's page, and a gzip stream cut short (it ends before its end-of-stream marker:
    `EOFError`, not `OSError`), are both refused by name, writing nothing."""
    cut = gzipped["train.de"][: len(gzipped["train.de"]) // 2]
    mirror.file("train.de").write_bytes(b"<html>captive portal</html>" if payload == "html" else cut)
    dest = tmp_path / "out" / "train.de"
    with pytest.raises(DataError, match=r"not a valid gzip file.*data\.root="):
        fetch_gzipped(f"{mirror.base_url}/train.de.gz", dest, MULTI30K_SHA256["train.de"])
    assert not dest.parent.exists() or os.listdir(dest.parent) == []


@pytest.mark.parametrize("bomb", [True, False])
def test_a_payload_larger_than_any_multi30k_file_is_refused_unread(
    mirror: Mirror, tmp_path: Path, bomb: bool
) -> None:
    """A gzip bomb (64 MB of zeros in 64 KB) is inflated only up to `MAX_FILE_BYTES`, and a download
    larger than that is not read further: both are refused before the checksum, writing nothing."""
    big = download.MAX_FILE_BYTES + (1 << 20)
    payload = gzip.compress(bytes(2 * big), 9) if bomb else os.urandom(big)
    assert (len(payload) < 1 << 20) if bomb else len(payload) > download.MAX_FILE_BYTES
    mirror.file("val.de").write_bytes(payload)
    dest = tmp_path / "out" / "val.de"
    what = "unpacks to" if bomb else "is"
    with pytest.raises(DataError, match=rf"val\.de\.gz {what} more than 32 MB.*mirror is wrong"):
        fetch_gzipped(f"{mirror.base_url}/val.de.gz", dest, MULTI30K_SHA256["val.de"])
    assert not dest.parent.exists() or os.listdir(dest.parent) == []


def test_a_gzip_bomb_is_inflated_only_up_to_the_size_limit(mirror: Mirror, tmp_path: Path) -> None:
    """Eight gzip members of `MAX_FILE_BYTES` zeros each (256 MB inflated, 256 KB sent): the memory the
    refusal takes stays within a small multiple of the limit, not of the inflated size."""
    import tracemalloc

    mirror.file("val.de").write_bytes(gzip.compress(bytes(download.MAX_FILE_BYTES), 9) * 8)
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"val\.de\.gz unpacks to more than 32 MB"):
            fetch_gzipped(f"{mirror.base_url}/val.de.gz", tmp_path / "val.de", MULTI30K_SHA256["val.de"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * download.MAX_FILE_BYTES


@contextlib.contextmanager
def serve_once(handler: Any) -> Iterator[str]:
    """A loopback HTTP/1.1 server whose GET is `handler(request)`; yields its URL of val.de.gz."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            handler(self)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/val.de.gz"
    finally:
        server.shutdown()
        server.server_close()


def test_a_transfer_cut_short_is_named_a_failed_download(tmp_path: Path) -> None:
    """A connection dropped before the promised Content-Length is a failed download (retry), not a
    wrong mirror or a corrupt file."""
    body = gzip.compress(b"ein Hund\n" * 20000)

    def cut(request: Any) -> None:
        request.send_response(200)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body[: len(body) // 2])
        request.wfile.flush()
        request.connection.shutdown(socket.SHUT_WR)

    failed = pytest.raises(DataError, match=r"could not download .*IncompleteRead")
    with serve_once(cut) as url, failed:
        fetch_gzipped(url, tmp_path / "val.de", MULTI30K_SHA256["val.de"], timeout=10)
    assert not (tmp_path / "val.de").exists()


def test_a_redirect_loop_is_named_on_one_line(tmp_path: Path) -> None:
    """urllib's reason for a redirect loop spans three lines: the error message was cut across them."""

    def loop(request: Any) -> None:
        request.send_response(302)
        request.send_header("Location", request.path)
        request.send_header("Content-Length", "0")
        request.end_headers()

    with serve_once(loop) as url, pytest.raises(DataError) as failed:
        fetch_gzipped(url, tmp_path / "val.de", MULTI30K_SHA256["val.de"], timeout=10)
    message = str(failed.value)
    assert "\n" not in message and re.search(r"could not download .*redirect error .* infinite loop", message)
    assert not (tmp_path / "val.de").exists()


def test_a_server_that_sends_a_byte_now_and_then_is_given_up_on(tmp_path: Path) -> None:
    """Each read returns within the timeout, but the transfer would never end: it is given up after
    `TOTAL_TIMEOUTS` times the timeout (before, never)."""
    body = gzip.compress(b"ein Hund\n" * 20000)
    stop = time.monotonic() + 30

    def drip(request: Any) -> None:
        request.send_response(200)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        for byte in body:
            if time.monotonic() > stop:
                return
            request.wfile.write(bytes([byte]))
            request.wfile.flush()
            time.sleep(0.02)

    started = time.monotonic()
    failed = pytest.raises(DataError, match=r"could not download .*TimeoutError: the transfer was not")
    with serve_once(drip) as url, failed:
        fetch_gzipped(url, tmp_path / "val.de", MULTI30K_SHA256["val.de"], timeout=0.2)
    assert time.monotonic() - started < 10  # 2 s allowed (10 × 0.2 s)
    assert not (tmp_path / "val.de").exists()


def test_the_multi30k_download_allows_60_s_per_read_and_10_minutes_per_file(
    gzipped: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: a read waits 60 s at most, and a file not complete within ten times that (10 minutes) is an
    error. The Multi30k download passes no timeout: these are `fetch_gzipped`'s defaults. The timeout of
    each connection is recorded as the real `socket.create_connection` makes it; the clock the download
    reads (only that clock) jumps 599 s or 601 s while the first file's body is on its way, after the
    download took its deadline, so nothing waits minutes."""
    served = {upstream_path(name).rsplit("/", 1)[1]: data for name, data in gzipped.items()}
    timeouts: list[float | None] = []
    real_connect = socket.create_connection

    def connect(*args: Any, **kwargs: Any) -> socket.socket:
        sock = real_connect(*args, **kwargs)
        timeouts.append(sock.gettimeout())  # what each read on this connection waits for
        return sock

    monkeypatch.setattr(socket, "create_connection", connect)
    clock = {"reads": 0, "jump": 0.0, "by": 0.0}

    def monotonic() -> float:
        clock["reads"] += 1
        return time.monotonic() + clock["jump"]

    monkeypatch.setattr(download, "time", SimpleNamespace(monotonic=monotonic))

    def late(request: Any) -> None:
        body = served[request.path.rsplit("/", 1)[1]]
        request.send_response(200)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.flush()
        if not clock["jump"]:  # the first file: the clock jumps once its download took its deadline and
            waited = time.monotonic() + 10  # checked it before the first read, which waits for the body
            while clock["reads"] < 2 and time.monotonic() < waited:
                time.sleep(0.005)
            clock["jump"] = clock["by"]
        request.wfile.write(body)
        request.wfile.flush()

    for jump in (599.0, 601.0):
        clock.update(reads=0, jump=0.0, by=jump)
        timeouts.clear()
        cache_dir = tmp_path / f"cache-{jump:g}"
        with serve_once(late) as url:
            base_url = url.rsplit("/", 1)[0]
            if jump < 600:
                paths = multi30k_paths(LANGS, root=None, cache_dir=cache_dir, base_url=base_url)
                assert list(paths) == NAMES and all(path.is_file() for path in paths.values())
            else:
                expected = r"train\.de\.gz \(TimeoutError: the transfer was not complete after 10 times the"
                with pytest.raises(DataError, match=expected):
                    multi30k_paths(LANGS, root=None, cache_dir=cache_dir, base_url=base_url)
                assert cache_files(cache_dir) <= {".lock"}
        assert clock["jump"] == jump
        assert timeouts and set(timeouts) == {60.0}


def test_offline_names_the_url_and_data_root(closed_port: int, tmp_path: Path) -> None:
    base_url = f"http://127.0.0.1:{closed_port}/{MULTI30K_COMMIT}/data/task1/raw"
    url = f"{base_url}/train.de.gz"
    with pytest.raises(DataError, match=rf"could not download {re.escape(url)} .*data\.root=") as info:
        multi30k_paths(LANGS, root=None, cache_dir=tmp_path, base_url=base_url)
    assert "official layout" in str(info.value)
    assert cache_files(tmp_path) <= {".lock"}


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_cache_dir_that_is_a_file_is_named_before_any_download(
    closed_port: int, tmp_path: Path, under: str
) -> None:
    """A file where the cache directory (or one above it) belongs raised a NotADirectoryError."""
    (tmp_path / "a-file").write_text("not a directory")
    cache_dir = tmp_path / "a-file" / under
    named = f"cannot create the cache directory {cache_dir / 'multi30k' / MULTI30K_COMMIT[:12]} (Not a "
    with pytest.raises(DataError, match=re.escape(named) + r"directory\): set data\.cache_dir"):
        multi30k_paths(LANGS, root=None, cache_dir=cache_dir, base_url=f"http://127.0.0.1:{closed_port}")


def test_missing_file_on_mirror_is_an_http_error(mirror: Mirror, tmp_path: Path) -> None:
    mirror.file("test2016.en").unlink()
    with pytest.raises(DataError, match=r"test_2016_flickr\.en\.gz \(HTTP 404"):
        multi30k_paths(LANGS, root=None, cache_dir=tmp_path, base_url=mirror.base_url)
    assert "test2016.en" not in cache_files(tmp_path)


def _copy_root(shared_data: Path, root: Path, names: list[str]) -> None:
    root.mkdir()
    for name in names:
        (root / name).write_bytes((shared_data / "multi30k" / name).read_bytes())


def test_root_missing_a_file_names_it(shared_data: Path, tmp_path: Path, closed_port: int) -> None:
    _copy_root(shared_data, tmp_path / "root", [n for n in NAMES if n != "val.de"])
    with pytest.raises(DataError, match=r"lacks val\.de\. It must hold"):
        multi30k_paths(
            LANGS, root=tmp_path / "root", cache_dir=tmp_path, base_url=f"http://127.0.0.1:{closed_port}"
        )


def test_root_with_a_modified_file_is_rejected(shared_data: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    _copy_root(shared_data, root, NAMES)
    with (root / "test2016.en").open("a", encoding="utf-8") as f:
        f.write("one more line\n")
    with pytest.raises(DataError, match=r"SHA-256 checksum mismatch for .*test2016\.en.*`files` data source"):
        multi30k_paths(LANGS, root=root, cache_dir=tmp_path)


@pytest.mark.parametrize(
    ("langs", "message"),
    [
        (("de", "cs"), r"unknown Multi30k language 'cs': known languages are de, en, fr"),
        ("de", "list"),
        ((), r"langs is empty: name at least one Multi30k language \(de, en, fr\)"),
    ],
)
def test_bad_languages_are_rejected(langs: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=message):
        multi30k_paths(langs, root=None, cache_dir=tmp_path)


def test_checksums_match_shared_sha256sums(shared_data: Path) -> None:
    sums = {}
    for line in (shared_data / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, path = line.split(maxsplit=1)
        if path.startswith("multi30k/"):
            sums[path.removeprefix("multi30k/")] = digest
    assert sums == MULTI30K_SHA256


# --- cache ---------------------------------------------------------------------------------------------


def test_the_cache_root_is_attnlab_cache_dir_else_xdg_cache_home_else_home_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: data.cache_dir defaults to $ATTNLAB_CACHE_DIR, else $XDG_CACHE_HOME/attnlab, else
    ~/.cache/attnlab (an unset or empty variable counts as absent)."""
    from attnlab.data.corpora import Multi30kData

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache.default_cache_dir() == tmp_path / "explicit"
    assert Multi30kData().cache_root() == tmp_path / "explicit"  # data.cache_dir=null

    monkeypatch.delenv("ATTNLAB_CACHE_DIR")
    assert cache.default_cache_dir() == tmp_path / "xdg" / "attnlab"
    assert Multi30kData().cache_root() == tmp_path / "xdg" / "attnlab"
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", "")
    assert cache.default_cache_dir() == tmp_path / "xdg" / "attnlab"

    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.default_cache_dir() == tmp_path / "home" / ".cache" / "attnlab"
    assert Multi30kData().cache_root() == tmp_path / "home" / ".cache" / "attnlab"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache.default_cache_dir() == tmp_path / "home" / ".cache" / "attnlab"

    assert Multi30kData(cache_dir=str(tmp_path / "set")).cache_root() == tmp_path / "set"  # when set


def test_fingerprint_is_stable_and_sensitive(tmp_path: Path) -> None:
    data = tmp_path / "a.txt"
    data.write_text("ein Hund\n", encoding="utf-8")
    settings = {"vocab": 8000, "lowercase": False, "langs": ["de", "en"]}
    key = fingerprint(data, settings, 1)

    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert fingerprint(data, dict(reversed(settings.items())), 1) == key
    # Pinned: a cache key must not change between runs, processes or Python versions.
    assert fingerprint({"b": [1, 2.5, None, True], "a": "ü"}) == "6b88d3ee7cb9eea0"

    elsewhere = tmp_path / "sub" / "b.txt"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(data.read_bytes())
    assert fingerprint(elsewhere, settings, 1) == key

    assert fingerprint(data, {**settings, "vocab": 8001}, 1) != key
    assert fingerprint(data, settings, 2) != key
    assert fingerprint(settings, data, 1) != key
    assert fingerprint(str(data), settings, 1) != key
    data.write_text("ein Hund.\n", encoding="utf-8")
    assert fingerprint(data, settings, 1) != key
    with pytest.raises(TypeError, match="set"):
        fingerprint({1, 2})


def test_a_remembered_file_digest_serves_only_the_unchanged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache, "RACY_SECONDS", 0.0)  # remember files written a moment ago too
    memo, data = tmp_path / "memo", tmp_path / "train.de"
    data.write_text("ein Hund\n", encoding="utf-8")
    key = fingerprint([data], memo=memo)
    assert key == fingerprint([data])
    (entry,) = memo.iterdir()
    assert entry.read_text() == file_sha256(data)
    entry.write_text("0" * 64)  # what is remembered is what the key is made of: the file is not read again
    assert fingerprint([data], memo=memo) != key

    # A write of the same size, its modification time set back, is a new identity: hashed again.
    time.sleep(0.05)  # past the file system's time granularity
    before = data.stat()
    data.write_text("ein Huhn\n", encoding="utf-8")
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    changed = fingerprint([data])
    assert changed != key and fingerprint([data], memo=memo) == changed

    for stale in memo.iterdir():  # an entry that is not a digest is ignored and rewritten
        stale.write_text("not a digest")
    assert fingerprint([data], memo=memo) == changed
    assert file_sha256(data) in {e.read_text() for e in memo.iterdir()}

    monkeypatch.setattr(cache, "RACY_SECONDS", 3600.0)  # a file changed within it is not remembered
    fresh = tmp_path / "fresh.de"
    fresh.write_text("neu\n", encoding="utf-8")
    entries = len(list(memo.iterdir()))
    assert fingerprint(fresh, memo=memo) == fingerprint(fresh)
    assert len(list(memo.iterdir())) == entries


def test_building_renames_into_place(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    with building(target) as tmp:
        assert tmp is not None and tmp.parent == tmp_path and not target.exists()
        (tmp / "data.txt").write_text("x", encoding="utf-8")
    assert (target / "data.txt").read_text(encoding="utf-8") == "x"
    assert sorted(os.listdir(tmp_path)) == ["entry", "entry.lock"]
    with building(target) as again:
        assert again is None


@pytest.mark.parametrize("in_the_way", ["file", "broken link", "link to a file"])
def test_building_replaces_what_is_no_directory(
    tmp_path: Path, in_the_way: str, caplog: pytest.LogCaptureFixture
) -> None:
    target, elsewhere = tmp_path / "entry", tmp_path / "elsewhere.txt"
    if in_the_way == "file":
        target.write_text("not a build", encoding="utf-8")
    else:
        if in_the_way == "link to a file":
            elsewhere.write_text("kept", encoding="utf-8")
        target.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="attnlab.data.cache"), building(target) as tmp:
        assert tmp is not None  # built again, not taken for a build
        (tmp / "data.txt").write_text("x", encoding="utf-8")
    assert not target.is_symlink() and (target / "data.txt").read_text(encoding="utf-8") == "x"
    assert "not a directory" in caplog.text
    assert in_the_way != "link to a file" or elsewhere.read_text(encoding="utf-8") == "kept"


def test_building_failure_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    with pytest.raises(ValueError, match="boom"), building(target) as tmp:
        assert tmp is not None
        (tmp / "half.txt").write_text("x", encoding="utf-8")
        raise ValueError("boom")
    assert os.listdir(tmp_path) == ["entry.lock"]


def test_building_removes_leftovers_of_a_killed_builder(tmp_path: Path) -> None:
    stale = tmp_path / ".entry.building-999999"
    stale.mkdir()
    (stale / "half.txt").write_text("x", encoding="utf-8")
    with building(tmp_path / "entry") as tmp:
        assert tmp is not None
    assert sorted(os.listdir(tmp_path)) == ["entry", "entry.lock"]


def build_in_process(target: str, records: str, barrier: Any) -> None:
    """Child process body: build `target` (0.5 s) unless it exists, and record which case happened."""
    barrier.wait()
    with building(Path(target)) as tmp:
        if tmp is not None:
            time.sleep(0.5)
            (tmp / "payload").write_text("built", encoding="utf-8")
            (Path(records) / f"built-{os.getpid()}").touch()
            return
    seen = (Path(target) / "payload").read_text(encoding="utf-8")
    (Path(records) / f"reused-{os.getpid()}").write_text(seen, encoding="utf-8")


def test_building_concurrently_builds_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    records = tmp_path / "records"
    records.mkdir()
    barrier = ctx.Barrier(2)
    args = (str(tmp_path / "entry"), str(records), barrier)
    processes = [ctx.Process(target=build_in_process, args=args) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    outcomes = sorted(path.name.split("-")[0] for path in records.iterdir())
    assert outcomes == ["built", "reused"]
    assert next(records.glob("reused-*")).read_text(encoding="utf-8") == "built"
    assert sorted(os.listdir(tmp_path)) == ["entry", "entry.lock", "records"]


def test_building_says_when_it_waits_for_another_builder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process waiting for another's build (a DDP rank, a second job on the same corpus) printed nothing
    for as long as the build took."""
    target = tmp_path / "entry"
    caplog.set_level("INFO", logger="attnlab.data.cache")
    with building(target) as tmp:
        assert tmp is not None
    assert not caplog.records  # nobody else held the lock
    outcome: list[Path | None] = []
    with FileLock(target.with_name("entry.lock")):  # another builder
        waiter = threading.Thread(target=lambda: outcome.extend(building_once(target)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not outcome  # still waiting
    waiter.join(30)
    assert outcome == [None]
    assert [r.getMessage() for r in caplog.records] == [
        f"another process is building {target} (it holds {target}.lock): waiting for it"
    ]


def building_once(target: Path) -> list[Path | None]:
    with building(target) as tmp:
        return [tmp]


def test_file_lock_times_out_naming_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "x.lock"
    with FileLock(path):
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=re.escape(str(path))), FileLock(path, timeout=0.2):
            pass
        assert time.monotonic() - start >= 0.2
    with FileLock(path, timeout=0.2) as lock:
        assert lock.locked


def test_file_lock_with_timeout_zero_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    """`timeout=0` tries once (a run directory in use is refused so): while another holds the lock it raises
    at once, naming the holder it recorded, without announcing a wait (`waiting`); once the lock is free,
    it takes it."""
    path = tmp_path / ".lock"
    announced: list[bool] = []
    outcome: list[BaseException | None] = []

    def try_once() -> None:
        try:
            with FileLock(path, timeout=0, record_holder=True, waiting=lambda: announced.append(True)):
                outcome.append(None)
        except TimeoutError as exc:
            outcome.append(exc)

    with FileLock(path, record_holder=True) as holder:
        tried = threading.Thread(target=try_once)
        start = time.monotonic()
        tried.start()
        tried.join(5)
        waited = time.monotonic() - start
        if tried.is_alive():  # waiting for the lock: free it so the thread ends, then fail
            holder.release()
            tried.join(5)
            pytest.fail("FileLock(timeout=0) waited for a held lock")
    assert waited < 1 and not announced
    (refused,) = outcome
    assert isinstance(refused, TimeoutError)
    assert (
        f"could not lock {path} within 0 s: pid {os.getpid()} on host {socket.gethostname()} holds it"
        in str(refused)
    )
    try_once()
    assert outcome[1:] == [None] and not announced


def test_held_elsewhere_tells_another_processs_lock_from_this_processs_own(tmp_path: Path) -> None:
    """`held_elsewhere` (a multirun job's Hydra record is not written into a directory another process
    holds): no file is not held (and none is made); this process's own lock is not held elsewhere; a live
    process's is, until it dies; the check leaves the lock free."""
    path = tmp_path / "run" / ".lock"
    assert not held_elsewhere(path) and not path.parent.exists()
    with FileLock(path):
        assert not held_elsewhere(path)
    hold = "import fcntl, sys, time\nf = open(sys.argv[1])\nfcntl.flock(f, fcntl.LOCK_EX)\n"
    hold += "print(flush=True)\ntime.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdout=subprocess.PIPE)
    try:
        other.stdout.readline()  # (it holds the lock)
        assert held_elsewhere(path)
    finally:
        other.kill()
        other.wait()
    assert not held_elsewhere(path)
    with FileLock(path, timeout=0):
        pass


def test_held_elsewhere_takes_no_look_of_another_process_for_a_holder(tmp_path: Path) -> None:
    """Two looks at one lock at once (two commands starting on one directory): the other's look, a shared
    lock for an instant (here held by another open file of the lock), is no holder of the lock; a holder's
    exclusive lock still is."""
    import fcntl

    path = tmp_path / ".lock"
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # (a look at the lock, in its instant)
        assert not held_elsewhere(path)
        fcntl.flock(fd, fcntl.LOCK_EX)  # (a holder)
        assert held_elsewhere(path)
    finally:
        os.close(fd)


def test_a_look_at_a_lock_does_not_refuse_a_claim_tried_in_its_instant(tmp_path: Path) -> None:
    """A `FileLock(timeout=0)` tried while `held_elsewhere` looks at the lock (a command claiming the run
    directory another command looks at: its shared lock, here held by another open file of the lock) is not
    refused: it takes the lock once the look ends. A holder's lock still refuses it at once."""
    import fcntl

    path = tmp_path / ".lock"
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    look_ends = threading.Timer(0.1, fcntl.flock, (fd, fcntl.LOCK_UN))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # (a look at the lock, in its instant)
        look_ends.start()
        with FileLock(path, timeout=0, record_holder=True) as claim:
            assert claim.locked
        look_ends.join()
        fcntl.flock(fd, fcntl.LOCK_EX)  # (a holder)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="another process holds it"), FileLock(path, timeout=0):
            pass
        assert time.monotonic() - start < 0.5
    finally:
        look_ends.cancel()
        os.close(fd)


def test_a_look_paused_past_a_second_delays_a_run_directory_claim_not_refuses_it(tmp_path: Path) -> None:
    """A `held_elsewhere` look paused while it holds the lock shared (its process stopped: Ctrl-Z, SLURM's
    suspend; a slow NFS server), here a shared lock of another open file of the lock freed after 1.3 s,
    past the second a claim tries on quickly (`_LOOK_S`): the run directory's claim (`RunDir.claim`,
    `FileLock(timeout=0)`) is not refused as `in use`, it takes the lock once the look ends. (A holder
    still refuses it at once: `test_a_look_at_a_lock_does_not_refuse_a_claim_tried_in_its_instant`.)"""
    import fcntl

    from attnlab.runs.layout import RunDir

    run = RunDir(tmp_path)
    run.run_lock.touch()
    fd = os.open(run.run_lock, os.O_RDONLY)
    look_ends = threading.Timer(1.3, fcntl.flock, (fd, fcntl.LOCK_UN))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # (a look at the lock, paused)
        start = time.monotonic()
        look_ends.start()
        claim = run.claim()
        assert time.monotonic() - start >= 1.2 and claim.locked
        assert claim.recorded_holder() == (os.getpid(), socket.gethostname())
        claim.release()
    finally:
        look_ends.cancel()
        os.close(fd)


def test_a_claim_waiting_on_a_stopped_looks_process_says_which_process_and_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run directory's claim (`RunDir.claim`) waiting on a `held_elsewhere` look whose process is stopped
    (here a real process holding the lock shared, as a look does, then sent SIGSTOP: an attnlab-eval
    suspended with Ctrl-Z in its look) waited silently for as long as the process stayed stopped. Past
    a second it says, once, in one line, which process holds the lock (pid, command line, stopped) and what
    to do; the claim takes the lock once that process ends."""
    from attnlab.runs.layout import RunDir

    run = RunDir(tmp_path)
    run.run_lock.touch()
    look = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"  # (as a look opens it)
    look += "fcntl.flock(fd, fcntl.LOCK_SH)\nprint(flush=True)\ntime.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", look, str(run.run_lock)], stdout=subprocess.PIPE)
    claimed: list[FileLock] = []
    claim = threading.Thread(target=lambda: claimed.append(run.claim()))
    try:
        other.stdout.readline()  # (it holds the lock)
        os.kill(other.pid, signal.SIGSTOP)
        caplog.set_level("WARNING", logger="attnlab.io")
        claim.start()
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not claimed  # still waiting, not refused
    finally:
        other.kill()  # (SIGKILL ends a stopped process too)
        other.wait()
    claim.join(10)
    assert claimed and claimed[0].locked
    claimed[0].release()
    (told,) = [record.getMessage() for record in caplog.records]
    pid = other.pid
    assert told.startswith(
        f"waiting for the lock {run.run_lock}: pid {pid} ({sys.executable} -c import fcntl"
    )
    assert "..., stopped) has held it for 1 s to look at it" in told
    assert told.endswith(f"resume it (fg in its shell, or kill -CONT {pid}) or end it (kill {pid}), and this "
                         "command goes on")  # fmt: skip


def test_a_run_directory_claim_refused_by_a_stopped_holder_says_it_is_stopped_and_what_to_do(
    tmp_path: Path,
) -> None:
    """A run directory whose holder is stopped (a run suspended with Ctrl-Z; here a real process holding the
    lock with its record, then sent SIGSTOP) is refused at once as any other in use; the message said the
    holder `is running there`, and waiting for it to end waited until someone resumed it. It says that the
    holder is stopped, and how to resume or end it."""
    from attnlab.runs.layout import RunDir, RunDirectoryInUse

    run = RunDir(tmp_path)
    hold = "import fcntl, os, socket, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    hold += (
        "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, f'{os.getpid()} {socket.gethostname()}\\n'.encode())\n"
    )
    hold += "print(flush=True)\ntime.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", hold, str(run.run_lock)], stdout=subprocess.PIPE)
    try:
        other.stdout.readline()  # (it holds the lock)
        os.kill(other.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not process_stopped(other.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(RunDirectoryInUse) as refused:
            run.claim()
    finally:
        other.kill()
        other.wait()
    pid = other.pid
    fix = f"resume it (fg in its shell, or kill -CONT {pid}) or end it (kill {pid})"
    said = f"is in use: pid {pid} on host {socket.gethostname()} (stopped: {fix}) is running there"
    assert said in str(refused.value)


@pytest.mark.parametrize("held", ["look", "holder"])
def test_a_wait_is_announced_for_a_holder_not_for_a_look(held: str, tmp_path: Path) -> None:
    """`FileLock(waiting=...)` says why nothing happens (a download or build another process holds) once,
    when another process holds the lock; not while only a `held_elsewhere` look holds it for an instant
    (its shared lock, here held by another open file of the lock until a timer frees it)."""
    import fcntl

    path = tmp_path / ".lock"
    path.touch()
    fd = os.open(path, os.O_RDONLY if held == "look" else os.O_RDWR)
    freed = threading.Timer(0.1, fcntl.flock, (fd, fcntl.LOCK_UN))
    announced: list[bool] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if held == "look" else fcntl.LOCK_EX)
        freed.start()
        with FileLock(path, timeout=5, waiting=lambda: announced.append(True)) as lock:
            assert lock.locked
    finally:
        freed.cancel()
        os.close(fd)
    assert announced == ([True] if held == "holder" else [])


def test_a_lock_file_its_holder_deletes_is_never_held_twice(tmp_path: Path) -> None:
    """A process waiting on a lock file that its holder deletes (`release(delete=True)`: a refused command
    removing the run directory it made) takes the file at the path afterwards, not the deleted one: a
    third process then finds the lock held, not a fresh free file of the same name."""
    import threading

    path = tmp_path / ".lock"
    holder, waiting = FileLock(path), threading.Event()
    holder.acquire()
    waiter = FileLock(path, timeout=5, waiting=waiting.set)  # (another open file: flock applies in-process)
    thread = threading.Thread(target=waiter.acquire)
    thread.start()
    assert waiting.wait(5)  # the waiter has the deleted file open
    holder.release(delete=True)
    thread.join(5)
    assert waiter.locked and path.is_file()
    with pytest.raises(TimeoutError), FileLock(path, timeout=0):
        pass
    waiter.release()
    with FileLock(path, timeout=0):
        pass


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "dropped"])
def test_a_process_forked_from_a_lock_holder_does_not_hold_its_lock(tmp_path: Path, kept: bool) -> None:
    """A process forked from a lock's holder (a DataLoader worker forked from a run's process) does not
    hold the lock: when the holder dies without releasing it (SIGKILL), the lock is free at once, although
    the forked process still runs (an flock lasts while any process has the descriptor open). So too for a
    lock the holder took and dropped, never released (garbage collected: the holder still holds it)."""
    path = tmp_path / ".lock"
    ready_r, ready_w = os.pipe()  # the forked process's pid, once it runs
    stop_r, stop_w = os.pipe()  # it runs until this closes
    holder = os.fork()
    if holder == 0:  # takes the lock, forks, is killed holding it
        try:
            lock = FileLock(path)
            lock.acquire()
            if not kept:
                del lock
                gc.collect()
            if os.fork() == 0:  # the forked process
                os.close(stop_w)
                os.write(ready_w, str(os.getpid()).encode())
                os.read(stop_r, 1)  # until the test closes stop_w
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(stop_r)
    try:
        forked = int(os.read(ready_r, 32))
        assert os.waitpid(holder, 0)[1] == signal.SIGKILL
        os.kill(forked, 0)  # (still running)
        with FileLock(path, timeout=0):
            pass
    finally:
        os.close(stop_w)  # the forked process ends
        os.close(ready_r)


def test_atomic_write_bytes_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "new" / "file.bin"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(path.parent) == ["file.bin"]
