"""Platform commands of the ``plexrl`` CLI (``jobs ...``, ``datasets ...``, ``billing report``, ``login``): a
terminal on a running platform, through its REST API (``plexrl_client``, the Python client). Registered by
``plexrl.py`` next to the engine's commands.

Every command takes ``--url`` and ``--token``, defaulting to ``$PLEXRL_URL``
(http://127.0.0.1:8000) and ``$PLEXRL_TOKEN``. A session::

    export PLEXRL_TOKEN=$(plexrl login --username ada)
    JOB=$(plexrl jobs submit --task arith --model tiny-arith --steps 20 --set grpo.lr=1e-4)
    plexrl jobs watch $JOB
    plexrl billing report

Errors are one line on stderr, ``plexrl: error: ...``, with exit status 2 for bad input and every
refusal by the server (4xx: invalid spec, bad token, no such job, a state that forbids the action)
and 1 for a failure that is not the caller's (the server unreachable or answering 5xx); ``jobs
watch`` exits 1 when the job it watched failed or was cancelled.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import CliError
from engine.support.progress import is_tty, progress_bar
from plexrl_client import TERMINAL_STATES, ServiceClient

DEFAULT_URL = "http://127.0.0.1:8000"
# POST jobs/ fields a SPEC file may hold beside the spec's own (JobSpec has none of these names).
SUBMIT_FIELDS = ("name", "rollout_devices", "train_devices", "deployment_mode", "continue_from",
                 "continue_weights")
DEPLOYMENT_MODES = ("async_split", "isolated_split", "colocated")
SPARK_BARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40  # the last rewards a ``jobs watch`` line shows

SUBMIT_HELP = """\
The job is described by a SPEC file (JSON or YAML, or - for stdin), by flags, or both (flags
win):

  SPEC is the job's spec as an object (task, model, steps, seed, grpo {...}, rollout, trainer, tp,
  tools, dataset: an uploaded dataset's id; missing fields take their defaults; the API's OpenAPI
  schema lists every field with its type, default and bounds), and may also hold the submission's
  own fields at top level: name, rollout_devices, train_devices, deployment_mode. Example
  (spec.yaml; the same as JSON works too):

    task: arith
    model: tiny-arith
    steps: 50
    grpo: {lr: 1.0e-4, prompts_per_step: 64}
    name: lr sweep
    rollout_devices: 4

  --set KEY=VALUE sets a spec field, dotted for nested ones (--set grpo.lr=1e-4); VALUE is read
  as JSON when it parses (1e-4, 8, true, null), else as a string (--set rollout=torch).

Prints the new job's id on stdout (JOB=$(plexrl jobs submit ...)) and, on stderr, its web page and
the platform's pre-run estimate of its cost."""

ESTIMATE_HELP = SUBMIT_HELP.split("\n\nPrints")[0] + """

Prints the platform's pre-run estimate and submits nothing: the device-hours the job would hold on
its declared dedicated deployment and what it would be billed multiplexed (from a finished job of
the same shape when there is one, else the calibrated cost model)."""


# -- shared ---------------------------------------------------------------------------------------


