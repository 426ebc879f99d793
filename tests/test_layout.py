"""Layout rules: platform/ is a source root, the engine stays Django-free, lint passes.

The AST checks repeat two import-linter contracts on purpose: they also see imports inside
functions and ``importlib.import_module("...")`` calls, and they run without any configuration.
"""

import ast
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "engine"
VENV_BIN = Path(sys.executable).parent

# Top-level names the engine must never import (docs/architecture.md §2).
PLATFORM_SIDE = {
    "django",
    "rest_framework",
    "channels",
    "celery",
    "accounts",
    "jobs",
    "billing",
    "config",
}


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, **kwargs)


# --- platform/ is a source root, never the package `platform` ------------------------------------


@pytest.mark.parametrize(
    ("code", "pythonpath"),
    [
        # As pytest and servers see it: platform/ and the repo root on the path, cwd = repo root.
        ("import platform; print(platform.__file__); platform.system()", True),
        # As manage.py, asgi.py and wsgi.py see it: the helper puts platform/ on the path.
        (
            "import platform_path; platform_path.add_platform_to_path(); import platform, uuid;"
            " print(platform.__file__); uuid.uuid4()",
            False,
        ),
    ],
    ids=["pythonpath", "path-helper"],
)
def test_platform_imports_the_stdlib_module(code, pythonpath):
    # A subprocess: pytest itself imports `platform` early, so an in-process check proves nothing.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "platform"), str(REPO)])
    result = _run([sys.executable, "-c", code], env=env)
    assert result.returncode == 0, result.stderr
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(result.stdout.strip()).resolve() == stdlib / "platform.py"


def test_platform_dir_is_a_source_root_not_a_package():
    assert (REPO / "platform").is_dir()
    assert not (REPO / "platform" / "__init__.py").exists()
    loose = sorted(p.name for p in (REPO / "platform").glob("*.py"))
    assert loose == [], f"platform/ holds only apps and config/, found modules {loose}"


def test_path_helper_is_idempotent(monkeypatch):
    import platform_path

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(platform_path.PLATFORM_DIR)])
    assert platform_path.add_platform_to_path() == REPO / "platform"
    platform_path.add_platform_to_path()
    assert sys.path.count(str(REPO / "platform")) == 1
    assert sys.path[0] == str(REPO / "platform")


# --- import rules, checked on the source ---------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> Iterator[str]:
    """Absolute names of what ``source`` (the code of ``module``) imports, anywhere in the file.

    ``from a import b`` yields ``a.b`` (b may be a submodule); relative imports are resolved;
    ``importlib.import_module("x")`` and ``__import__("x")`` with a literal name count too.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = node.module or ""
            for alias in node.names:
                yield base if alias.name == "*" else f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            yield node.args[0].value


def platform_side_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    return [
        name
        for name in imported_modules(source, module, is_package=is_package)
        if name.split(".")[0] in PLATFORM_SIDE
    ]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# What algorithm code may import of the engine: the function API, its own spec (GRPOConfig) and the
# tasks (problems, verifiers, the calculator: pure code), besides engine.rl itself.
RL_MAY_IMPORT = ("engine.client", "engine.spec", "engine.tasks", "engine.rl")


def rl_engine_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Imports of engine modules other than those algorithm code may use (``RL_MAY_IMPORT``)."""
    return [
        name
        for name in imported_modules(source, module, is_package=is_package)
        if _within(name, "engine") and not any(_within(name, allowed) for allowed in RL_MAY_IMPORT)
    ]


def _engine_sources(root: Path) -> list[tuple[Path, str, str, bool]]:
    return [
        (path, path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")
        for path in sorted(root.rglob("*.py"))
    ]


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import django", ["django"]),
        ("def f():\n    from rest_framework import serializers", ["rest_framework.serializers"]),
        ("import importlib\nimportlib.import_module('accounts.models')", ["accounts.models"]),
        ("from config.settings import X", ["config.settings.X"]),
        ("import celery.app as c", ["celery.app"]),
        ("import djangoish\nfrom . import config\nfrom engine import config", []),
    ],
)
def test_platform_side_import_checker(source, found):
    assert platform_side_imports(source, "engine.workers.base") == found


