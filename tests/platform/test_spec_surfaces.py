"""One job spec on every surface (issue 35): the engine's dataclasses declare each field once (its
type, default, doc and bounds: ``engine.fields``), and the REST API and its OpenAPI schema, the
submit form and the CLI's spec files all come from that. A field reachable from one surface and not
from another fails here, unless it is one the platform sets itself (listed with the reason)."""

from __future__ import annotations

import argparse
import re

import pytest
from drf_spectacular.generators import SchemaGenerator

from config.pages import FORM_SELECTS, NOT_ON_THE_FORM
from engine.cli.platform_commands import _apply_set, _read_spec_file, _submission_args, build_submission
from engine.errors import SpecError
from engine.fields import leaves
from engine.spec import JobSpec, spec_json_schema
from jobs.serializers import PLATFORM_SET_SPEC_FIELDS, api_spec_schema

ENGINE = leaves(spec_json_schema())
API = leaves(api_spec_schema())


def test_the_api_takes_every_field_of_the_engines_spec_but_those_the_platform_sets():
    assert set(ENGINE) == set(API) | set(PLATFORM_SET_SPEC_FIELDS)
    assert set(PLATFORM_SET_SPEC_FIELDS).isdisjoint(API)
    for path, prop in API.items():
        if path != "dataset":  # the API names an uploaded dataset by id; the engine reads its file
            assert prop == ENGINE[path], path


def test_the_openapi_schema_lists_every_spec_field_with_its_type_default_and_bounds():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    documented = leaves(schema["components"]["schemas"]["JobCreateRequest"]["properties"]["spec"])  # estimates too
    assert set(documented) == set(API)
    for path, prop in documented.items():
        assert prop["type"] == API[path]["type"], path
        assert prop.get("description"), path
        for key in ("default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum"):
            assert prop.get(key) == API[path].get(key), (path, key)
    lr = leaves(schema["components"]["schemas"]["JobCreateRequest"]["properties"]["spec"])["grpo.lr"]
    assert (lr["type"], lr["minimum"], lr["exclusiveMinimum"]) == ("number", 0, True)


@pytest.mark.django_db
def test_the_submit_form_has_a_field_for_every_spec_field_the_api_takes(tenant, session_client):
    html = session_client(tenant.member).get("/jobs/new/").content.decode()
    on_the_form = set(re.findall(r'name="spec\.([\w.]+)"', html))
    assert on_the_form == set(API) - set(NOT_ON_THE_FORM)
    assert set(FORM_SELECTS) <= on_the_form
    for path, prop in API.items():  # its bounds are the input's (inclusive ones: HTML has no other)
        if "minimum" in prop and not prop.get("exclusiveMinimum") and path not in FORM_SELECTS:
            assert re.search(rf'name="spec\.{re.escape(path)}"[^>]*\smin="{prop["minimum"]}"', html, re.S), path


def test_every_spec_field_is_reachable_from_a_spec_file_and_from_set(tmp_path):
    for path, prop in ENGINE.items():
        spec: dict = {}
        _apply_set(spec, [f"{path}={'null' if prop.get('default') is None else repr(prop['default']).lower()}"])
        node = spec
        for part in path.split(".")[:-1]:
            node = node[part]
        assert path.split(".")[-1] in node, path
    yaml_file, json_file = tmp_path / "spec.yaml", tmp_path / "spec.json"
    yaml_file.write_text("task: arith\nsteps: 7\ngrpo:\n  lr: 1.0e-4\n  lr_schedule: constant\ntools: {max_calls: 2}\n"
                         "name: from yaml\n")
    json_file.write_text('{"task": "arith", "steps": 7, "grpo": {"lr": 1e-4, "lr_schedule": "constant"}, '
                         '"tools": {"max_calls": 2}, "name": "from yaml"}')
    assert _read_spec_file(yaml_file) == _read_spec_file(json_file)
    parser = argparse.ArgumentParser()
    _submission_args(parser)
    spec, options = build_submission(parser.parse_args([str(yaml_file), "--set", "grpo.kl_coef=0.1"]))
    assert JobSpec.from_dict(spec).grpo.kl_coef == 0.1
    assert options["name"] == "from yaml"


@pytest.mark.parametrize("path", sorted(p for p, prop in ENGINE.items()
                                        if any(k in prop for k in ("minimum", "maximum"))))
def test_each_declared_bound_is_the_one_the_spec_checks(path):
    """Just outside a bound the spec refuses the value, naming the field; on the bound (or just
    inside an exclusive one) it takes it."""
    prop = ENGINE[path]
    step = 1 if prop["type"] == "integer" else 1e-6
    cases = []
    if "minimum" in prop:
        lo = prop["minimum"]
        cases += [(lo - step if not prop.get("exclusiveMinimum") else lo, False),
                  (lo if not prop.get("exclusiveMinimum") else lo + step, True)]
    if "maximum" in prop:
        hi = prop["maximum"]
        cases += [(hi + step if not prop.get("exclusiveMaximum") else hi, False),
                  (hi if not prop.get("exclusiveMaximum") else hi - step, True)]
    for value, taken in cases:
        spec = {"task": "arith-tools" if path.startswith("tools.") else "arith"}
        if path == "tp" and value > 1:
            continue  # more than one rank needs the megatron trainer (its own rule, checked elsewhere)
        if path == "tools.latency_p99_s":
            spec["tools"] = {"latency_median_s": 0.0}
        if path == "grpo.dual_clip" and taken and value:
            continue  # 0 (off) or above 1: its own rule
        _apply_set(spec, [f"{path}={value!r}"])
        if taken:
            JobSpec.from_dict(spec)
        else:
            with pytest.raises(SpecError) as refused:
                JobSpec.from_dict(spec)
            assert refused.value.field.split(".")[-1] == path.split(".")[-1], (path, value)


def test_plexrl_train_takes_a_spec_file_set_and_a_flag_for_every_grpo_and_tool_field(tmp_path):
    from engine.cli.engine_commands import TOOL_FLAGS, add_train, train_spec

    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    flags = {a.dest for a in parser._subparsers._group_actions[0].choices["train"]._actions}
    assert {p.split(".", 1)[1] for p in ENGINE if p.startswith("grpo.")} <= flags
    assert {p.split(".", 1)[1] for p in ENGINE if p.startswith("tools.")} == {f for f, _, _ in TOOL_FLAGS.values()}
    top = {p for p in ENGINE if "." not in p}
    assert top - flags == {"algorithm", "init_from"}  # (a local run is GRPO's; --spec and --set reach them)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("task: arith\nsteps: 5\nseed: 4\ngrpo: {lr: 0.01, max_tokens: 6, eval_size: 20}\n")
    spec = train_spec(parser.parse_args(["train", "--spec", str(spec_file), "--steps", "3", "--lr", "0.001",
                                         "--set", "grpo.max_tokens=12", "--shuffle-rewards"]))
    assert (spec.task, spec.steps, spec.seed) == ("arith", 3, 4)  # the flag wins over the file
    assert (spec.grpo.lr, spec.grpo.max_tokens, spec.grpo.eval_size, spec.grpo.shuffle_rewards) == (0.001, 12, 20,
                                                                                                    True)
    assert train_spec(parser.parse_args(["train"])) == JobSpec()  # nothing given: the spec's defaults