def _connection_args() -> argparse.ArgumentParser:
    """``--url`` and ``--token``, shared by every platform command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"the platform's base URL (default: $PLEXRL_URL, else {DEFAULT_URL})")
    common.add_argument("--token", help="an API token (default: $PLEXRL_TOKEN; `plexrl login` prints one)")
    return common


def _base_url(args: argparse.Namespace) -> str:
    return args.url or os.environ.get("PLEXRL_URL") or DEFAULT_URL


def _client(args: argparse.Namespace) -> ServiceClient:
    token = args.token or os.environ.get("PLEXRL_TOKEN")
    if not token:
        raise CliError("--token: no API token; pass --token or set PLEXRL_TOKEN "
                       "(export PLEXRL_TOKEN=$(plexrl login --username NAME))")
    return ServiceClient(_base_url(args), token)


def _job_page(client: ServiceClient, job_id: int) -> str:
    return f"{client.url}/jobs/{job_id}/"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns as wide as their widest cell, two spaces apart; columns whose index is in ``right``
    are right-aligned (numbers)."""
    cells = [[str(h) for h in headers], *([("" if c is None else str(c)) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in cells)


def sparkline(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as block characters, scaled from their min to their max (ASCII
    when stdout cannot encode blocks)."""
    bars = SPARK_BARS
    try:
        bars.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        bars = "_.-=+*#@"
    values = list(values)[-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    if high - low < 1e-12:
        return bars[len(bars) // 2] * len(values)
    return "".join(bars[round((v - low) / (high - low) * (len(bars) - 1))] for v in values)


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def _when(iso: str | None) -> str:
    """An API timestamp (ISO 8601) to the minute: ``2026-11-30 10:41``."""
    return iso[:16].replace("T", " ") if iso else "-"


# -- plexrl login ---------------------------------------------------------------------------------


def add_login(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("login", help="trade a username and password for an API token (printed alone)",
                       description="Print a new API token, for scripts: export PLEXRL_TOKEN=$(plexrl login "
                                   "--username ada). The password is prompted for (never a flag).")
    p.add_argument("--url", help=f"the platform's base URL (default: $PLEXRL_URL, else {DEFAULT_URL})")
    p.add_argument("--username", required=True)
    p.add_argument("--organization", help="id or slug; needed when you belong to several organizations")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
    p.set_defaults(func=cmd_login)


def cmd_login(args: argparse.Namespace) -> int:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password of {args.username}: ")
    print(ServiceClient.obtain_token(_base_url(args), args.username, password, organization=args.organization))
    return 0


# -- plexrl jobs ----------------------------------------------------------------------------------


def _submission_args(s: argparse.ArgumentParser) -> None:
    """The arguments describing a job (``jobs submit`` and ``jobs estimate`` take the same)."""
    s.add_argument("spec_file", nargs="?", type=Path, metavar="SPEC", help="the job spec, JSON or YAML (- for stdin)")
    s.add_argument("--task")
    s.add_argument("--model", help="a preset or a registered model's name")
    s.add_argument("--steps", type=int)
    s.add_argument("--seed", type=int)
    s.add_argument("--name")
    s.add_argument("--rollout-devices", type=int, help="devices a dedicated deployment would reserve for rollout")
    s.add_argument("--train-devices", type=int, help="devices a dedicated deployment would reserve for training")
    s.add_argument("--deployment-mode", choices=DEPLOYMENT_MODES,
                   help="the dedicated deployment the savings compare with (default async_split)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a spec field, dotted for nested ones (repeatable): --set grpo.lr=1e-4")
    s.add_argument("--continue-from", type=int, metavar="JOB",
                   help="start from the weights of this job of your organization (its model; no --model)")
    s.add_argument("--weights", dest="continue_weights", choices=("final", "checkpoint"),
                   help="with --continue-from: its final weights (default) or its latest checkpoint")


def add_jobs(sub: argparse._SubParsersAction) -> None:
    common = _connection_args()
    p = sub.add_parser("jobs", help="submit, list, watch and control jobs on a platform")
    jsub = p.add_subparsers(dest="jobs_cmd", required=True)

    s = jsub.add_parser("submit", parents=[common], help="submit a job; prints its id",
                        description=SUBMIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _submission_args(s)
    s.set_defaults(func=cmd_jobs_submit)

    e = jsub.add_parser("estimate", parents=[common], help="what a job would cost, before it runs",
                        description=ESTIMATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _submission_args(e)
    e.add_argument("--json", action="store_true", help="print the estimate as JSON")
    e.set_defaults(func=cmd_jobs_estimate)

    ls = jsub.add_parser("list", parents=[common], help="the organization's jobs, newest first")
    ls.add_argument("--state", help="only jobs in this state (queued, running, succeeded, ...)")
    ls.add_argument("--json", action="store_true", help="print the jobs as JSON")
    ls.set_defaults(func=cmd_jobs_list)

    show = jsub.add_parser("show", parents=[common], help="one job: spec, state, progress, savings")
    show.add_argument("job", type=int, metavar="ID")
    show.add_argument("--json", action="store_true", help="print the job as JSON")
    show.set_defaults(func=cmd_jobs_show)

    w = jsub.add_parser("watch", parents=[common], help="follow a job's curve until it ends",
                        description="Print a line per new step (reward, accuracy, loss, KL and the reward so "
                                    "far) and each state change, until the job ends. Exit status 0 if it "
                                    "succeeded, 1 if it failed or was cancelled.")
    w.add_argument("job", type=int, metavar="ID")
    w.add_argument("--poll", type=float, default=2.0, help="seconds between polls (default 2)")
    w.set_defaults(func=cmd_jobs_watch)

    d = jsub.add_parser("download", parents=[common], help="a finished job's final weights, unpacked",
                        description="Download a finished job's artifact (final: its weights as a Hugging Face "
                                    "folder) as one ZIP archive and unpack it into --out (a folder "
                                    "job-ID-final/ there, which transformers loads as it is).")
    d.add_argument("job", type=int, metavar="ID")
    d.add_argument("--out", type=Path, default=Path("."), help="where to unpack it (default: here)")
    d.add_argument("--artifact", default="final", help="which artifact (default: final)")
    d.set_defaults(func=cmd_jobs_download)

    x = jsub.add_parser("export", parents=[common], help="a job's metrics and spec into an experiment tracker",
                        description="Write a job's metrics (every step) and its spec to TensorBoard event files, "
                                    "an MLflow run or a Weights & Biases run, from this machine, with the "
                                    "tracker's own library (pip install tensorboard, mlflow-skinny or wandb); "
                                    "with --all, every job of the organization (--state: those in it), a run each.")
    which = x.add_mutually_exclusive_group(required=True)
    which.add_argument("job", type=int, metavar="ID", nargs="?")
    which.add_argument("--all", action="store_true", help="every job of the organization, instead of one")
    x.add_argument("--state", help="with --all: only the jobs in this state (queued, running, succeeded, ...)")
    to = x.add_mutually_exclusive_group(required=True)
    to.add_argument("--tensorboard", type=Path, metavar="LOGDIR", help="event files under LOGDIR/<job name>/")
    to.add_argument("--mlflow", metavar="TRACKING_URI", help="a run at an MLflow tracking URI (file:./mlruns, "
                                                              "http://host:5000)")
    to.add_argument("--wandb", metavar="PROJECT", help="a run of a Weights & Biases project")
    x.add_argument("--experiment", default="plexrl", help="with --mlflow: the experiment (default: plexrl)")
    x.add_argument("--wandb-mode", choices=("offline", "online"), default="offline",
                   help="with --wandb: offline writes under --wandb-dir for `wandb sync` (default)")
    x.add_argument("--wandb-dir", type=Path, default=Path("."), help="with --wandb: where its files go")
    x.set_defaults(func=cmd_jobs_export)

    c = jsub.add_parser("cancel", parents=[common], help="cancel a job that has not finished")
    c.add_argument("job", type=int, metavar="ID")
    c.add_argument("--reason", default="", help="kept as the job's state reason")
    c.set_defaults(func=cmd_jobs_action, action_name="cancel")
    for name, text in (("pause", "pause a queued or running job"), ("resume", "resume a paused job")):
        a = jsub.add_parser(name, parents=[common], help=text)
        a.add_argument("job", type=int, metavar="ID")
        a.set_defaults(func=cmd_jobs_action, action_name=name)


def _read_spec_file(path: Path) -> dict[str, Any]:
    """The spec file's object: JSON, else YAML (which reads JSON too, but not JSON's errors)."""
    import yaml

    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CliError(f"SPEC: cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CliError(f"SPEC: {path} is neither JSON nor YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise CliError(f"SPEC: {path} must hold an object (a mapping), not {type(data).__name__}")
    return data


def _apply_set(spec: dict[str, Any], items: list[str]) -> None:
    """``--set a.b=VALUE`` into ``spec`` (nested dicts made as needed; VALUE JSON, else a string)."""
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise CliError(f"--set {item!r}: expected KEY=VALUE, KEY a spec field (dotted: grpo.lr)")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        node = spec
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CliError(f"--set {key}: {part} is not an object in the spec")
            node = child
        node[parts[-1]] = value


def build_submission(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec and the submission's own fields (``SUBMIT_FIELDS``) from the SPEC file and the flags."""
    spec = _read_spec_file(args.spec_file) if args.spec_file is not None else {}
    options = {k: spec.pop(k) for k in SUBMIT_FIELDS if k in spec}
    for flag in ("task", "model", "steps", "seed"):
        if getattr(args, flag) is not None:
            spec[flag] = getattr(args, flag)
    for field in SUBMIT_FIELDS:
        if getattr(args, field) is not None:
            options[field] = getattr(args, field)
    _apply_set(spec, args.set)
    return spec, options


def cmd_jobs_submit(args: argparse.Namespace) -> int:
    spec, options = build_submission(args)
    client = _client(args)
    job = client.submit(spec, **options)
    print(job["id"])
    name = f" {job['name']!r}" if job["name"] else ""
    print(f"created job {job['id']}{name} ({job['state']}): {_job_page(client, job['id'])}", file=sys.stderr)
    if job.get("estimate"):
        print(f"estimate: {estimate_line(job['estimate'])}", file=sys.stderr)
    return 0


def estimate_line(e: dict[str, Any]) -> str:
    """An estimate in one line: dedicated and multiplexed device-hours, savings, step time, basis."""
    saved = "" if e["savings"] is None else f" ({e['savings']:.0%} less)"
    basis = "a finished job of this shape" if e["basis"] == "profile" else "the cost model"
    return (f"dedicated {e['dedicated_device_hours']:.4g} device-hours, multiplexed "
            f"{e['multiplexed_device_hours']:.4g} device-hours{saved}; about {e['step_seconds']:.1f} s per step "
            f"(from {basis})")


def cmd_jobs_estimate(args: argparse.Namespace) -> int:
    spec, options = build_submission(args)
    options.pop("name", None)
    figures = _client(args).estimate(spec, **options)
    print(json.dumps(figures, indent=2) if args.json else estimate_line(figures))
    return 0


def cmd_jobs_list(args: argparse.Namespace) -> int:
    jobs = _client(args).jobs(state=args.state)
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print("no jobs" + (f" in state {args.state}" if args.state else ""))
        return 0
    rows = [(j["id"], j["name"] or "-", j["state"], j["last_step"] if j["last_step"] is not None else "-",
             f"{j['rollout_devices']}+{j['train_devices']}", j["deployment_mode"], j["created_by"] or "-",
             _when(j["created_at"])) for j in jobs]
    print(format_table(("ID", "NAME", "STATE", "STEP", "DEVICES", "MODE", "BY", "CREATED"), rows, right=(0, 3)))
    return 0


def _lineage_line(lineage: dict[str, Any]) -> str:
    """Where a job's weights came from and which jobs went on from it, in one line."""
    parts = []
    if lineage["parent"]:
        parent = lineage["parent"]
        parts.append(f"job {parent['id']} ({'final weights' if parent['weights'] == 'final' else 'its checkpoint'})")
    if lineage["children"]:
        parts.append("continued by job " + ", ".join(str(c["id"]) for c in lineage["children"]))
    return "; ".join(parts)


def cmd_jobs_show(args: argparse.Namespace) -> int:
    client = _client(args)
    job = client.job(args.job)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    spec, savings = job["spec"], job["savings"]
    state = job["state"] + (f" ({job['state_reason']})" if job["state_reason"] else "")
    step = job["last_step"] if job["last_step"] is not None else 0
    fields = [
        ("job", f"{job['id']} {job['name']}".rstrip()),
        ("state", state + (" [paused by quota]" if job["paused_by_quota"] else "")),
        ("progress", f"step {step} of {spec.get('steps')}"),
        ("spec", f"task {spec.get('task')}, model {spec.get('model')}, seed {spec.get('seed')}, "
                 f"rollout {spec.get('rollout')}, trainer {spec.get('trainer')}"),
        ("reservation", f"{job['rollout_devices']} rollout + {job['train_devices']} train devices, "
                        f"{job['deployment_mode']}"),
        *([("lineage", _lineage_line(job["lineage"]))] if job["lineage"]["parent"] or job["lineage"]["children"]
          else []),
        ("created", f"{_when(job['created_at'])} by {job['created_by'] or '-'}"),
        ("started", _when(job["started_at"])),
        ("finished", _when(job["finished_at"])),
        ("billed", f"{_num(savings['billed_device_hours'], 4)} device-hours "
                   f"(dedicated: {_num(savings['counterfactual_device_hours'], 4)}; "
                   f"savings {_percent(savings['savings'])})"),
        ("page", _job_page(client, job["id"])),
    ]
    width = max(len(k) for k, _ in fields)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in fields))
    return 0


