"""Engine commands of the ``plexrl`` CLI (``train``, ``models build``, ``bench engine``).

The entry point that composes these with the platform's commands is ``plexrl.py`` at the top
level; this module only registers subcommands and implements them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from engine.errors import CliError, DatasetError, EngineError, SpecError
from engine.support.progress import is_tty, progress_bar


def _writable_dir(path: Path, field: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".plexrl-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CliError(f"{field}: cannot write to {path}: {exc.strerror or exc}") from None
    return path


# -- plexrl train -----------------------------------------------------------------------------
# The calculator's flags (task arith-tools): flag -> (ToolConfig field, type, help); errors name the flag.
TOOL_FLAGS = {
    "--tool-latency-median": ("latency_median_s", float,
                              "median seconds a calculator call takes (default 1; 0: no stall)"),
    "--tool-latency-p99": ("latency_p99_s", float, "99th-percentile seconds of a call (default 5)"),
    "--max-tool-calls": ("max_calls", int, "calculator calls an answer may make (default 2)"),
}


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one RLVR job on a local engine")
    p.add_argument("--spec", type=Path, metavar="SPEC",
                   help="a job spec file (JSON or YAML, as plexrl jobs submit takes); the flags below win over it")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a spec field, dotted for nested ones (repeatable): --set grpo.lr=1e-4")
    p.add_argument("--task", help="arith, arith-tools or dataset (default: arith)")
    p.add_argument("--steps", type=int, help="RL steps (default: 150)")
    p.add_argument("--seed", type=int, help="default: 0")
    p.add_argument("--model", help="preset name or Hugging Face model folder (default: the task's preset)")
    p.add_argument("--out", type=Path, help="output folder (default: a new one under PLEXRL_HOME/runs)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--rollout", help="rollout backend: torch or vllm (default: vllm when installed)")
    p.add_argument("--trainer", help="training backend: torch or megatron (default: megatron when installed)")
    p.add_argument("--tp", type=int, help="tensor-parallel ranks of the trainer (megatron; default: 1)")
    p.add_argument("--dataset", type=Path, help="task dataset: a JSONL file of {\"prompt\", \"answer\"} lines, or a "
                                                "CSV or Parquet file (by its suffix) with columns prompt and answer")
    p.add_argument("--eval-dataset", type=Path, help="task dataset: a file of problems to evaluate on (the whole "
                                                     "--dataset then trains); default: a held-out split of it")
    for name, prop in _grpo_fields().items():  # one flag a GRPO field, from the spec's own declarations
        flag, text = f"--{name.replace('_', '-')}", f"{prop['description']} (default: {prop['default']})"
        if prop["type"] == "boolean":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            p.add_argument(flag, type=_ARG_TYPES[prop["type"]], choices=prop.get("enum"), help=text)
    for flag, (_, kind, help_text) in TOOL_FLAGS.items():
        p.add_argument(flag, type=kind, help=help_text)
    p.set_defaults(func=cmd_train)


_ARG_TYPES = {"integer": int, "number": float, "string": str}


def _grpo_fields() -> dict[str, dict]:
    from engine.spec import spec_json_schema

    return spec_json_schema()["properties"]["grpo"]["properties"]


def _tool_config(args: argparse.Namespace, given: dict | None = None):
    """The calculator's settings from the flags given over ``given`` (a spec file's), ToolConfig's
    defaults for the others."""
    from engine.tasks.tools import ToolConfig

    values = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in TOOL_FLAGS.items()}
    try:
        return ToolConfig(**{**(given or {}), **{k: v for k, v in values.items() if v is not None}})
    except SpecError as exc:
        flag = next(f for f, (field, _, _) in TOOL_FLAGS.items() if field == exc.field)
        raise CliError(f"{flag}: {exc.message}") from None


def cmd_train(args: argparse.Namespace) -> int:
    from engine.paths import default_run_dir

    spec = train_spec(args)
    out = args.out or default_run_dir(f"{spec.task}-s{spec.seed}")
    spec = _prepare_run(spec, out)
    summary = run_train(spec, out)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"held-out accuracy {summary['initial_accuracy']:.3f} -> {summary['final_accuracy']:.3f} "
              f"in {summary['wall_seconds']:.0f} s; outputs in {out}")
    return 0


def train_spec(args: argparse.Namespace):
    """The ``JobSpec`` that ``plexrl train``'s spec file, flags and ``--set`` describe, in that order of
    precedence from the lowest (bad input: ``CliError`` / ``SpecError``)."""
    from engine.cli.platform_commands import _apply_set, _read_spec_file
    from engine.spec import JobSpec

    spec = _read_spec_file(args.spec) if args.spec is not None else {}
    spec.update({k: getattr(args, k) for k in ("task", "model", "steps", "seed", "tp", "rollout", "trainer")
                 if getattr(args, k) is not None})
    grpo = spec.get("grpo") if isinstance(spec.get("grpo"), dict) else {}
    spec["grpo"] = {**grpo, **{k: getattr(args, k) for k in _grpo_fields() if getattr(args, k) is not None}}
    tools = spec.get("tools") if isinstance(spec.get("tools"), dict) else {}
    if any(getattr(args, flag[2:].replace("-", "_")) is not None for flag in TOOL_FLAGS) or tools:
        spec["tools"] = dataclasses.asdict(_tool_config(args, tools))
    for flag in ("dataset", "eval_dataset"):
        path = getattr(args, flag)
        if path is None:
            continue
        from engine.tasks.datasets import load_problems

        try:
            load_problems(path)
        except DatasetError as exc:
            raise CliError(f"--{flag.replace('_', '-')} {path}: {exc}") from None
        spec[flag] = str(path.resolve())
    _apply_set(spec, args.set)
    return JobSpec.from_dict(spec)


def _prepare_run(spec, out: Path):
    """Check ``out`` is writable, resolve (build) the model and check it fits its trainer, write
    ``spec.json``; returns the spec with the model's folder. A failure leaves no new empty folder."""
    from engine.models import resolve_model

    created = not out.exists()
    _writable_dir(out, "--out")  # before the model may be built, so bad input fails fast
    try:
        model_dir = resolve_model(spec.model, progress=is_tty())
        if spec.trainer == "megatron":
            _check_megatron_fits(model_dir, spec.tp)
    except EngineError:
        if created:
            shutil.rmtree(out, ignore_errors=True)  # leave no empty run folder behind
        raise
    spec = dataclasses.replace(spec, model=str(model_dir))
    (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    return spec


def run_job_id(out: Path) -> str:
    """The local engine's job id for a run written into ``out``: the folder's name and a digest of
    its full path. Checkpoints live under ``PLEXRL_HOME/checkpoints/<job id>``, so two runs at once
    into folders of the same name (``a/out``, ``b/out``) never write into each other's."""
    digest = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:8]
    return f"{out.name[:90]}-{digest}"


