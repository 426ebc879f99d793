"""``plexrl sim``: the cluster simulator's command."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

PLOT_SUFFIXES = (".png", ".svg")


def add_sim(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate a cluster of RLVR jobs under five deployment modes",
                       description="Simulate the same jobs under isolated split, colocated, async split, PlexRL "
                                   "and PlexRL spread + backfill, on the live scheduler's code.")
    p.add_argument("--workload", default="paper-math",
                   help="preset: paper-math, paper-math-backlog, agentic-tools, long-cot")
    p.add_argument("--gpus", type=int, default=None, help="cluster size (default: the preset's, 2048)")
    p.add_argument("--jobs", type=int, default=200, help="jobs drawn from the preset (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", type=Path, default=None,
                   help="CSV of jobs (job,class,arrival_s,steps[,seed]) instead of drawing --jobs")
    p.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE",
                   help="override a workload parameter (repeatable), e.g. --set samples_per_step=4096")
    p.add_argument("--modes", default=None, help="comma-separated subset of the modes (default: all five)")
    p.add_argument("--admission", action="append", default=[], metavar="PARAM=VALUE",
                   help="shared modes: set a placement and admission parameter (repeatable), e.g. "
                        "--admission limit=1.2 --admission slowdown_bound=1.3; also groups_per_domain")
    p.add_argument("--sync", choices=("gang", "host"), default="host",
                   help="shared modes: a weight sync holds the train WPG only, the rollout WPGs reloading from "
                        "their node's host memory (host, as the live engine does wherever each rollout WPG is on "
                        "one node), or the train and rollout WPGs at once for every job (gang)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", type=Path, default=None, help="write utilisation over time and the cost table "
                                                          "(.png or .svg)")
    p.add_argument("--from-bench", type=Path, default=None,
                   help="predict a `plexrl bench mux --json` output's shared run from its isolated runs")
    p.add_argument("--switch-s", type=float, default=0.05,
                   help="with --from-bench: seconds to swap a job's state into a WPG (default 0.05)")
    p.set_defaults(func=cmd_sim)


def _overrides(items: list[str], fields: dict[str, Any], *, flag: str = "--set") -> dict[str, Any]:
    from engine.errors import CliError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields or key in ("name", "classes", "shares"):
            settable = sorted(k for k in fields if k not in ("name", "classes", "shares"))
            raise CliError(f"{flag} {item!r}: expected PARAM=VALUE with PARAM one of {', '.join(settable)}")
        kind = float if fields[key] is None else type(fields[key])  # None: an optional number
        try:
            out[key] = _parse(kind, raw)
        except ValueError:
            raise CliError(f"{flag} {key}: {raw!r} is not a valid {kind.__name__}") from None
    return out


def _parse(kind: type, raw: str) -> Any:
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(raw)
        return raw.lower() in ("true", "1", "yes")
    return kind(raw)


def _admission(items: list[str]) -> dict[str, Any]:
    """``--admission`` items as overrides of the shared modes' ``AdmissionPolicy``, checked whole."""
    from engine.errors import CliError
    from engine.scheduler.admission import AdmissionPolicy

    fields = {f.name: f.default for f in dataclasses.fields(AdmissionPolicy)}
    fields["groups_per_domain"] = 1
    out = _overrides(items, fields, flag="--admission")
    try:
        AdmissionPolicy(**{k: v for k, v in out.items() if k != "groups_per_domain"})
    except ValueError as exc:
        raise CliError(f"--admission: {exc}") from None
    if out.get("groups_per_domain", 1) < 1:
        raise CliError("--admission groups_per_domain: must be >= 1")
    return out


def cmd_sim(args: argparse.Namespace) -> int:
    from engine.errors import CliError
    from engine.support.progress import is_tty

    if args.from_bench is not None:
        return _from_bench(args)
    from engine.support import native

    pure_because = native.enable()  # the compiled simulator (``make native``) where it matches the sources
    from engine.sim.report import plot, simulate, table
    from engine.sim.simulate import MODES
    from engine.sim.workload import PRESETS, generate_jobs, load_jobs_csv

    if args.workload not in PRESETS:
        raise CliError(f"--workload: unknown preset {args.workload!r} (one of {', '.join(PRESETS)})")
    base = PRESETS[args.workload]
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    overrides = _overrides(args.set, fields)
    if args.gpus is not None:
        overrides["gpus"] = args.gpus
    modes = tuple(m.strip() for m in args.modes.split(",")) if args.modes else MODES
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise CliError(f"--modes: unknown mode(s) {', '.join(unknown)} (of {', '.join(MODES)})")
    if args.plot is not None and args.plot.suffix.lower() not in PLOT_SUFFIXES:
        raise CliError(f"--plot: {args.plot} must end in .png or .svg")
    if args.jobs < 1:
        raise CliError("--jobs: must be >= 1")
    admission = _admission(args.admission)
    admission["sync"] = args.sync
    try:
        w = dataclasses.replace(base, **overrides)
        jobs = load_jobs_csv(args.trace, w) if args.trace else generate_jobs(w, args.jobs, args.seed)
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    from engine.support.progress import progress_bar

    bar = progress_bar(total=len(modes) * len(jobs), desc="sim", unit="job", enabled=is_tty())

    def progress(mode: str | None) -> None:  # a mode starts, or one of its jobs completes
        if mode is None:
            bar.update(1)
        else:
            bar.set_postfix_str(mode)

    try:
        report = simulate(w, jobs, modes=modes, admission=admission, progress=progress)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    bar.close()
    report["seed"] = args.seed
    report["sim_compiled"] = pure_because is None
    report["sim_pure_python_because"] = pure_because
    report["trace"] = str(args.trace) if args.trace else None
    if args.plot is not None:
        plot(report, args.plot)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(table(report))
        if args.plot is not None:
            print(f"plot: {args.plot}")
    return 0


def _from_bench(args: argparse.Namespace) -> int:
    from engine.errors import CliError
    from engine.sim.from_bench import load, predict_any

    if not args.switch_s >= 0:
        raise CliError("--switch-s: must be >= 0")
    try:
        result = predict_any(load(args.from_bench), switch_s=args.switch_s)
    except (ValueError, KeyError, TypeError) as exc:
        raise CliError(f"--from-bench {args.from_bench}: {exc}") from None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    p, m, e = result["predicted"], result["measured"], result["error"]
    print(f"{'':<24}{'predicted':>12}{'measured':>12}{'error':>9}")
    for key in ("shared_device_seconds", "makespan_s"):
        print(f"{key:<24}{p[key]:>12.1f}{m[key]:>12.1f}{100 * e[key]:>8.1f}%")
    if result.get("host_cpus"):
        print(f"(every node's groups and drivers sharing the bench machine's {result['host_cpus']} CPUs)")
    return 0