def _step_line(data: dict[str, Any], rewards: list[float]) -> str:
    accuracy = _num(data.get("train_accuracy"))
    if "eval_accuracy" in data:
        accuracy += f" (eval {_num(data['eval_accuracy'])})"
    return (f"step {data['step']:>5}  reward {_num(data.get('reward_mean'))}  accuracy {accuracy}  "
            f"loss {_num(data.get('loss'), 4)}  kl {_num(data.get('kl'), 4)}  {sparkline(rewards)}")


def cmd_jobs_watch(args: argparse.Namespace) -> int:
    if args.poll <= 0:
        raise CliError("--poll: must be > 0 seconds")
    client = _client(args)
    rewards: list[float] = []
    job: dict[str, Any] = {}
    try:
        for update in client.watch(args.job, poll_s=args.poll):
            if update.kind == "metrics":
                if update.data.get("reward_mean") is not None:
                    rewards.append(update.data["reward_mean"])
                print(_step_line(update.data, rewards), flush=True)
            else:
                job = update.data
                reason = f" ({job['state_reason']})" if job["state_reason"] else ""
                print(f"job {job['id']} {job['state']}{reason}", flush=True)
    except KeyboardInterrupt:
        return 130
    assert job["state"] in TERMINAL_STATES
    return 0 if job["state"] == "succeeded" else 1


