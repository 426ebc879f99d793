"""Run every deployment mode on the same jobs and report cost, completion and utilisation.

Billing is ``engine.accounting.metering``'s: device-seconds of usage records (a dedicated job's reservation,
a shared job's calls with their switch time). The work floor comes from the workload's draws
(``StepPlan.work_floor_device_s``), not from any run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.sim.simulate import MODES, SHARED_MODES, Busy, ModeResult, run_mode, summarise
from engine.sim.workload import Job, Workload, plan_all

# The paper's figures the report sits beside (docs/workloads.md, "The paper's own setting").
PAPER = {
    "cost_vs_async_split": "-31.36 % ... -37.58 %",
    "completion_vs_isolated": "56.0 %",
    "actual_over_peak_plexrl": "75.03 %",
    "actual_over_peak_colocated": "52.74 %",
}
GOALS = {"cost_vs_async_split": 0.55, "completion_vs_isolated": 0.50, "billed_over_floor": 1.10}
UTILISATION_BINS = 100


def simulate(w: Workload, jobs: list[Job], *, modes: Sequence[str] = MODES, admission: dict[str, Any] | None = None,
             progress: Callable[[str | None], None] | None = None) -> dict[str, Any]:
    """``progress(mode)`` as each mode starts, ``progress(None)`` as each job completes in it;
    ``admission``: fields of the shared modes' ``AdmissionPolicy`` that differ from its defaults."""
    t0 = time.perf_counter()
    plans = plan_all(w, jobs)
    results: dict[str, ModeResult] = {}
    for mode in modes:
        if progress:
            progress(mode)
        extra = {"admission": admission} if mode in SHARED_MODES else {}
        results[mode] = run_mode(mode, w, plans, on_done=(lambda: progress(None)) if progress else None, **extra)
    floor = sum(p.work_floor_device_s() for p in plans)
    out: dict[str, Any] = {
        "workload": w.name,
        "jobs": len(jobs),
        "gpus": w.gpus,
        "modes": {m: summarise(r, plans) for m, r in results.items()},
        "work_floor_device_hours": floor / 3600,
        "sim_wall_seconds": time.perf_counter() - t0,
        "parameters": w.params(),
        "job_classes": {c.name: sum(j.cls == c.name for j in jobs) for c in w.classes},
    }
    out["comparison"] = compare(out)
    out["utilisation"] = utilisation(results, w.gpus)
    return out


