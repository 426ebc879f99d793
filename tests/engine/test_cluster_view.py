"""The cluster as the engine reads it from Ray (``engine.service.cluster``): nodes, their device
slots and node groups, the slots worker groups hold; on tables, and on a real cluster of several
Ray nodes on this machine that a worker group starts on, a node joins and a node leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.errors import ModelNotFound
from engine.scheduler.admission import Demand, JobShape, Placer
from engine.service.cluster import Node, choose_nodes, domains, node_usage, nodes_from_ray, rollout_affinity


def ray_node(node_id: str, resources: dict, *, alive: bool = True, labels: dict | None = None) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "Labels": labels or {},
            "NodeManagerAddress": "10.0.0.1"}


@pytest.mark.parametrize(("entry", "expected"), [
    # device slots: the GPUs, else the device resource
    (ray_node("n1", {"GPU": 8.0, "device": 2.0}), Node("n1", "n1", 8, "10.0.0.1")),
    (ray_node("n1", {"device": 2.0, "CPU": 4.0}), Node("n1", "n1", 2, "10.0.0.1")),
    # node group: the label, else a node_group:<name> resource, else the node alone
    (ray_node("n1", {"device": 2.0, "node_group:a": 1.0}), Node("n1", "a", 2, "10.0.0.1")),
    (ray_node("n1", {"device": 2.0}, labels={"plexrl.node_group": "b"}), Node("n1", "b", 2, "10.0.0.1")),
    (ray_node("n1", {"device": 2.0, "node_group:b": 1.0}, labels={"plexrl.node_group": "b"}),
     Node("n1", "b", 2, "10.0.0.1")),
    # not listed: dead, or no device slot (a head node that runs only the controller)
    (ray_node("n1", {"device": 2.0}, alive=False), None),
    (ray_node("n1", {"CPU": 4.0}), None),
])
def test_a_node_as_ray_reports_it(entry, expected):
    assert nodes_from_ray([entry]) == ([expected] if expected else [])


@pytest.mark.parametrize("entry", [
    ray_node("n1", {"device": 2.0, "node_group:a": 1.0, "node_group:b": 1.0}),
    ray_node("n1", {"device": 2.0, "node_group:a": 1.0}, labels={"plexrl.node_group": "b"}),
])
def test_a_node_in_two_node_groups_is_an_error(entry):
    with pytest.raises(ValueError, match="node n1 is in more than one node group: \\['a', 'b'\\]"):
        nodes_from_ray([entry])


def test_nodes_come_by_node_group_and_their_free_slots_less_what_groups_hold():
    nodes = nodes_from_ray([ray_node("z", {"device": 2.0, "node_group:a": 1.0}),
                            ray_node("y", {"device": 4.0, "node_group:b": 1.0}),
                            ray_node("x", {"device": 2.0, "node_group:a": 1.0})])
    assert [(n.id, n.node_group) for n in nodes] == [("x", "a"), ("z", "a"), ("y", "b")]
    usage = node_usage(nodes, [("z", 1.0), ("z", 1.0), ("y", 0.5), ("gone", 2.0)])
    assert [(u["id"], u["devices"], u["held_devices"], u["free_devices"]) for u in usage] == [
        ("x", 2, 0.0, 2.0), ("z", 2, 2.0, 0.0), ("y", 4, 0.5, 3.5)]
    # Ray counts fewer free where another actor holds slots; never more than the engine leaves
    capped = node_usage(nodes, [("y", 0.5)], {"x": 1.0, "y": 4.0})
    assert [(u["id"], u["held_devices"], u["free_devices"]) for u in capped] == [
        ("x", 0.0, 1.0), ("z", 0.0, 2.0), ("y", 0.5, 3.5)]


def test_node_groups_are_the_placer_s_domains():
    nodes = [Node("n1", "a", 2), Node("n2", "a", 2), Node("n3", "b", 4)]
    got = {d.name: (len(d.free), d.node_devices) for d in domains(nodes)}
    assert got == {"a": (2, 2), "b": (1, 4)}
    # a job whose groups need 4 slots fits node group b (one node) and a's two nodes; one of 6 fits neither
    placer = Placer(domains(nodes))
    placer.arrive("fits", JobShape("m", replicas=1, rollout_devices=2, train_devices=2), Demand(0.5, 0.5), 0.0)
    with pytest.raises(ValueError, match="no domain can hold it"):
        placer.arrive("too-big", JobShape("m", replicas=1, rollout_devices=2, train_devices=4), Demand(0.5, 0.5), 0.0)
    with pytest.raises(ValueError, match="node group 'a' mixes nodes of \\[2, 4\\] device slots"):
        domains([Node("n1", "a", 2), Node("n2", "a", 4)])


def rows(*nodes):
    """node_usage rows from (id, node group, devices, free)."""
    return [{"id": i, "node_group": g, "devices": d, "free_devices": f} for i, g, d, f in nodes]


@pytest.mark.parametrize(("usage", "sizes", "prefer", "expected"), [
    # the fullest node that holds a group (best fit), so emptier nodes stay whole
    (rows(("x", "a", 2, 2.0), ("y", "a", 2, 1.0)), [1.0], (), ["y"]),
    # the largest group first: 2 slots go to x (y has 1), then 1 slot to y
    (rows(("x", "a", 2, 2.0), ("y", "a", 2, 1.0)), [1.0, 2.0], (), ["y", "x"]),
    # all of a job's new groups in one node group: b holds both, a only one
    (rows(("x", "a", 2, 1.0), ("y", "b", 4, 4.0)), [1.0, 1.0], (), ["y", "y"]),
    # where both fit: the node group left with the fewest free slots, unless the job's is another
    (rows(("x", "a", 2, 2.0), ("y", "b", 4, 4.0)), [1.0], (), ["x"]),
    (rows(("x", "a", 2, 2.0), ("y", "b", 4, 4.0)), [1.0], ("b",), ["y"]),
    # a preferred node group without room: another one
    (rows(("x", "a", 2, 0.0), ("y", "b", 4, 4.0)), [1.0], ("a",), ["y"]),
    # fractions of a slot (groups of 0.25 slots: the fullest node first) and a group never spanning nodes
    (rows(("x", "a", 1, 0.5), ("y", "a", 1, 0.25)), [0.25, 0.25, 0.25], (), ["y", "x", "x"]),
    (rows(("x", "a", 1, 1.0), ("y", "a", 1, 1.0)), [1.5], (), None),
    (rows(("x", "a", 2, 1.0), ("y", "b", 2, 1.0)), [1.0, 1.0], (), None),
])
def test_new_worker_groups_go_where_the_placer_would_lay_them(usage, sizes, prefer, expected):
    assert choose_nodes(usage, sizes, prefer) == expected


def model_folder(path, **config) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64,
                                                  "hidden_size": 32, **config}))
    (path / "model.safetensors").write_bytes(b"")
    return str(path)


def test_a_vllm_group_s_affinity_is_a_preset_s_name_or_a_folder_s_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("PLEXRL_HOME", str(tmp_path / "home"))  # no preset built here: none is built for it
    assert rollout_affinity("tiny-arith") == "tiny-arith"
    assert rollout_affinity("tiny-arith-tools") == "tiny-arith-tools"
    assert not os.path.exists(tmp_path / "home" / "models")
    base = rollout_affinity(model_folder(tmp_path / "base"))
    # other weights, the same configuration (noise keys aside): the same group
    assert rollout_affinity(model_folder(tmp_path / "tuned", transformers_version="9.9")) == base
    assert rollout_affinity(model_folder(tmp_path / "wider", vocab_size=72)) != base
    with pytest.raises(ModelNotFound, match="no such preset"):
        rollout_affinity(str(tmp_path / "missing"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cluster_of_several_ray_nodes_as_the_engine_reads_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.engine.cluster_probe", str(tmp_path)], capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    start = {n["id"]: n for n in out["start"]}
    assert out["head"] not in start  # no device slot: nothing is placed on the head node
    assert sorted((n["node_group"], n["devices"]) for n in start.values()) == [("a", 2), ("a", 2), ("b", 1)]
    assert all(n["free_devices"] == n["devices"] for n in start.values())

    (wpg_node,) = out["wpg_nodes"]  # one rank, on a node with two free slots
    assert start[wpg_node]["node_group"] == "a"
    placed = {n["id"]: n["free_devices"] for n in out["placed"]}
    assert placed == {i: n["devices"] - (2 if i == wpg_node else 0) for i, n in start.items()}

    # the TP group on the node choose_nodes picked (the other "a" node: the only one with 2 free),
    # both ranks there, meeting at that node's address; the slots free again once it is released
    assert start[out["tp_target"]]["node_group"] == "a"
    assert out["tp_target"] != wpg_node
    assert out["tp_nodes"] == [out["tp_target"]] * 2
    assert out["tp_rendezvous"].startswith(f"tcp://{out['addresses'][out['tp_target']]}:")
    assert {n["id"]: n["free_devices"] for n in out["with_tp"]}[out["tp_target"]] == 0
    assert out["too_big"] == ("worker group probe-big: 1 rank(s) of {'device': 3} could not be reserved on "
                              "any one node within 3 s")
    assert out["big_left"] == []  # refused, it holds nothing
    assert out["pinned_nodes"] == [out["b"]]

    # each node's disk tier is its own folder; a manager's recovery never deletes another's files
    disk = out["disk"]
    assert disk["roots"] == {n: str(tmp_path / "state" / n) for n in (out["tp_target"], out["b"])}
    assert disk["stray_kept_by_other"]
    assert not disk["stray_after_own"]
    assert out["tp_released"] == 2.0

    joined = {n["id"]: n for n in out["after_join"]}
    assert set(joined) == set(start) | {out["joined"]}
    assert (joined[out["joined"]]["node_group"], joined[out["joined"]]["devices"]) == ("b", 4)

    after_loss = {n["id"] for n in out["after_loss"]}
    assert after_loss == set(joined) - {out["a1"]}


def test_engine_status_shows_each_running_job_s_driver_memory():
    from engine.cli.engine_commands import format_snapshot

    snap = {"nodes": [], "wpgs": [], "jobs": {"j1": "running", "j2": "paused"},
            "drivers": [{"job": "j1", "node": "n1", "rss_mb": 412.4}, {"job": "j2", "node": None, "rss_mb": None}]}
    jobs = format_snapshot(snap).split("\n\n")[-1].splitlines()
    assert jobs[0].split() == ["job", "state", "driver", "MB"]
    assert [line.split() for line in jobs[1:]] == [["j1", "running", "412"], ["j2", "paused", "-"]]


def test_bench_cluster_s_jobs_alternate_two_model_configurations_on_one_task():
    from engine.bench.cluster_bench import job_mix

    mix = job_mix(5, steps=3, seed=7)
    assert [name for name, _ in mix] == [f"job-{i}" for i in range(5)]
    assert [spec.model for _, spec in mix] == ["tiny-arith", "tiny-arith-tools"] * 2 + ["tiny-arith"]
    assert [spec.seed for _, spec in mix] == [7, 8, 9, 10, 11]
    assert {(spec.task, spec.steps, spec.rollout, spec.trainer) for _, spec in mix} == {("arith", 3, "torch", "torch")}


@pytest.mark.parametrize(("args", "field"), [
    (["--nodes", "0"], "--nodes"), (["--jobs", "0"], "--jobs"), (["--steps", "0"], "--steps"),
    (["--devices-per-node", "1"], "--devices-per-node"),
])
def test_bench_cluster_refuses_bad_arguments_in_one_line(run_plexrl, args, field):
    done = run_plexrl("bench", "cluster", *args, timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("plexrl: error: ")
    assert field in line
