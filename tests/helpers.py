"""Small builders shared by the tests (importable as `helpers`; see `pythonpath` in pyproject.toml)."""

from __future__ import annotations

import json
import os
import resource
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch import Tensor

from attnlab.cli.app import config_dir, register_resolvers
from attnlab.data.download import MULTI30K_COMMIT
from attnlab.model.config import TransformerConfig

TESTS = Path(__file__).resolve().parent


# What SLURM sets for a one-task job (Lightning's SLURM environment reads it; its auto-requeue calls
# `scontrol requeue 4242`).
SLURM_ENV = {
    "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "attnlab", "SLURM_NODELIST": "localhost",
}  # fmt: skip


def subprocess_path() -> str:
    """PYTHONPATH for a test's subprocess: the tests' modules (probes), the attnlab this process imported
    (a checkout's `src/` where PYTHONPATH names it, else the installed one) and the caller's PYTHONPATH."""
    import attnlab

    parts = [str(TESTS), str(Path(attnlab.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


TINY = {
    "src_vocab_size": 50,
    "tgt_vocab_size": 50,
    "d_model": 32,
    "n_heads": 4,
    "d_ff": 64,
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
}


def random_source(lengths: list[int], vocab: int = 50, seed: int = 0) -> Tensor:
    """(B, max(lengths) + 1) random symbol ids (>= 4) ending in eos (2), right-padded with pad (0)."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths) + 1), 0)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, vocab, (n,), generator=gen)
        out[i, n] = 2
    return out


def tiny_config(**overrides: Any) -> TransformerConfig:
    """The tiny test model (D=32, H=4, 2+2 layers, V=50) with `overrides` applied."""
    return TransformerConfig(**{**TINY, **overrides})


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def require_shared_data(path: Path = SHARED_DATA) -> Path:
    """`path` if it exists; otherwise skip (a user's clone has no ../shared) or, under CI=true, fail."""
    if path.is_dir():
        return path
    reason = f"shared test data not found at {path} (it lives beside the repository as ../shared/data)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must provide it", pytrace=False)
    pytest.skip(reason)


def compose_app(name: str, overrides: list[str], *, hydra_node: bool = False) -> DictConfig:
    """Compose `conf/<name>.yaml` (`train`, `eval`, `export`, ...) with `overrides`, as its command would."""
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir()), job_name="test"):
        return compose(name, overrides=list(overrides), return_hydra_config=hydra_node)


def command_here(monkeypatch: pytest.MonkeyPatch, task: str, *args: str) -> None:
    """`attnlab-<task> <args>` (`attnlab.cli.<task>.main`, Hydra's own logging off) in this process: no new
    process's 10 s of imports. Raises what the command raises (a refusal's `SystemExit`). Hydra's global
    state (`GlobalHydra`, and the `HydraConfig` of the job, which Hydra leaves set) is cleared afterwards:
    later code outside a Hydra app (`Manifest.failed`'s overrides) would read this command's."""
    import importlib
    import sys

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    main = importlib.import_module(f"attnlab.cli.{task}").main
    argv = [f"attnlab-{task}", *args, "hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", argv)
    GlobalHydra.instance().clear()
    try:
        main()
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None


def saved_run(run_dir: Path, status: str, checkpoints: list[str]) -> dict[Path, bytes]:
    """A run directory's records as a run leaves them: a manifest.json saying `status` and the files
    `checkpoints` under checkpoints/ (their content is never read); returns every file with its bytes."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"status": status}))
    for name in checkpoints:
        (run_dir / "checkpoints" / name).write_bytes(b"weights")
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def compose_train(overrides: list[str], output_dir: Path, *, hydra_node: bool = False) -> DictConfig:
    """Compose `conf/train.yaml` with `overrides`, writing the run into `output_dir`."""
    overrides = [f"paths.output_dir={output_dir}", "trainer.enable_progress_bar=false", *overrides]
    return compose_app("train", overrides, hydra_node=hydra_node)


def compose_eval(overrides: list[str], output_dir: Path) -> DictConfig:
    """Compose `conf/eval.yaml` with `overrides`, writing into `output_dir`."""
    return compose_app("eval", [f"paths.output_dir={output_dir}", *overrides])


UPSTREAM = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}


def upstream_path(name: str) -> str:
    """The URL path of stored file `name` on the mirror, e.g. `/<commit>/data/task1/raw/val.de.gz`."""
    split, lang = name.split(".")
    return f"/{MULTI30K_COMMIT}/data/task1/raw/{UPSTREAM[split]}.{lang}.gz"


class CountingHandler(SimpleHTTPRequestHandler):
    """Serves files and counts GET requests per path in `server.counts`; silent."""

    def do_GET(self) -> None:
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.counts[self.path] += 1  # type: ignore[attr-defined]
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Mirror:
    """A loopback HTTP server serving `www` in the upstream Multi30k layout."""

    www: Path
    base_url: str
    counts: Counter[str]

    def file(self, name: str) -> Path:
        return self.www / upstream_path(name).lstrip("/")


@contextmanager
def serve_mirror(www: Path, gzipped: dict[str, bytes]) -> Iterator[Mirror]:
    """Serve `gzipped` (stored name -> .gz bytes) from 127.0.0.1 in the upstream layout."""
    for name, data in gzipped.items():
        target = www / upstream_path(name).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(CountingHandler, directory=str(www)))
    server.counts = Counter()  # type: ignore[attr-defined]
    server.lock = threading.Lock()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/{MULTI30K_COMMIT}/data/task1/raw"
    try:
        yield Mirror(www, base_url, server.counts)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def write_corpus(shared_data: Path, corpus: Path, splits: tuple[tuple[str, str, int | slice], ...]) -> Path:
    """A small parallel de/en corpus in the `data=files` layout from lines of Multi30k: `splits` holds
    (file prefix, Multi30k split, lines): ("valid", "val", 20) -> the first 20 lines as `valid.de`,
    `valid.en`; ("test", "train", slice(40, 70)) -> lines 40..69 of the training set as `test.*`."""
    corpus.mkdir(parents=True, exist_ok=True)
    for split, source, lines in splits:
        chosen = lines if isinstance(lines, slice) else slice(lines)
        for lang in ("de", "en"):
            text = (shared_data / "multi30k" / f"{source}.{lang}").read_text("utf-8").split("\n")[chosen]
            (corpus / f"{split}.{lang}").write_text("\n".join(text) + "\n", "utf-8")
    return corpus


# The translating model of the test session (the `translating_run` fixture): every split holds lines of
# the Multi30k training set that the model was trained on until it reproduces them, so its outputs are
# sentence-specific text that tests can score exactly.
TEXT_SPLITS = (
    ("train", "train", 240),
    ("valid", "train", 40),
    ("test", "train", slice(40, 70)),
    ("test2", "train", slice(100, 120)),
)


def text_data(corpus: Path, cache: Path) -> list[str]:
    """The data and model overrides of the translating run: a run with these (and the same corpus) builds
    the same vocabularies and model, so it can start from that run's weights (`probes.InitWeights`)."""
    return [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.test=[test,test2]",
        "data.vocab_size=1000", "data.max_tokens=800", f"data.cache_dir={cache}",
        "model=tiny", "model.d_model=128", "model.d_ff=256", "model.dropout=0.0",
    ]  # fmt: skip


def init_from(checkpoint: Path) -> list[str]:
    """Overrides that start a run from the weights of `checkpoint` (`probes.InitWeights`)."""
    return ["+callbacks.init._target_=probes.InitWeights", f"+callbacks.init.path={checkpoint}"]


@contextmanager
def address_space_capped(extra: int = 2 << 30) -> Iterator[None]:
    """Cap this process's address space at what it maps now plus `extra` bytes while the block runs: a test
    of a memory refusal that broke then fails on the allocation (a MemoryError, or a RuntimeError from C++)
    instead of growing until the out-of-memory killer ends the test run (CTranslate2 allocating for a beam
    of 2^31-1 grew past 17 GB)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = mapped + extra if hard == resource.RLIM_INFINITY else min(mapped + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """Writes that would grow any file of this process past `nbytes` fail with EFBIG ("File too large"),
    as writes fail on a full disk (RLIMIT_FSIZE; SIGXFSZ ignored so that the write returns the error)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def lines(path: Path) -> list[str]:
    """The lines of a text file (UTF-8, without their newlines)."""
    return path.read_text("utf-8").splitlines()


def count_steps(monkeypatch: pytest.MonkeyPatch, modules: bool = False) -> list[int]:
    """Count calls of `attnlab.decoding.step.StepDecoder` (the CPU decoding step), or with `modules` of
    `ModuleStep` (the step through the model's modules), from here on: the returned one-element list holds
    the count."""
    from attnlab.decoding.step import ModuleStep, StepDecoder

    step = ModuleStep if modules else StepDecoder
    calls = [0]
    call = step.__call__

    def counted(self: Any, tokens: Tensor) -> Any:
        calls[0] += 1
        return call(self, tokens)

    monkeypatch.setattr(step, "__call__", counted)
    return calls


def forced_log_probs(translator: Any, source: str, ids: list[int]) -> list[float]:
    """Each token's log-probability under the model given the source and the tokens before it, in one
    teacher-forced pass (no cache, no beam search); `translator` an `attnlab.inference.Translator`."""
    model, cfg = translator.model, translator.model.config
    src = torch.tensor([translator._source_ids([source])[0]])
    tgt = torch.tensor([[cfg.start_id, *ids[:-1]]])
    with torch.no_grad():
        lprobs = model(src, tgt).float().log_softmax(dim=-1)[0]  # (T, V)
    return lprobs.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()


def cuts(messages: list[str]) -> list[str]:
    """attnlab-translate's warnings but its count of translations without eos (models of the tests that
    rarely emit eos: `test_translations_without_eos_are_counted_in_a_warning` tests that one)."""
    return [m for m in messages if "ran to their length limit" not in m]


def eos_biased_model(vocab_size: int, eos_bias: float) -> Any:
    """A small random model (seed 0, shared source and target vocabularies of `vocab_size`) whose output
    bias adds `eos_bias` to eos at every step (50: always eos first; -50: never eos; 2: some hypotheses end
    early, others run to the length limit)."""
    from attnlab.model.transformer import Transformer

    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                               output_bias=True)  # fmt: skip
    model = Transformer(config.with_vocab(vocab_size, vocab_size))
    with torch.no_grad():
        model.output.bias[config.eos_id] = eos_bias
    return model