def compare(report: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios beside the paper's figures and the issue's goals (None: a mode is missing)."""
    m = report["modes"]

    def ratio(a: str, b: str, key: str) -> float | None:
        return m[a][key] / m[b][key] if a in m and b in m and m[b][key] else None

    floor = report["work_floor_device_hours"]
    return {
        "cost_vs_async_split": ratio("plexrl", "async_split", "device_hours"),
        "cost_vs_async_split_backfill": ratio("plexrl_backfill", "async_split", "device_hours"),
        "completion_vs_isolated": ratio("plexrl_backfill", "isolated_split", "total_completion_s"),
        "completion_vs_isolated_no_backfill": ratio("plexrl", "isolated_split", "total_completion_s"),
        "actual_over_peak_plexrl": m["plexrl"]["actual_over_peak"] if "plexrl" in m else None,
        "actual_over_peak_colocated": m["colocated"]["actual_over_peak"] if "colocated" in m else None,
        "billed_over_floor": {mode: s["device_hours"] / floor for mode, s in m.items()} if floor else None,
        "held_over_floor": {mode: s["held_device_hours"] / floor for mode, s in m.items()} if floor else None,
        "paper": PAPER,
        "goals": GOALS,
    }


def utilisation(results: dict[str, ModeResult], gpus: int) -> dict[str, Any]:
    """Fractions of the cluster's devices computing (``computing``) and billed (``billed``: held
    by reservations, or by the calls of shared modes), per mode, in equal bins from 0 to the last
    completion of any mode."""
    end = max(max(r.finish.values()) for r in results.values())
    edges = np.linspace(0.0, end, UTILISATION_BINS + 1)
    scale = gpus * (edges[1] - edges[0])
    billed = {}
    for m, r in results.items():
        held = Busy()
        for u in r.usage:
            held.add(u.start, u.end, u.devices)
        billed[m] = (held.series(edges) / scale).round(4).tolist()
    return {"bin_edges_s": edges.tolist(),
            "computing": {m: (r.busy.series(edges) / scale).round(4).tolist() for m, r in results.items()},
            "billed": billed}


def table(report: dict[str, Any]) -> str:
    # billed: what users pay (their calls, or their reservations); held: what the provider holds
    rows = [f"{'mode':<17}{'billed dev-h':>14}{'x floor':>9}{'held dev-h':>12}{'x floor':>9}{'completion h':>14}"
            f"{'mean JCT h':>12}{'actual/peak':>13}{'held a/p':>10}{'switches':>10}{'sim s':>8}{'events/s':>10}"]
    floor = report["work_floor_device_hours"]
    for mode, s in report["modes"].items():
        rows.append(f"{mode:<17}{s['device_hours']:>14,.0f}{s['device_hours'] / floor:>9.2f}"
                    f"{s['held_device_hours']:>12,.0f}{s['held_device_hours'] / floor:>9.2f}"
                    f"{s['total_completion_s'] / 3600:>14.1f}{s['mean_job_completion_s'] / 3600:>12.1f}"
                    f"{100 * s['actual_over_peak']:>12.1f}%{100 * s['held_actual_over_peak']:>9.1f}%"
                    f"{s['switches']:>10}{s['wall_seconds']:>8.1f}{s['events_per_s']:>10,.0f}")
    rows.append(f"{'work floor':<17}{floor:>14,.0f}")
    c = report["comparison"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f} %"

    rows += [
        "",
        f"cost vs async split:        {pct(c['cost_vs_async_split'])} (paper: {PAPER['cost_vs_async_split']} "
        f"saved, i.e. 62.4-68.6 %; goal <= {100 * GOALS['cost_vs_async_split']:.0f} %)",
        f"completion vs isolated:     {pct(c['completion_vs_isolated'])} with spread + backfill "
        f"(paper: {PAPER['completion_vs_isolated']}; goal <= {100 * GOALS['completion_vs_isolated']:.0f} %)",
        f"actual/peak:                PlexRL {pct(c['actual_over_peak_plexrl'])}, colocated "
        f"{pct(c['actual_over_peak_colocated'])} (paper: {PAPER['actual_over_peak_plexrl']} vs "
        f"{PAPER['actual_over_peak_colocated']})",
        f"simulated in {report['sim_wall_seconds']:.1f} s"
        + (f", pure Python ({why})" if (why := report.get("sim_pure_python_because")) else ""),
    ]
    return "\n".join(rows)


def plot(report: dict[str, Any], path: Path) -> None:
    """Utilisation over time per mode (left) and the cost per mode (right: device-hours billed, in
    front of those held), as PNG or SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    u = report["utilisation"]
    edges = np.asarray(u["bin_edges_s"])
    days = edges[-1] >= 2 * 86400
    unit, per = ("days", 86400) if days else ("hours", 3600)
    mids = (edges[:-1] + edges[1:]) / 2 / per
    modes = list(report["modes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for i, mode in enumerate(modes):
        color = f"C{i}"
        left.plot(mids, 100 * np.asarray(u["computing"][mode]), color=color, label=f"{mode} computing",
                  linewidth=1.2)
        left.plot(mids, 100 * np.asarray(u["billed"][mode]), color=color, linestyle="--", linewidth=0.8,
                  label=f"{mode} billed")
    left.set_xlabel(f"simulated time ({unit})")
    left.set_ylabel("% of the cluster's devices")
    left.set_title(f"{report['workload']}: {report['jobs']} jobs on {report['gpus']} GPUs")
    left.set_ylim(0, 100)
    left.legend(fontsize=6, ncol=2)
    # held (what the provider holds, idle included) behind billed (what users pay): the gap is idle
    held = [report["modes"][m]["held_device_hours"] for m in modes]
    hours = [report["modes"][m]["device_hours"] for m in modes]
    right.barh(modes, held, color="#d9d9d9", label="held")
    bars = right.barh(modes, hours, height=0.5, color="#7a9cc6", label="billed")
    right.axvline(report["work_floor_device_hours"], color="k", linestyle="--", linewidth=1, label="work floor")
    for bar, mode in zip(bars, modes, strict=True):
        s = report["modes"][mode]
        right.text(max(s["held_device_hours"], s["device_hours"]), bar.get_y() + bar.get_height() / 2,
                   f" {s['device_hours']:,.0f} billed, {s['held_device_hours']:,.0f} held; "
                   f"done in {s['total_completion_s'] / per:,.1f} {unit}", va="center", fontsize=7)
    right.set_xlabel("device-hours")
    right.invert_yaxis()
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    right.set_xlim(0, max(held + hours) * 1.9)
    right.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:,.0f}k"))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
