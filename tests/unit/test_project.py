"""Project contracts: the README's test command is what CI runs; every command and config key the README and
docs/ give exists; the shared-data policy."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from helpers import require_shared_data

ROOT = Path(__file__).resolve().parents[2]


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # the README and the pages it links


def bash_lines(block: str) -> list[str]:
    """A bash code block's command lines: continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [
        line
        for line in (re.sub(r"\s+#.*", "", x).strip() for x in joined.splitlines())
        if line and line[0] != "#"
    ]


def readme_commands() -> list[str]:
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no Quickstart bash block"
    return bash_lines(block.group(1))


def inline_code(text: str) -> list[str]:
    """The `code` spans of a Markdown text outside its code blocks, a span's line breaks as spaces."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


# A documented command: an attnlab command, a module run with -m, or a script of scripts/
PROGRAM = re.compile(r"attnlab-(train|eval|translate|compare|export)|attnlab\.cli\.(\w+)|scripts/[\w.]+")


def documented_commands() -> list[tuple[str, str]]:
    """(page, command line) of every command in the README's and docs' bash blocks, and every inline
    `code` span that starts with one (`attnlab-train data.root=...`, `python scripts/bench_data.py ...`)."""
    found = []
    for page in DOCS:
        text = page.read_text()
        lines = [x for block in re.findall(r"```bash\n(.*?)```", text, re.S) for x in bash_lines(block)]
        spans = [x for x in inline_code(text) if re.match(r"(python |bash )?(-m )?(attnlab-|scripts/)", x)]
        found += [(page.name, x) for x in lines + spans if any(PROGRAM.fullmatch(w) for w in x.split())]
    return sorted(set(found))


CONF = ROOT / "conf"
# A placeholder of a documented command (`<run>`, `<file.ckpt>`, `DIR`, `--root ...`): it stands for the
# user's own file or value, so the command is composed but not validated
NAMED = r"<(?! )[^<>]*(?<! )>"  # `<run>`, `<run a>`, not the redirections of `< in.de > out.txt`
PLACEHOLDER = re.compile(rf"{NAMED}|=[A-Z]+\b|\.\.\.")


def command_words(line: str) -> tuple[str, list[str]]:
    """The program of a documented command line (`train`, `eval`, ..., or a script's path) and its
    arguments, redirections (`< in.de > out.txt`) left out and Markdown's `a\\|b` (one of a, b) as `a|b`."""
    line = re.sub(NAMED, "PLACEHOLDER", line.split("&&")[-1].replace("\\|", "|"))
    words = shlex.split(line)
    start = next(i for i, word in enumerate(words) if PROGRAM.fullmatch(word))
    match = PROGRAM.fullmatch(words[start])
    rest = words[start + 1 :]
    redirected = [w for i, w in enumerate(rest) if w not in "<>" and (i == 0 or rest[i - 1] not in "<>")]
    args = [w for w in redirected if w != "PLACEHOLDER"]  # `attnlab-train <overrides>`
    return match.group(1) or match.group(2) or match.group(0), args


def _own_option(override: str) -> bool:
    """Whether `override` selects a config group option that conf/ does not hold (`experiment=my_study`)."""
    group, _, name = override.partition("=")
    return (CONF / group).is_dir() and not (CONF / group / f"{name}.yaml").is_file()


def check_hydra_command(app: str, args: list[str], line: str, run_dir: Path) -> None:
    """Hydra's parser takes the flags, and every job (each value of a sweep) composes: each key exists and
    each group option is in conf/ (or, with `--config-dir` or `hydra.searchpath`, the user's own); a
    training job without placeholders also passes the checks a run makes before it prepares data."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from attnlab.training.experiment import check_sweep_objective, validate
    from helpers import SHARED_DATA, compose_app

    parsed = get_args_parser().parse_args(args)
    checked = (
        app == "train" and not PLACEHOLDER.search(line) and ("../shared" not in line or SHARED_DATA.is_dir())
    )
    own = parsed.config_dir or any(o.startswith("hydra.searchpath=") for o in parsed.overrides)
    overrides = OverridesParser.create().parse_overrides(parsed.overrides)
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in overrides]  # fmt: skip
    first = [values[0] for values in choices]  # each value of a sweep once, the others at their first
    for job in [first, *([*first[:i], v, *first[i + 1 :]] for i, vs in enumerate(choices) for v in vs[1:])]:
        job = [o for o in job if not (own and _own_option(o))]
        with warnings.catch_warnings():  # hydra.searchpath=[file:///abs/path/my_conf]: the user's, not here
            warnings.simplefilter("ignore" if own else "default")
            cfg = compose_app(app, [f"paths.output_dir={run_dir}", *job], hydra_node=True)
        if checked:
            validate(cfg)
            check_sweep_objective(cfg.get("optimized_metric"), cfg.hydra.sweeper.get("direction"))


def check_command(program: str, args: list[str], line: str, run_dir: Path) -> None:
    """Raise if `program` would not take `args` as documented (see `check_hydra_command`): the key=value
    settings `attnlab-translate` reads, the flags `attnlab-compare --help` lists, a script's own options."""
    import contextlib
    import io

    if program in ("train", "eval", "export"):
        check_hydra_command(program, args, line, run_dir)
    elif program == "translate":
        from attnlab.cli.translate import parse_args

        parse_args(args)
    elif program == "compare":
        from attnlab.cli.compare import main

        with contextlib.redirect_stdout(io.StringIO()) as help_text, contextlib.suppress(SystemExit):
            main(["--help"])
        unknown = [w for w in args if w.startswith("-") and w not in help_text.getvalue().split()]
        assert not unknown, f"not in attnlab-compare --help: {unknown}"
    else:  # a script: each option is one its argument parser adds (gpu_check.sh passes them to gpu_check.py)
        source = (ROOT / program.replace(".sh", ".py")).read_text()
        flags = [w.strip("[]") for w in args if w.strip("[]").startswith("--")]
        unknown = [f for f in flags if f'"{f}"' not in source]
        assert not unknown, f"not options of {program}: {unknown}"


def transcripts() -> dict[str, str]:
    """The README's console transcripts (`$ command`, then the first line it prints): command -> line."""
    text = (ROOT / "README.md").read_text()
    return dict(re.findall(r"^\$ (attnlab-.+)\n(.+)$", text, re.M))


def test_every_documented_command_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command of the README and docs/ (code blocks and inline `attnlab-...` code) names flags its
    program has and config keys and options that exist: a renamed key or option fails here, not a reader.
    A command a transcript shows refused (`$ attnlab-train model.n_heads=3`) is refused with that line."""
    from attnlab.typed import ConfigError

    monkeypatch.chdir(ROOT)  # where the docs' relative paths (../shared/data/multi30k) start
    shown, wrong = transcripts(), []
    assert shown, "the README shows no refused command"
    pages = {
        line: page for page, line in reversed([*documented_commands(), *[("README.md", x) for x in shown]])
    }
    for line, page in sorted(pages.items()):  # (a command given on several pages is checked once)
        program, args = command_words(line)
        for alternative in _alternatives(args):
            try:
                check_command(program, alternative, line, tmp_path / "run")
                outcome = "accepted"
            except (Exception, SystemExit) as exc:
                outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if (
                    isinstance(exc, ConfigError)
                    and shown.get(line) == f"attnlab-{program}: config error: {exc}"
                ):
                    continue
            if line in shown:
                wrong.append(f"{page}: {line}\n    shown: {shown[line]}\n    got: {outcome}")
            elif outcome != "accepted":
                wrong.append(f"{page}: {line}\n    {outcome}")
    assert not wrong, "documented commands that do not do what the docs show:\n" + "\n".join(wrong)


def _alternatives(args: list[str]) -> list[list[str]]:
    """`key=a|b` (one of a, b, as a Markdown table writes it) as one argument list per choice."""
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        if "|" in value and not value.startswith(("'", '"', "[")):
            return [
                a
                for choice in value.split("|")
                for a in _alternatives([*args[:i], f"{key}={choice}", *args[i + 1 :]])
            ]
    return [args]


def conf_keys() -> set[str]:
    """Every key conf/ holds, dotted from the root of the config its file composes into (its group, or
    the root for `# @package _global_`), `defaults` lists left out."""
    import yaml

    def walk(node: object, prefix: str) -> set[str]:
        items = node.items() if isinstance(node, dict) else []
        return {f"{prefix}{k}" for k, _ in items} | {x for k, v in items for x in walk(v, f"{prefix}{k}.")}

    keys = set()
    for path in CONF.rglob("*.yaml"):
        text = path.read_text()
        header = re.search(r"^# @package (\S+)", text, re.M)
        package = header.group(1) if header else ".".join(path.parent.relative_to(CONF).parts)
        prefix = "" if package in ("_global_", "") else f"{package}."
        keys |= walk({k: v for k, v in (yaml.safe_load(text) or {}).items() if k != "defaults"}, prefix)
    return keys


def test_every_config_key_the_docs_name_exists() -> None:
    """A key the README or docs/ name in `code` (`progress.every_n_seconds`, `data.tokenizer_sample=N`)
    is one conf/ holds; `+key` marks a key added on purpose (the docs' misspelt and refused examples)."""
    keys = conf_keys()
    roots = "|".join(sorted({key.split(".")[0] for key in keys if "." in key} - {"hydra"}))
    reference = re.compile(rf"(?<![\w./<$+-])((?:{roots})\.[A-Za-z_]\w*(?:\.\w+)*)(?![\w(.])")
    named = {
        (page.name, m)
        for page in DOCS
        for span in inline_code(page.read_text())
        for m in reference.findall(span)
    }
    missing = sorted(f"{page}: {key}" for page, key in named if key not in keys and not key.endswith(".py"))
    assert len(named) > 50 and "progress.every_n_seconds" in {key for _, key in named}
    assert not missing, "config keys the docs name that conf/ does not hold:\n" + "\n".join(missing)


def test_every_python_name_and_test_file_the_docs_give_exists() -> None:
    """Each `attnlab.<module>.<name>` of the README and docs/ (prose and Python blocks) resolves, and each
    `test_*.py` they cite as the evidence of a promise is a file of tests/."""
    import importlib

    named, cited = set(), set()
    for page in DOCS:
        text = page.read_text()
        code = [*inline_code(text), *re.findall(r"```python\n(.*?)```", text, re.S)]
        named |= {(page.name, m) for span in code for m in re.findall(r"(?<![\w.])attnlab(?:\.\w+)+", span)}
        cited |= {(page.name, m) for span in code for m in re.findall(r"\btest_\w+\.py\b", span)}
    wrong = []
    for page, name in sorted(named):
        parts = name.split(".")
        for found in range(len(parts), 0, -1):  # the longest module of the name, then its attributes
            try:
                obj = importlib.import_module(".".join(parts[:found]))
                break
            except ImportError:
                continue
        for i, attribute in enumerate(parts[found:]):
            if not hasattr(obj, attribute):
                wrong.append(f"{page}: {name} ({'.'.join(parts[: found + i])} has no {attribute})")
                break
            obj = getattr(obj, attribute)
    tests = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    wrong += [f"{page}: {name} is no test file" for page, name in sorted(cited) if name not in tests]
    assert len(named) > 50 and len(cited) > 10, (len(named), len(cited))
    assert not wrong, "names the docs give that do not exist:\n" + "\n".join(wrong)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    main_job, tests = readme_commands()
    assert main_job.endswith("attnlab-train")
    test_command = tests.split("&&")[-1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
    assert "python -m pip install --quiet torch==2.13.0" in ci_lines  # the CPU wheel before the project
    # CI sets CI=true itself (whatever its caller set), so tests that read ../shared/data fail without it
    assert "export CI=true" in ci_lines and ci_lines.index("export CI=true") < ci_lines.index(test_command)


def test_the_readme_test_command_runs_slow_tests_and_the_notebooks(request: pytest.FixtureRequest) -> None:
    """README, Tests: `python -m pytest` (CI's command) runs the `slow` tests too, deselecting nothing by
    marker, keyword or path, and runs each notebook of notebooks/ as a test (`--nbmake`)."""
    addopts = shlex.split(" ".join(request.config.getini("addopts")))
    leaving_out = ("-m", "-k", "--deselect", "--ignore", "--ignore-glob")
    deselecting = [x for x in addopts if x.split("=")[0] in leaving_out]
    assert not deselecting, f"pytest's addopts leave tests out of `python -m pytest`: {deselecting}"
    assert "--nbmake" in addopts and "notebooks" in request.config.getini("testpaths"), addopts
    assert list((ROOT / "notebooks").glob("*.ipynb"))


def test_each_worker_of_the_ci_command_gets_its_share_of_the_cpus() -> None:
    """README, Tests: under `python -m pytest -n auto` (CI's command: `PYTEST_XDIST_WORKER_COUNT` workers),
    each worker's torch and the processes its tests start (`OMP_NUM_THREADS`) get the CPUs divided by the
    workers (at least 1), not every CPU each; run alone, torch keeps its own count."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        assert (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")) == (share, str(share))


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
    tops = {f"attnlab.{path.name.removesuffix('.py')}" for path in SRC.iterdir() if _is_module(path)}
    unplaced = tops - set(LAYERS)  # else a new package falls under "attnlab", layer 0
    assert not unplaced, f"top-level modules of src/attnlab in no layer of LAYERS: {sorted(unplaced)}"


def test_only_the_checkpoint_reader_calls_torch_load() -> None:
    """README, Architecture: runs/checkpoint.py is the one safe checkpoint reader (`weights_only=True`); no
    other module of src/attnlab calls `torch.load`."""
    import ast

    callers, loads = set(), {"torch.load", "torch.serialization.load"}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in loads:
                callers.add(str(path.relative_to(SRC)))
    assert callers == {"runs/checkpoint.py"}, callers


def test_reports_read_run_files_only_through_runs() -> None:
    """README, Architecture: reports read runs only through `runs/` (its names and readers in
    `runs/layout.py`): no module of src/attnlab/reports opens, reads or parses a file itself."""
    import ast

    readers = {"open", "read_text", "read_bytes", "load", "loads", "safe_load", "reader", "DictReader"}
    found = set()
    for path in (SRC / "reports").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in readers:
                    found.add(f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(node.func)}")
    assert not found, found


def _is_module(path: Path) -> bool:
    """Whether `path` is a Python module (`name.py`, not `__init__.py`) or a package (a folder with one)."""
    if path.is_dir():
        return (path / "__init__.py").is_file()
    return path.suffix == ".py" and path.name != "__init__.py"


def architecture_names() -> tuple[set[str], set[str]]:
    """The packages (`training/`) and module files (`training/console.py`) the README's Architecture diagram
    names, relative to src/attnlab. A file belongs to the package that opens its parenthesis
    (`model/ (attention.py, ...)`), else to its entry's package (`training/   experiment.py`); entries
    labelled `library:` or `base:` name top-level modules."""
    block = re.search(r"## Architecture.*?```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no Architecture diagram"
    packages, files, entry, scopes, opened = set(), set(), "", [], ""
    for line in block.group(1).splitlines():
        label = re.match(r"(\w+)([/:])", line)
        if label:  # a new entry (layer) of the diagram
            entry, scopes = (label.group(1) + "/" if label.group(2) == "/" else ""), []
        for token in re.finditer(r"(?<![\w/.])(\w+)/(?=\s|$)|(?<![\w/.])(\w+\.py)\b|[()]", line):
            package, module, mark = token.group(1), token.group(2), token.group(0)
            if package:
                packages.add(package + "/")
                opened = package + "/"
            elif module:
                files.add((scopes[-1] if scopes else entry) + module)
            elif mark == "(":
                scopes.append(opened or (scopes[-1] if scopes else entry))
            elif scopes:
                scopes.pop()
            opened = opened if package else ""
    return packages, files


def test_the_readme_architecture_names_every_module_and_only_existing_ones() -> None:
    """README, Architecture: each package and module of src/attnlab is named in the diagram, in the folder it
    is in, and each one the diagram names exists there; a package of src/ beside attnlab (Hydra's plugin
    namespace) is named by its path."""
    packages, files = architecture_names()
    modules = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name != "__init__.py"}
    folders = {str(p.relative_to(SRC)) + "/" for p in SRC.rglob("*") if p.is_dir() and _is_module(p)}
    named, present = files | packages, modules | folders
    wrong = [f"{name}: named in the diagram, not in src/attnlab" for name in sorted(named - present)]
    wrong += [f"src/attnlab/{name}: not named in the diagram" for name in sorted(present - named)]
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Architecture") : readme.index("## Using it")]
    beside = [f"src/{p.name}/{q.name}" for p in (ROOT / "src").iterdir() if p.is_dir() and p.name != "attnlab"
              for q in p.iterdir() if _is_module(q)]  # fmt: skip
    wrong += [f"{name}: not named in the diagram" for name in beside if name not in block]
    assert len(files) > 40 and beside, (files, beside)
    assert not wrong, "README Architecture against src/:\n" + "\n".join(wrong)


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


def test_the_readme_names_every_entry_and_manifest_field_a_run_writes(resume_reference: Path) -> None:
    """README, "Run directory": each top-level entry of a real `attnlab-train` run's directory (the
    session's `resume_reference`), each file of its `csv/` and each field of its `manifest.json` is named
    there in `code` (`train.log`, `.lock`, `csv/hparams.yaml`, `effective_batch`, `allocator` and
    `overrides` were not): a new file or field the README leaves out fails here."""
    import json

    section = re.search(r"^## Run directory\n(.*?)^## ", (ROOT / "README.md").read_text(), re.S | re.M)
    assert section, "README.md has no Run directory section"
    named = set(inline_code(section.group(1)))
    probe = "final_weights_rank0.pt"  # the test run's own `probes.SaveFinalWeights`, no run's file
    written = [p.name + "/" * p.is_dir() for p in resume_reference.iterdir() if p.name != probe]
    written += [f"csv/{p.name}" for p in (resume_reference / "csv").iterdir()]
    unnamed = [p for p in written if not any(n == p or (p.endswith("/") and n.startswith(p)) for n in named)]
    fields = json.loads((resume_reference / "manifest.json").read_text())
    assert {"status", "effective_batch", "allocator", "overrides"} <= set(fields) and "train.log" in written
    assert not unnamed, f"README, Run directory, leaves out what a run writes: {unnamed}"
    left_out = sorted(key for key in fields if key not in named)
    assert not left_out, f"README, Run directory, leaves out the manifest's fields: {left_out}"
