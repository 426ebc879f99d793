"""The simulator's hot modules compiled to C with mypyc, used only where they match the sources.

A simulated mode runs millions of scheduler decisions, and its time is spread thinly over the
scheduler core, the placer and the simulator's event loop: no one function is worth rewriting.
mypyc (mypy's compiler, the one black and mypy ship their wheels with) compiles those modules from
the same type-annotated sources, so the simulator and the live engine still run one implementation
of the policy; compiled, the same mode runs about twice as fast, and its report is the same byte for
byte (``tests/engine/test_native.py``).

``build()`` (``make native``, optional: not part of ``make install``) compiles ``MODULES`` into ``build/native/``
beside a manifest of the sources' digests; nothing is written next to the sources. ``enable()``
puts that folder first on the packages' search path, for the process that calls it, and only if
the manifest still matches every module compiled and every engine module they import: a module
edited since the build runs from its source (the reason is returned), never stale. Callers:
``plexrl sim`` and the simulator's benchmarks, before they import the simulator. Everything else
(the live engine, the tests) runs the sources. ``PLEXRL_PURE_PYTHON=1`` turns it off.

    python -m engine.support.native [--force] [-v]   # build unless current (what ``make native`` runs)
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Compiled together, in one shared library (they call each other natively).
MODULES = (
    "engine.accounting.metering",
    "engine.scheduler.resources",
    "engine.scheduler.alignment",
    "engine.scheduler.core",
    "engine.scheduler.admission",
    "engine.sim.simulate",
)
ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the engine package
DEFAULT_DIR = ROOT / "build" / "native"
MANIFEST = "manifest.json"
PURE_ENV = "PLEXRL_PURE_PYTHON"


def _source(module: str, root: Path = ROOT) -> Path:
    return root / (module.replace(".", "/") + ".py")


def _engine_imports(module: str, root: Path) -> set[str]:
    """The engine modules ``module``'s source imports (at any depth of its code)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(_source(module, root).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("engine.") and _source(name, root).is_file()}


def digests(root: Path = ROOT) -> dict[str, str]:
    """SHA-256 of each compiled module's source and of every engine module they import, directly
    or not: what a build depends on."""
    seen: set[str] = set()
    todo = list(MODULES)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_engine_imports(module, root) - seen)
    return {m: hashlib.sha256(_source(m, root).read_bytes()).hexdigest() for m in sorted(seen)}


def _abi() -> str:
    """What a compiled module must match: this interpreter's extension suffix."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def stale(dest: Path = DEFAULT_DIR, root: Path = ROOT) -> str | None:
    """Why the build in ``dest`` may not be used (None: it matches the sources)."""
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return f"not built ({dest} has no {MANIFEST}; run `make native`)"
    if manifest.get("abi") != _abi():
        return f"built for another interpreter ({manifest.get('abi')}, this one takes {_abi()})"
    built, current = manifest.get("sources", {}), digests(root)
    changed = sorted(m for m in set(built) | set(current) if built.get(m) != current.get(m))
    return f"{changed[0]} changed since the build (run `make native`)" if changed else None


def build(dest: Path = DEFAULT_DIR, *, verbose: bool = False) -> Path:
    """Compile ``MODULES`` into ``dest`` (replaced whole, only once the build succeeded).

    The sources are copied into a scratch folder and compiled there, so neither the build's
    intermediate files nor the compiled modules ever lie beside the sources (where Python would
    prefer them to the sources)."""
    sources = digests()
    with tempfile.TemporaryDirectory(prefix="plexrl-native-") as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "engine", work / "engine", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        files = [str(_source(m, Path("."))) for m in MODULES]
        run = subprocess.run([sys.executable, "-m", "mypyc", *files], cwd=work, text=True,
                             stdout=None if verbose else subprocess.PIPE, stderr=subprocess.STDOUT)
        if run.returncode != 0:
            tail = (run.stdout or "").strip().splitlines()[-20:]
            raise RuntimeError("mypyc failed:\n" + "\n".join(tail))
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for lib in work.glob(f"*{_abi()}"):  # the shared library the modules' stubs load
            shutil.copy2(lib, staging / lib.name)
        for module in MODULES:
            compiled = work / (module.replace(".", "/") + _abi())
            target = staging / compiled.relative_to(work)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(compiled, target)
        (staging / MANIFEST).write_text(json.dumps({"abi": _abi(), "sources": sources}, indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    return dest


def enable(dest: Path = DEFAULT_DIR) -> str | None:
    """Use the compiled modules in this process from now on; returns None if they are, else why
    not (the sources run). Call before anything imports one of ``MODULES``."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    why = stale(dest)
    if why is not None:
        return why
    loaded = [m for m in MODULES if m in sys.modules]
    if loaded:
        return f"{loaded[0]} was imported from its source already"
    if str(dest) not in sys.path:
        sys.path.append(str(dest))  # the shared library, under a name of its own
    # each package's search path, and the folder of its compiled modules
    paths = [(importlib.import_module(name).__path__, str(dest / name.replace(".", "/")))
             for name in sorted({m.rpartition(".")[0] for m in MODULES})]
    for path, folder in paths:
        path.insert(0, folder)
    try:
        for module in MODULES:
            importlib.import_module(module)
    except ImportError as exc:  # a build this interpreter cannot load: back to the sources
        for module in MODULES:
            sys.modules.pop(module, None)
        for path, folder in paths:
            path.remove(folder)
        return f"the build does not load ({exc})"
    return None


def compiled() -> bool:
    """Whether this process runs the compiled modules."""
    core = sys.modules.get("engine.scheduler.core")
    return core is not None and not str(getattr(core, "__file__", "")).endswith(".py")


def main() -> int:
    if stale() is None and "--force" not in sys.argv[1:]:
        print(f"{DEFAULT_DIR} matches the sources (--force builds it again)")
        return 0
    try:
        where = build(verbose="-v" in sys.argv[1:])
    except (RuntimeError, OSError) as exc:
        print(f"native build: {exc}", file=sys.stderr)
        return 1
    print(f"compiled {len(MODULES)} modules into {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
