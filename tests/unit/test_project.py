"""Project contracts: the README's test command is what CI runs; the shared-data policy."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import require_shared_data

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no Quickstart bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    main_job, tests = readme_commands()
    assert main_job.endswith("attnlab-train")
    test_command = tests.split("&&")[-1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
    assert "python -m pip install --quiet torch==2.13.0" in ci_lines  # the CPU wheel before the project
    # CI sets CI=true itself (whatever its caller set), so tests that read ../shared/data fail without it
    assert "export CI=true" in ci_lines and ci_lines.index("export CI=true") < ci_lines.index(test_command)


def test_missing_shared_data_skips_on_a_users_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="shared test data not found"):
        require_shared_data(tmp_path / "absent")


def test_missing_shared_data_fails_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    try:  # a skip must fail this test too, not skip it (pytest.raises would let a skip through)
        require_shared_data(tmp_path / "absent")
    except BaseException as exc:  # pytest's outcomes (fail, skip) are BaseExceptions
        outcome = exc
    else:
        outcome = None
    assert isinstance(outcome, pytest.fail.Exception) and "CI must provide it" in str(outcome), outcome


def test_the_test_session_keeps_its_caches_out_of_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py points ATTNLAB_CACHE_DIR at a fresh temporary directory for the session."""
    cache = Path(os.environ["ATTNLAB_CACHE_DIR"])
    assert cache.name.startswith("attnlab-test-cache-") and cache.parent == Path(tempfile.gettempdir())
    assert cache.is_dir()


