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

# Top-level names the engine must never import (DESIGN.md section 2).
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
            "import plexrl; plexrl.add_platform_to_path(); import platform, uuid;"
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
    import plexrl

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plexrl.PLATFORM_DIR)])
    assert plexrl.add_platform_to_path() == REPO / "platform"
    plexrl.add_platform_to_path()
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


def rl_engine_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Imports of engine modules other than engine.client (and engine.rl itself)."""
    return [
        name
        for name in imported_modules(source, module, is_package=is_package)
        if _within(name, "engine")
        and not _within(name, "engine.client")
        and not _within(name, "engine.rl")
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
        ("def f():\n    import engine.router", "engine.rl.grpo", ["engine.router"]),
        ("import engine", "engine.rl.grpo", ["engine"]),
        ("from engine import errors", "engine.rl.grpo", ["engine.errors"]),
        ("from .. import paths", "engine.rl", ["engine.paths"]),  # from engine/rl/__init__.py
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
    assert offenders == {}, "engine must not import Django or the platform (DESIGN.md section 2)"


def test_rl_uses_only_the_client_api():
    offenders = {
        str(path.relative_to(REPO)): found
        for path, source, module, is_package in _engine_sources(ENGINE / "rl")
        if (found := rl_engine_imports(source, module, is_package=is_package))
    }
    assert offenders == {}, "engine/rl may import from engine only engine.client (DESIGN.md 3)"


# --- lint is part of the test suite --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [["ruff", "check", "."], ["lint-imports", "--no-cache", "--no-logo"]],
    ids=["ruff", "import-linter"],
)
def test_lint_passes(argv):
    result = _run([str(VENV_BIN / argv[0]), *argv[1:]])
    assert result.returncode == 0, result.stdout + result.stderr
