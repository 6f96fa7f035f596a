"""Test-suite set-up: W&B off unless a test turns it on, and shared fixtures."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
# A pytest started as a background job (`pytest &` in a script, nohup) inherits SIGINT ignored, which Python
# then keeps (its workers too): the tests of Ctrl-C run with Python's own handler, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Under pytest-xdist (`-n auto`, CI's command) the workers share the CPUs: each one, and the processes
# its tests start, gets its share of threads (set before torch is imported), not every CPU each, which
# on a busy 2-core machine makes OpenMP's waiting threads compete with the other worker's.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))
# Downloads and prepared corpora of the test session go to a fresh directory, never the user's cache;
# it is removed when the session ends (`pytest_unconfigure`).
_SESSION_CACHE = os.environ["ATTNLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnlab-test-cache-")

# Imported once the environment above is set: helpers imports torch, which reads OMP_NUM_THREADS.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

from helpers import require_shared_data  # noqa: E402

# Property-based tests (hypothesis) try the same examples on every CI run: a red CI is then always
# reproducible, never a newly drawn example in an unrelated change. Locally they draw fresh ones.
_hypothesis_settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` beside the repository (skipped on a user's clone, required under CI=true)."""
    return require_shared_data()


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a module of tiny models: the thread pool only adds synchronisation on a busy
    2-core machine (up to 50x slower). Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def resume_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted `attnlab-train` run (`runs.RUN`) that interrupted and resumed runs must equal."""
    from runs import attnlab_train

    run_dir = tmp_path_factory.mktemp("reference") / "run"
    done = attnlab_train(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def translating_run(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A model that really translates: trained until it reproduces the 240 Multi30k pairs it saw
    (`helpers.TEXT_SPLITS`: validation and test sets are lines of its training set), asserted here by
    sacreBLEU >= 60 on its validation and both test sets. 30 epochs (about half a minute), validation
    decoded every 10th epoch and monitored by val/bleu with early stopping; the last 2 epoch
    checkpoints averaged and beam-decoded (beam 3) on `test` and `test2` into `results.json`.

    Returns `cfg`, `metrics` (of `train`), `dir` (the run), `corpus`, `tmp` and `data` (the overrides
    that build the same data and model: with `helpers.init_from` a run starts from these weights).
    """
    import json

    from attnlab.training.pipeline import train
    from helpers import TEXT_SPLITS, compose_train, text_data, write_corpus

    tmp = tmp_path_factory.mktemp("translating")
    corpus = write_corpus(shared_data, tmp / "corpus", TEXT_SPLITS)
    data = text_data(corpus, tmp / "cache")
    overrides = [
        *data, "optim=inverse_sqrt", "optim.peak_lr=2e-3", "optim.warmup_steps=40", "optim.label_smoothing=0",
        "trainer.max_epochs=30", "decode.every_n_epochs=10", "callbacks=early_stopping", "average_last=2",
        "decode.beam=3", "logger=csv",
    ]  # fmt: skip
    cfg = compose_train(overrides, tmp / "run")
    metrics = train(cfg)
    results = json.loads((tmp / "run" / "results.json").read_text())
    scores = {"val": metrics["val/bleu"], **{name: s["bleu"] for name, s in results["sets"].items()}}
    assert min(scores.values()) >= 60, f"the test model does not reproduce its training pairs: BLEU {scores}"
    return {"cfg": cfg, "metrics": metrics, "dir": tmp / "run", "corpus": corpus, "tmp": tmp, "data": data}


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def full_for_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a run directory's files fails as on a full disk (ENOSPC) when they include results.json."""
    import attnlab.runs.layout as layout

    write = layout.atomic_write_files

    def full(files: dict[Path, bytes]) -> None:
        for path in files:
            if path.name == "results.json":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(files)

    monkeypatch.setattr(layout, "atomic_write_files", full)