def test_the_test_session_removes_its_cache_when_it_ends(tmp_path: Path) -> None:
    """A pytest session leaves no `attnlab-test-cache-*` directory behind in the temporary directory."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("ATTNLAB_CACHE_DIR")
    test = "tests/unit/test_project.py::test_the_test_session_keeps_its_caches_out_of_the_users"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "1 passed" in done.stdout, done
    assert not list(tmp_path.glob("attnlab-test-cache-*")), list(tmp_path.iterdir())


SCRIPTS = re.findall(r'^(attnlab-\w+) = "attnlab\.cli\.(\w+):main"$', (ROOT / "pyproject.toml").read_text(),
                     re.M)  # fmt: skip


@pytest.mark.parametrize(("script", "module"), SCRIPTS, ids=[s for s, _ in SCRIPTS])
def test_every_commands_help_is_printed_without_importing_torch(script: str, module: str) -> None:
    """README, Architecture: the modules a command loads first import torch and lightning only inside the
    functions that need them, so `--help` stays fast."""
    code = (
        "import sys\n"
        f"from attnlab.cli.{module} import main\n"
        f"sys.argv = [{script!r}, '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', 'torch' in sys.modules, 'lightning' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    help_text = done.stdout.split("HEAVY")[0]
    assert "HEAVY False False" in done.stdout and len(help_text) > 200, done  # the help, then the check


def test_the_inference_layer_needs_no_lightning() -> None:
    code = "import sys\nimport attnlab.inference.translator\nprint('LIGHTNING', 'lightning' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "LIGHTNING False" in done.stdout, done


def test_shared_multi30k_matches_its_checksums(shared_data: Path) -> None:
    sums = [line.split() for line in (shared_data / "SHA256SUMS").read_text().splitlines() if line.strip()]
    assert len(sums) == 9
    for digest, name in sums:
        assert hashlib.sha256((shared_data / name).read_bytes()).hexdigest() == digest, name


def test_train_help_lists_every_config_group_without_composing(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from attnlab.cli.app import config_dir
    from attnlab.cli.train import main

    argv = sys.argv
    sys.argv = ["attnlab-train", "--help"]
    try:
        main()
    finally:
        sys.argv = argv
    text = capsys.readouterr().out
    assert text.startswith("`attnlab-train`: train and evaluate")
    for group in ("model", "data", "trainer", "experiment/table3", "hydra/launcher", "hparams_search"):
        options = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
        assert f"  {group}: {', '.join(options)}\n" in text
    assert "--hydra-help" in text


# The layers of src/attnlab (README "Architecture"), lowest first: a module may import its own layer and
# the ones below, never one above.
LAYERS = {
    "attnlab": 0, "attnlab.typed": 0, "attnlab.io": 0,
    "attnlab.model": 1, "attnlab.data": 1, "attnlab.decoding": 1, "attnlab.optim": 1, "attnlab.metrics": 1,
    "attnlab.runs": 2,
    "attnlab.inference": 3, "attnlab.interop": 3,
    "attnlab.training": 4,
    "attnlab.reports": 5,
    "attnlab.cli": 6,
}  # fmt: skip
SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"


def _layer(module: str) -> int:
    """The layer of a dotted module name: that of its longest prefix in `LAYERS`."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise AssertionError(f"{module} is in no layer of LAYERS: add it there and to the README")


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every attnlab module `path` imports (function-local ones too), with its line."""
    import ast

    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parents, base]).strip(".")
            found.append((base, node.lineno))
    return [(name, line) for name, line in found if name == "attnlab" or name.startswith("attnlab.")]


def test_every_module_imports_only_its_own_layer_and_lower_ones() -> None:
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        for name, line in _imports(path):
            if _layer(name) > _layer(module):
                where = f"{path.relative_to(SRC.parent)}:{line} ({module}, layer {_layer(module)})"
                upward.append(f"{where} imports {name} (layer {_layer(name)})")
    assert not upward, "imports pointing up a layer:\n" + "\n".join(upward)
    assert _layer("attnlab.training.pipeline") == 4 and _layer("attnlab.runs.layout") == 2


def _function_lengths() -> list[tuple[str, int, str]]:
    """(where, lines of code without the docstring, docstring) of every function in src/attnlab."""
    import ast

    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                first = node.body[1].lineno if doc and len(node.body) > 1 else node.body[0].lineno
                where = f"{path.relative_to(SRC.parent)}:{node.lineno} {node.name}"
                found.append((where, node.end_lineno - first + 1, doc))
    return found


def test_no_function_is_over_60_lines_without_saying_why() -> None:
    """A function body (docstring aside) over 60 lines says why in its docstring ("Long because ...")."""
    lengths = _function_lengths()
    long = [f"{where} ({n} lines)" for where, n, doc in lengths if n > 60 and "Long because" not in doc]
    assert not long, "functions over 60 lines without a reason in their docstring:\n" + "\n".join(long)
    assert any(n > 60 for _, n, _ in lengths), "the check must see beam_search's length"


# Imports that make start-up slow: a function-local import must lead to one of these (directly, or through
# the attnlab modules it imports at their top level), or say on its line why it is local (`# cycle: ...`).
HEAVY = ("torch", "lightning", "hydra", "wandb", "sacrebleu", "tokenizers", "matplotlib", "submitit",
         "datasets", "transformers", "numpy", "ctranslate2", "hydra_plugins", "sacremoses")  # fmt: skip


def _top_level_imports(path: Path) -> list[str]:
    import ast

    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _module_file(module: str) -> Path | None:
    relative = Path(*module.split("."))
    for candidate in (SRC.parent / relative.with_suffix(".py"), SRC.parent / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _heavy(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing `module` imports a HEAVY package (following attnlab's top-level imports)."""
    seen = set() if seen is None else seen
    if module.split(".")[0] in HEAVY:
        return True
    if module in seen or not module.startswith("attnlab"):
        return False
    seen.add(module)
    parts = module.split(".")
    parents = [".".join(parts[:n]) for n in range(1, len(parts))]  # importing a.b.c runs a and a.b first
    files = [f for f in (_module_file(m) for m in [*parents, module]) if f is not None]
    return any(_heavy(name, seen) for f in files for name in _top_level_imports(f))


def test_function_local_imports_only_defer_heavy_modules_or_say_why() -> None:
    import ast

    cheap = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or "#" in lines[node.lineno - 1]:
                    continue
                is_import = isinstance(node, ast.Import)
                modules = [a.name for a in node.names] if is_import else [node.module or ""]
                if not any(_heavy(m) for m in modules):
                    where = f"{path.relative_to(SRC.parent)}:{node.lineno} {function.name}"
                    cheap.append(f"{where}: {modules[0]}")
    assert not cheap, "function-local imports of cheap modules (import them at the top):\n" + "\n".join(cheap)
    assert _heavy("attnlab.training.module") and not _heavy("attnlab.typed")