def run_train(spec, out: Path) -> dict:
    """Run the job on a local engine, a progress bar on a terminal; write the run's outputs into
    ``out`` and return its summary."""
    from engine.service.runtime import LocalEngine, write_run_outputs

    events_path = out / "events.jsonl"
    if events_path.exists():
        events_path.unlink()  # a fresh run in an old folder starts a fresh log
    bar = progress_bar(total=spec.steps, desc="train", unit="step", enabled=is_tty())

    def on_event(event):
        if event["kind"] == "metrics":
            data = event["data"]
            post = {"reward": f"{data['reward_mean']:.3f}"}
            if "eval_accuracy" in data:
                post["eval"] = f"{data['eval_accuracy']:.3f}"
            bar.set_postfix(post)
            bar.update(1)

    started = time.perf_counter()
    with LocalEngine() as engine:
        summary = engine.run_job(run_job_id(out), spec, events_path, on_event=on_event)
    bar.close()
    summary = {**summary, "wall_seconds": time.perf_counter() - started, "out": str(out)}
    write_run_outputs(events_path, out, summary)
    return summary


def _check_megatron_fits(model_dir: Path, tp: int) -> None:
    """Before any engine starts: the model converts to Megatron and splits over ``tp`` ranks."""
    from transformers import AutoConfig

    from engine.state.layout import check_megatron_layout

    try:
        check_megatron_layout(AutoConfig.from_pretrained(model_dir), tp)
    except ValueError as exc:
        raise CliError(f"--tp: model {model_dir.name} cannot train on megatron with --tp {tp}: {exc}") from None


# -- plexrl models build (upload, list, delete: engine.cli.platform_commands) ---------------------
def add_models(sub: argparse._SubParsersAction) -> None:
    from engine.cli.platform_commands import add_model_commands

    p = sub.add_parser("models", help="build a model preset here; upload, list and delete the organization's models")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    b = msub.add_parser("build", help="build a preset into PLEXRL_HOME/models (deterministic)")
    b.add_argument("preset")
    b.add_argument("--force", action="store_true", help="rebuild even if it exists")
    b.set_defaults(func=cmd_models_build)
    add_model_commands(msub)


def cmd_models_build(args: argparse.Namespace) -> int:
    from engine.models import PRESETS, is_model_dir, preset_dir

    if args.preset not in PRESETS:
        raise CliError(f"preset: unknown preset {args.preset!r}; known: {', '.join(sorted(PRESETS))}")
    from engine.models.tiny import BUILD_INFO, build_preset  # torch: seconds, after the name is checked

    path = preset_dir(args.preset)
    if is_model_dir(path) and not args.force:
        info = json.loads((path / BUILD_INFO).read_text())
    else:
        _writable_dir(path.parent, "PLEXRL_HOME")
        info = build_preset(PRESETS[args.preset], path, progress=is_tty())
    print(json.dumps({"path": str(path), **{k: v for k, v in info.items() if k != "preset"}}, indent=2))
    return 0


# -- plexrl engine start | status | stop ----------------------------------------------------------


