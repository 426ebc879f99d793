"""A router on the scheduler's node submits over the scheduler's Unix socket (one Ray hop less per
call); elsewhere, or once the socket broke, through the scheduler actor, with the same results.
Real Ray actors, the session's torch worker group, the tiny preset."""

import os
import subprocess
import sys

import pytest
import ray
import torch

from engine.client import Batch, OptimizerConfig, SamplingParams
from engine.scheduler.router import Router, _open_scheduler_socket
from engine.support.wire import Closed, listen_on_node

GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=4)


def _socket_calls(router: Router) -> int:
    return ray.get(router.scheduler.stats.remote())["socket_calls"]


def _policy(client, job):
    return client.create_model(job, "policy", "tiny-arith", trainable=True, optimizer_config=OptimizerConfig(lr=1e-3))


def _batch(client, handle) -> Batch:
    tok = client.tokenizer(handle)
    return Batch(prompts=[tok.encode("12+7="), tok.encode("3-5=")], completions=[[5, 6], [7]],
                 advantages=torch.tensor([1.0, -1.0]))


def test_calls_on_the_schedulers_node_go_over_its_socket(client, router, job):
    assert router._socket is not None
    before = _socket_calls(router)
    policy = _policy(client, job)  # create
    prompts = [client.tokenizer(policy).encode("12+7=")]
    (completion,) = policy.generate(prompts, GREEDY).result()  # bulky: the value comes back on the socket
    assert completion.token_ids
    batch = _batch(client, policy)
    loss = policy.forward_backward(batch, "grpo").result()
    assert torch.isfinite(torch.tensor(loss.loss))
    assert router.call(job, "policy", "noop", {}).result() is None
    assert _socket_calls(router) - before == 4


def test_a_worker_error_comes_back_on_the_socket_as_itself(client, router, job):
    policy = _policy(client, job)
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        policy.forward_backward(_batch(client, policy), "nope").result()
    assert router._socket is not None  # the connection goes on
    assert router.call(job, "policy", "noop", {}).result() is None


def test_a_router_whose_socket_broke_uses_the_actor_and_fails_only_the_calls_waiting_on_it(client, router, job):
    policy = _policy(client, job)
    ray.get(router.scheduler.pause.remote(job))  # its calls stay queued
    waiting = router.call(job, "policy", "noop", {})
    router._socket.close()
    with pytest.raises(Closed, match="router was closed"):
        waiting.result(timeout=30)
    ray.get(router.scheduler.resume.remote(job))  # the queued call runs; its answer has nowhere to go
    before = _socket_calls(router)
    assert router.call(job, "policy", "noop", {}).result(timeout=30) is None  # through the actor
    assert router._socket is None
    assert _socket_calls(router) == before
    # and the job's calls still run in its order: a train step after the fallback
    policy.forward_backward(_batch(client, policy), "grpo")
    assert policy.optim_step().result(timeout=60)["tokens"] == 3  # the step saw its gradients


def test_a_scheduler_on_another_node_is_reached_through_its_actor(ray_engine):
    @ray.remote(num_cpus=0)
    class Elsewhere:
        def endpoint(self):
            return ("another-node", "/nonexistent/scheduler.sock")

    assert _open_scheduler_socket(Elsewhere.remote()) is None


def test_stale_scheduler_sockets_are_removed(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = tmp_path / f"scheduler-{int(gone.stdout)}.sock"
    alive = tmp_path / f"scheduler-{os.getppid()}.sock"  # another process's, still running
    other = tmp_path / "local-123.sock"  # a StateManager's: not the scheduler's to remove
    for path in (dead, alive, other):
        path.touch()
    sock, path = listen_on_node(tmp_path, "scheduler")
    sock.close()
    assert path == str(tmp_path / f"scheduler-{os.getpid()}.sock")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not dead.exists()
    assert alive.exists()
    assert other.exists()
