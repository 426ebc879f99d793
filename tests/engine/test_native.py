"""The compiled simulator (``engine.support.native``): used only while it matches the sources, and
then with the same results as the sources: the same report byte for byte, every number equal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.support import native

ROOT = Path(__file__).resolve().parents[2]

# A small backlog through the compiled modules or the sources: each mode's summary (as `plexrl sim
# --json` prints it) and its every finish and start time, usage record, held device-seconds, switch
# and event (a subprocess: enable() must come before any import).
RUN = """
import dataclasses, json, sys
from engine.support import native
why = native.enable() if sys.argv[1] == "compiled" else "sources"
from engine.sim.simulate import run_mode, summarise
from engine.sim.workload import PRESETS, generate_jobs, plan_all
w = dataclasses.replace(PRESETS["paper-math-backlog"], gpus=256)
plans = plan_all(w, generate_jobs(w, 24, 3))
out = {"compiled": native.compiled(), "why": why}
for sync in ("gang", "host"):
    r = run_mode("plexrl_backfill", w, plans, admission={"sync": sync})
    summary = {k: v for k, v in summarise(r, plans).items() if k not in ("wall_seconds", "events_per_s")}
    out[sync] = {"summary": json.dumps(summary), "facts": [sorted(r.finish.items()), sorted(r.start.items()),
                 r.held_device_s, r.switches, r.events, [rec.to_dict() for rec in r.usage]]}
print(json.dumps(out))
"""


def _run(kind: str) -> dict:
    p = subprocess.run([sys.executable, "-c", RUN, kind], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _fake_build(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the engine's sources and a build folder whose manifest matches them."""
    root = tmp_path / "src"
    shutil.copytree(ROOT / "engine", root / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    dest = tmp_path / "native"
    dest.mkdir()
    (dest / native.MANIFEST).write_text(json.dumps({"abi": native._abi(), "sources": native.digests(root)}))
    return root, dest


def test_a_build_that_matches_the_sources_is_not_stale(tmp_path):
    root, dest = _fake_build(tmp_path)
    assert native.stale(dest, root) is None


def test_digests_cover_the_compiled_modules_and_the_engine_modules_they_import():
    sources = native.digests()
    assert set(native.MODULES) <= set(sources)
    assert {"engine.api", "engine.scheduler.placement", "engine.sim.workload"} <= set(sources)
    assert sources["engine.api"] == hashlib.sha256((ROOT / "engine/api.py").read_bytes()).hexdigest()


@pytest.mark.parametrize("edit", ["engine/scheduler/core.py", "engine/api.py"])
def test_a_source_edited_since_the_build_makes_it_stale_and_names_the_module(tmp_path, edit):
    root, dest = _fake_build(tmp_path)
    with open(root / edit, "a") as f:
        f.write("\n# edited\n")
    why = native.stale(dest, root)
    assert why is not None
    assert edit[:-3].replace("/", ".") in why
    assert "make native" in why


def test_no_build_or_another_interpreters_build_is_stale(tmp_path):
    root, dest = _fake_build(tmp_path)
    assert "not built" in native.stale(tmp_path / "nowhere", root)
    manifest = json.loads((dest / native.MANIFEST).read_text())
    (dest / native.MANIFEST).write_text(json.dumps({**manifest, "abi": ".cpython-99-x.so"}))
    assert "another interpreter" in native.stale(dest, root)


def test_enable_keeps_the_sources_when_told_or_when_they_are_imported_already(tmp_path, monkeypatch):
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.PURE_ENV in native.enable()
    monkeypatch.delenv(native.PURE_ENV)
    dest = tmp_path / "native"  # a build that matches this checkout's sources
    dest.mkdir()
    (dest / native.MANIFEST).write_text(json.dumps({"abi": native._abi(), "sources": native.digests()}))
    import engine.scheduler.core  # noqa: F401  (as any test process has)

    assert "imported from its source already" in native.enable(dest)
    assert not native.compiled()


def test_plexrl_sim_says_whether_it_ran_compiled_and_why_not():
    env = {**os.environ, native.PURE_ENV: "1"}
    p = subprocess.run([sys.executable, "-m", "plexrl", "sim", "--gpus", "256", "--jobs", "4", "--set", "steps_min=2",
                        "--set", "steps_max=2", "--modes", "plexrl_backfill", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["sim_compiled"] is False
    assert native.PURE_ENV in report["sim_pure_python_because"]


@pytest.mark.skipif(native.stale() is not None, reason=f"no current compiled build: {native.stale()}")
def test_the_compiled_simulator_gives_the_sources_results():
    compiled, sources = _run("compiled"), _run("sources")
    assert compiled["compiled"] is True, compiled["why"]
    assert sources["compiled"] is False
    for sync in ("gang", "host"):
        assert compiled[sync]["summary"] == sources[sync]["summary"]  # the report, byte for byte
        # every number equal (a WPG's devices come out as 1.0 compiled, 1 from the sources: its field is a float)
        assert compiled[sync]["facts"] == sources[sync]["facts"]