@pytest.mark.parametrize(
    ("source", "module", "found"),
    [
        ("from engine import client\nfrom engine.client import Model", "engine.rl.grpo", []),
        ("from .. import client\nfrom ..client import Model", "engine.rl.grpo", []),
        ("from . import tasks\nfrom .rewards import r\nimport engine.rl.tasks", "engine.rl.x", []),
        ("from .. import workers", "engine.rl.grpo", ["engine.workers"]),
        ("from ..state.store import S", "engine.rl.grpo", ["engine.state.store.S"]),
        ("from ...scheduler import p", "engine.rl.algos.grpo", ["engine.scheduler.p"]),
        ("def f():\n    import engine.scheduler.router", "engine.rl.grpo", ["engine.scheduler.router"]),
        ("import engine", "engine.rl.grpo", ["engine"]),
        ("from engine import errors", "engine.rl.grpo", ["engine.errors"]),
        ("from .. import paths", "engine.rl", ["engine.paths"]),  # from engine/rl/__init__.py
        ("from engine.spec import GRPOConfig\nfrom engine.tasks.registry import get_task", "engine.rl.grpo", []),
        ("from ..tasks import tools\nfrom engine.control import EngineClient", "engine.rl.grpo",
         ["engine.control.EngineClient"]),
        ("from engine.api import Batch", "engine.rl.grpo", ["engine.api.Batch"]),
    ],
)
def test_rl_import_checker(source, module, found):
    is_package = module == "engine.rl"
    assert rl_engine_imports(source, module, is_package=is_package) == found


def test_engine_never_imports_the_platform_side():
    sources = _engine_sources(ENGINE)
    assert sources, "engine/ has no Python files"
    offenders = {
        str(path.relative_to(REPO)): found
        for path, source, module, is_package in sources
        if (found := platform_side_imports(source, module, is_package=is_package))
    }
    assert offenders == {}, "engine must not import Django or the platform (docs/architecture.md §2)"


def test_rl_uses_only_the_client_api():
    offenders = {
        str(path.relative_to(REPO)): found
        for path, source, module, is_package in _engine_sources(ENGINE / "rl")
        if (found := rl_engine_imports(source, module, is_package=is_package))
    }
    assert offenders == {}, "engine/rl may import only the function API, its spec and the tasks (architecture §6)"


# --- lint is part of the test suite --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [["ruff", "check", "."], ["lint-imports", "--no-cache", "--no-logo"]],
    ids=["ruff", "import-linter"],
)
def test_lint_passes(argv):
    # platform/ on the path: the Django apps are packages of import-linter's graph
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
    result = _run([str(VENV_BIN / argv[0]), *argv[1:]], env=env)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the architecture: layers, cycles, names, the page that draws them ---------------------------

APPS = ("accounts", "jobs", "billing", "config")
HEAVY = ("torch", "ray", "vllm")
MAX_TOP_LEVEL_MODULES = 8
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_MARK = "# one piece:"  # on a longer function's def line or first body line: why it stays whole