def cmd_jobs_download(args: argparse.Namespace) -> int:
    print(_client(args).download_artifact(args.job, args.out, name=args.artifact))
    return 0


def cmd_jobs_export(args: argparse.Namespace) -> int:
    from plexrl_client import trackers

    if args.state and not args.all:
        raise CliError("--state selects the jobs of --all; with one job ID it means nothing")
    client = _client(args)
    ids = [job["id"] for job in client.jobs(args.state)] if args.all else [args.job]
    for job_id in progress_bar(ids, desc="export", unit="job", enabled=args.all and is_tty()):
        if args.tensorboard is not None:  # with --all, a folder a run by name and id: names may repeat
            print(trackers.to_tensorboard(client, job_id, args.tensorboard, by_id=args.all))
        elif args.mlflow is not None:
            print(f"MLflow run {trackers.to_mlflow(client, job_id, args.mlflow, experiment=args.experiment)}")
        else:
            run = trackers.to_wandb(client, job_id, project=args.wandb, mode=args.wandb_mode,
                                    directory=args.wandb_dir)
            print(f"W&B run {run}")
    return 0


def cmd_jobs_action(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.action_name == "cancel":
        job = client.cancel(args.job, reason=args.reason)
    else:
        job = getattr(client, args.action_name)(args.job)
    print(f"job {job['id']} {job['state']}")
    return 0


# -- plexrl billing -------------------------------------------------------------------------------


def add_billing(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("billing", help="the organization's billing on a platform")
    bsub = p.add_subparsers(dest="billing_cmd", required=True)
    r = bsub.add_parser("report", parents=[_connection_args()],
                        help="per job: billed vs dedicated device-hours and the savings",
                        description="Per job, the device-hours billed (the calls it ran on shared worker "
                                    "groups) against what a dedicated deployment of its declared reservation "
                                    "would have cost, the savings, and the totals.")
    r.add_argument("--csv", action="store_true", help="write the server's CSV (per-job rows) to stdout")
    r.set_defaults(func=cmd_billing_report)


def cmd_billing_report(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.csv:
        sys.stdout.write(client.savings_csv())
        return 0
    report = client.savings()
    rows = [(j["job"], j["name"] or "-", j["state"], _num(j["billed_device_hours"], 4),
             _num(j["counterfactual_device_hours"], 4), _percent(j["savings"])) for j in report["jobs"]]
    t = report["totals"]
    rows.append(("total", f"{t['jobs']} jobs", "", _num(t["billed_device_hours"], 4),
                 _num(t["counterfactual_device_hours"], 4), _percent(t["savings"])))
    print(format_table(("JOB", "NAME", "STATE", "BILLED DEV-H", "DEDICATED DEV-H", "SAVINGS"), rows,
                       right=(3, 4, 5)))
    return 0


def add_datasets(sub: argparse._SubParsersAction) -> None:
    common = _connection_args()
    p = sub.add_parser("datasets", help="upload, list and delete the organization's datasets")
    dsub = p.add_subparsers(dest="datasets_cmd", required=True)
    u = dsub.add_parser("upload", parents=[common], help="upload a file of problems; prints its dataset's id",
                        description="Upload a JSONL, CSV or Parquet file of problems (its format from its name's "
                                    "suffix unless --format names it). The server checks every line or row "
                                    "first; a bad file is refused naming the first bad one, and nothing is "
                                    "stored. Train on it with `plexrl jobs submit --task dataset --set "
                                    "dataset=ID --model M`.")
    u.add_argument("file", type=Path, metavar="FILE")
    u.add_argument("--name", required=True, help="the dataset's name, unique within the organization")
    u.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="the file's format (default: its suffix)")
    u.add_argument("--prompt-column", default="prompt", help="the field or column holding the prompt")
    u.add_argument("--answer-column", default="answer", help="the field or column holding the answer")
    u.add_argument("--eval-file", type=Path, metavar="FILE",
                   help="problems to evaluate on, same format and columns (default: a held-out split of FILE)")
    u.set_defaults(func=cmd_datasets_upload)
    ls = dsub.add_parser("list", parents=[common], help="the organization's datasets, newest first")
    ls.add_argument("--json", action="store_true", help="print the datasets as JSON")
    ls.set_defaults(func=cmd_datasets_list)
    d = dsub.add_parser("delete", parents=[common], help="delete a dataset no active job reads")
    d.add_argument("dataset", type=int, metavar="ID")
    d.set_defaults(func=cmd_datasets_delete)


def cmd_datasets_upload(args: argparse.Namespace) -> int:
    for label, path in (("FILE", args.file), ("--eval-file", args.eval_file)):
        if path is not None and not path.is_file():
            raise CliError(f"{label}: {path} is not a file")
    dataset = _client(args).upload_dataset(args.file, args.name, file_format=args.format,
                                           prompt_column=args.prompt_column, answer_column=args.answer_column,
                                           eval_path=args.eval_file)
    print(dataset["id"])
    print(f"dataset {dataset['id']} {dataset['name']!r}: {dataset['problems']} problems", file=sys.stderr)
    return 0


def cmd_datasets_list(args: argparse.Namespace) -> int:
    rows = _client(args).datasets()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(("ID", "NAME", "PROBLEMS", "BYTES", "BY", "CREATED"),
                       [(d["id"], d["name"], d["problems"], d["size_bytes"], d["created_by"] or "-",
                         _when(d["created_at"])) for d in rows], right=(0, 2, 3)))
    return 0


def cmd_datasets_delete(args: argparse.Namespace) -> int:
    _client(args).delete_dataset(args.dataset)
    print(f"dataset {args.dataset} deleted")
    return 0


def add_model_commands(msub: argparse._SubParsersAction) -> None:
    """``plexrl models upload | list | delete`` (beside the engine's ``models build``)."""
    common = _connection_args()
    u = msub.add_parser("upload", parents=[common], help="upload a Hugging Face model folder; prints its id",
                        description="Upload a Hugging Face model folder (config.json, *.safetensors weights and "
                                    "tokenizer files; no pickle .bin, no code) as one of the organization's "
                                    "models. The server checks it first (an architecture the engine runs, every "
                                    "tensor's shape, the plan's size); a bad folder is refused naming the file or "
                                    "tensor, and nothing is kept. Train on it with `plexrl jobs submit --model N`.")
    u.add_argument("folder", type=Path, metavar="DIR")
    u.add_argument("--name", required=True, help="what job specs call it, unique within the organization")
    u.add_argument("--description", default="", help="a line on what it is")
    u.set_defaults(func=cmd_models_upload)
    ls = msub.add_parser("list", parents=[common], help="the models a job may name: presets, published, your own")
    ls.add_argument("--json", action="store_true", help="print the models as JSON")
    ls.set_defaults(func=cmd_models_list)
    d = msub.add_parser("delete", parents=[common], help="delete one of the organization's models no active job trains")
    d.add_argument("model", type=int, metavar="ID")
    d.set_defaults(func=cmd_models_delete)


def cmd_models_upload(args: argparse.Namespace) -> int:
    if not args.folder.is_dir():
        raise CliError(f"DIR: {args.folder} is not a folder")
    model = _client(args).upload_model(args.folder, args.name, description=args.description)
    print(model["id"])
    print(f"model {model['id']} {model['name']!r}: {model['architecture']}, {model['parameters']} parameters, "
          f"{model['size_bytes']} bytes", file=sys.stderr)
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    rows = _client(args).models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(("ID", "NAME", "SCOPE", "ARCHITECTURE", "PARAMETERS", "BYTES"),
                       [(m["id"] or "-", m["name"], m["scope"], m["architecture"] or "-", m["parameters"] or "-",
                         m["size_bytes"] or "-") for m in rows], right=(0, 4, 5)))
    return 0


def cmd_models_delete(args: argparse.Namespace) -> int:
    _client(args).delete_model(args.model)
    print(f"model {args.model} deleted")
    return 0


def add_platform_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``login``, ``jobs ...``, ``datasets ...`` and ``billing report`` (called by
    ``plexrl.build_parser``)."""
    add_login(sub)
    add_jobs(sub)
    add_datasets(sub)
    add_billing(sub)