def add_engine_service(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="the engine service on a Ray cluster (production: separate processes)")
    esub = p.add_subparsers(dest="engine_command", required=True, parser_class=type(p))
    for name, help_text in (("start", "start the engine service on the cluster (idempotent) and print its groups"),
                            ("status", "print the running engine service's groups, jobs and scheduler counters"),
                            ("stop", "stop the engine service: its jobs are cancelled, its groups shut down"),
                            ("drain", "take a node out of placement: its jobs resume on other nodes from their last "
                                      "checkpoint, its groups are released")):
        c = esub.add_parser(name, help=help_text)
        c.add_argument("--address", default=None,
                       help="the Ray cluster to join (default: $RAY_ADDRESS; start one with `ray start --head`)")
        if name == "drain":
            c.add_argument("node", help="the node's id, or a prefix only it has (`plexrl engine status` lists them)")
            c.add_argument("--undo", action="store_true", help="place worker groups on the node again")
        if name != "stop":
            c.add_argument("--json", action="store_true",
                           help="print the whole snapshot as JSON (nodes, wpgs, jobs, scheduler counters)")
        c.set_defaults(func=cmd_engine_service)


def cmd_engine_service(args: argparse.Namespace) -> int:
    """The engine runs as a named, detached actor on a Ray cluster this command only joins: it
    outlives the command, and the platform's Celery workers reach it with the same RAY_ADDRESS."""
    import os

    from engine.control import EngineClient
    from engine.errors import UnknownService

    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise CliError("address: the engine service lives on a Ray cluster: start one with `ray start --head` "
                       "and pass --address or set RAY_ADDRESS (plexrl up runs a local engine of its own)")
    try:
        client = EngineClient(address=address, create=args.engine_command == "start", timeout_s=300)
    except UnknownService as exc:
        print(f"plexrl: {exc}", file=sys.stderr)
        return 1
    if args.engine_command == "stop":
        client.shutdown()
        print("engine service stopped")
    elif args.engine_command == "drain":
        try:
            done = client.drain(args.node, undo=args.undo)
        except ValueError as exc:  # the service's own message, not the remote traceback around it
            raise CliError(str(getattr(exc, "cause", None) or exc)) from None
        print(json.dumps(done, indent=2) if args.json else
              f"node {done['node']}: {'draining' if done['draining'] else 'takes worker groups again'}; "
              f"jobs moved: {', '.join(done['moved']) or 'none'}")
    elif args.json:
        print(json.dumps(client.cluster_snapshot(), indent=2, default=str))
    else:
        print(format_snapshot(client.cluster_snapshot()))
    return 0


def format_snapshot(snap: dict) -> str:
    """The engine's nodes, worker groups and jobs as tables (ids cut to 12 characters)."""
    from engine.cli.platform_commands import format_table

    def short(node_id: str | None) -> str:
        return (node_id or "-")[:12]

    nodes = format_table(("node", "node group", "devices", "engine", "free", "draining"),
                         [(short(n["id"]), short(n["node_group"]), n["devices"], f"{n['held_devices']:g}",
                           f"{n['free_devices']:g}", "yes" if n.get("draining") else "-")
                          for n in snap.get("nodes", [])], right=(2, 3, 4))
    wpgs = format_table(("wpg", "node", "side", "backend", "devices", "models", "resident jobs"),
                        [(w["name"], short(w["node"]), w["side"], w["backend"], f"{w['devices']:g}",
                          ",".join(w["models"]) or "-",
                          ",".join(w["resident_jobs"]) or ("(starting)" if w.get("starting") else "-"))
                         for w in snap.get("wpgs", [])], right=(4,))
    rss = {d["job"]: d["rss_mb"] for d in snap.get("drivers", [])}
    jobs = format_table(("job", "state", "driver MB"),
                        [(job, state, "-" if rss.get(job) is None else f"{rss[job]:.0f}")
                         for job, state in sorted(snap.get("jobs", {}).items())], right=(2,))
    wpgs = wpgs if snap.get("wpgs") else "no worker group yet"
    return f"{nodes}\n\n{wpgs}\n\n{jobs if snap.get('jobs') else 'no job'}"


def add_engine_commands(sub: argparse._SubParsersAction) -> None:
    add_train(sub)
    add_models(sub)
    add_engine_service(sub)
    from engine.bench import add_bench

    add_bench(sub)
    from engine.cli.sim_commands import add_sim

    add_sim(sub)


def run(args: argparse.Namespace) -> int:
    """Run a parsed command; bad input becomes one line on stderr and exit status 2, as does a
    platform's refusal (HTTP 4xx); a platform that is unreachable or fails (5xx), exit status 1."""
    from plexrl_client import ApiError, PlexRLError

    try:
        return args.func(args)
    except (EngineError, SpecError) as exc:
        print(f"plexrl: error: {exc}", file=sys.stderr)
        return 2
    except PlexRLError as exc:
        print(f"plexrl: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ApiError) and exc.client_error else 1