def _project_modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the project by its import name: engine's, the apps' (as Django imports them)
    and the root's, with its file and whether it is a package."""
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        found[_module_name(path)] = (path, path.name == "__init__.py")
    for path in sorted((REPO / "platform").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(REPO / "platform").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = (path, path.name == "__init__.py")
    for path in sorted(REPO.glob("*.py")):
        found[path.stem] = (path, False)
    return found


def import_graph(modules: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """``{module: modules of the project it imports}`` from the sources (``{name: (source, is_package)}``),
    imports inside functions included; ``from a import b`` counts as a.b when that is a module, else a."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (source, is_package) in modules.items():
        for target in imported_modules(source, name, is_package=is_package):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_cycle_finder_names_a_cycle_through_a_lazy_import():
    modules = {
        "pkg": ("", True),
        "pkg.a": ("from pkg.b import thing", False),
        "pkg.b": ("def f():\n    from pkg import c", False),
        "pkg.c": ("import pkg.a.nothing_here", False),
        "pkg.d": ("from pkg import a", False),
    }
    assert import_cycles(import_graph(modules)) == [["pkg.a", "pkg.b", "pkg.c"]]
    modules["pkg.c"] = ("", False)
    assert import_cycles(import_graph(modules)) == []


def test_no_module_takes_part_in_an_import_cycle():
    sources = {name: (path.read_text(encoding="utf-8"), is_package)
               for name, (path, is_package) in _project_modules().items()}
    cycles = import_cycles(import_graph(sources))
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_control_plane_loads_no_torch_ray_or_vllm():
    # A fresh interpreter with the settings loaded: every module of the apps (services, selectors,
    # views, tasks, consumers, ...), the URL configuration and the ASGI application.
    names = sorted(name for name in _project_modules() if name.split(".")[0] in APPS
                   and ".management" not in name and name != "config.embedded")
    code = (
        "import importlib, os, sys, django\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings')\n"
        "django.setup()\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules) or '-')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
    result = _run([sys.executable, "-c", code], env=env)
    assert result.returncode == 0, result.stderr
    assert {"jobs.services", "jobs.selectors", "jobs.views", "jobs.tasks", "billing.tasks"} <= set(names)
    assert result.stdout.split()[-1] == "-", f"the control plane imported {result.stdout.split()[-1]}"


def _engine_parts() -> tuple[list[str], list[str]]:
    """The engine's top-level modules and its packages, by name."""
    modules = sorted(p.stem for p in ENGINE.glob("*.py") if p.name != "__init__.py")
    packages = sorted(p.name for p in ENGINE.iterdir() if (p / "__init__.py").is_file())
    return modules, packages


def test_the_engine_top_holds_at_most_eight_modules():
    modules, packages = _engine_parts()
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, f"engine/ holds {len(modules)} modules: {modules}"
    assert packages, "engine/ has no packages"


def test_no_two_engine_modules_share_a_name():
    names: dict[str, list[str]] = {}
    for path in ENGINE.rglob("*.py"):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        names.setdefault(name, []).append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert shared == {}


def _layers() -> list[str]:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")]


def test_every_engine_package_and_top_module_is_a_layer():
    modules, packages = _engine_parts()
    assert sorted(_layers()) == sorted(f"engine.{name}" for name in modules + packages)


def _page_tree() -> dict[str, list[str]]:
    """docs/architecture.md's tree of engine/: ``{top-level module or package/: its modules}``."""
    page = (REPO / "docs" / "architecture.md").read_text()
    block = page.split("```text\nengine/\n", 1)[1].split("```", 1)[0]
    tree = {}
    for line in block.splitlines():
        first, _, rest = line.strip().partition(" ")
        tree[first] = sorted(rest.split()) if first.endswith("/") else []
    return tree


def test_the_architecture_page_draws_the_engine_as_it_is():
    modules, packages = _engine_parts()
    actual = {f"{m}.py": [] for m in modules}
    for package in packages:
        actual[f"{package}/"] = sorted(p.name for p in (ENGINE / package).glob("*.py") if p.name != "__init__.py")
    assert _page_tree() == actual


def test_the_readme_layout_names_every_engine_package():
    readme = (REPO / "README.md").read_text()
    layout = readme.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    modules, packages = _engine_parts()
    missing = [f"{p}/" for p in packages if f"{p}/" not in layout] + [f"{m}.py" for m in modules
                                                                       if f"{m}.py" not in layout]
    assert missing == []


def test_functions_stay_short():
    long = []
    for path in [*ENGINE.rglob("*.py"), *(REPO / "platform").rglob("*.py")]:
        if "migrations" in path.parts:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                marked = any(LONG_FUNCTION_MARK in lines[i - 1] for i in (node.lineno, node.body[0].lineno))
                if length > MAX_FUNCTION_LINES and not marked:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


def test_the_repository_points_at_no_document_outside_it():
    outside = ("../shared", "DESIGN.md", "DESIGN section", "WORKLOADS.md", "STACK.md", "STYLE.md")
    this_file = Path(__file__).resolve()
    found = []
    for folder in ("engine", "platform", "frontend", "tests", "docs"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".html", ".js", ".toml"} and path.resolve() != this_file:
                text = path.read_text(encoding="utf-8", errors="replace")
                found += [f"{path.relative_to(REPO)}: {word}" for word in outside if word in text]
    readme = (REPO / "README.md").read_text()
    found += [f"README.md: {word}" for word in outside if word in readme]
    assert found == []


def _test_modules() -> list[Path]:
    return sorted(p for p in (REPO / "tests").rglob("*.py") if p.name != "conftest.py")


def test_test_files_have_names_of_their_own():
    by_name: dict[str, list[str]] = {}
    for path in _test_modules():
        by_name.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_tests_take_shared_data_from_helpers_not_from_other_tests():
    offenders = []
    for path in (REPO / "tests").rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for name in imported_modules(path.read_text(encoding="utf-8"), module):
            leaf = [part for part in name.split(".") if part.startswith(("test_", "conftest"))]
            if name.startswith("tests.") and leaf:
                offenders.append(f"{path.relative_to(REPO)} imports {name}")
    assert offenders == []


@pytest.mark.parametrize("module", ["engine.spec", "engine.accounting.estimate", "engine.control", "engine.errors"])
def test_the_engine_front_doors_import_without_torch_ray_or_vllm(module):
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules) or '-')"
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "-", f"importing {module} loaded {result.stdout.split()[-1]}"
