"""Fixtures for the engine tests.

Unit tests use none of the session fixtures below and never start Ray. The integration tests share
one temporary ``PLEXRL_HOME``, one small ``tiny-arith`` build (250 supervised steps: a model that
answers in the right form, which is all plumbing tests need), one Ray instance and one worker
group for the whole session; every test uses its own job name, so deployments never collide.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.engine.repo import REPO

# Variables that would change what a ``plexrl`` subprocess does; it gets only the ones a test sets.
ENGINE_ENV = {"PLEXRL_HOME", "RAY_ADDRESS", "PYTHONHASHSEED", "PYTHONPATH", "CUDA_VISIBLE_DEVICES"}

CliRunner = Callable[..., subprocess.CompletedProcess]


# --- a tiny random Qwen2 for the sampling tests (no Ray, no files) ------------------------------

TINY_VOCAB = 32
TINY_PAD, TINY_EOS = 0, 1


@pytest.fixture(scope="session")
def tiny_qwen():
    """A randomly initialised 2-layer Qwen2 (vocab 32, pad 0, EOS 1), seeded, in eval mode.

    A large init scale makes its next-token distributions far from uniform, so greedy decoding is
    unambiguous and EOS shows up within a few tokens for some prompts.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.2,
        pad_token_id=TINY_PAD,
        eos_token_id=TINY_EOS,
        bos_token_id=TINY_EOS,
    )
    torch.manual_seed(1234)
    model = Qwen2ForCausalLM(config).float().eval()
    return model


# --- random grouped-query Qwen2 folders for the Megatron and vLLM tests --------------------------

GQA_VOCAB = 64
GQA_PAD, GQA_EOS = 0, 1


def _build_gqa_qwen(out: Path, *, hidden: int, tied: bool, seed: int) -> Path:
    """A random Qwen2 (4 query heads, 2 KV heads, head_dim 32) with a word-level tokenizer
    (``<pad>`` 0, ``<eos>`` 1, vocabulary 64), saved in ``out``."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<pad>": GQA_PAD, "<eos>": GQA_EOS, "<unk>": 2} | {f"w{i}": i for i in range(3, GQA_VOCAB)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
    )
    config = Qwen2Config(
        vocab_size=GQA_VOCAB, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
        tie_word_embeddings=tied, initializer_range=0.2, pad_token_id=GQA_PAD, eos_token_id=GQA_EOS,
        bos_token_id=GQA_EOS,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    with torch.no_grad():  # non-zero biases, so a wrong bias layout cannot hide behind zeros
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def build_gqa_qwen() -> Callable[..., Path]:
    """``build_gqa_qwen(out, hidden=..., tied=..., seed=...)``: a random GQA Qwen2 folder."""
    return _build_gqa_qwen


# --- the session's data directory, model, Ray instance and worker group -------------------------


@pytest.fixture(scope="session")
def plexrl_home(tmp_path_factory) -> Iterator[Path]:
    """A temporary PLEXRL_HOME, set in this process's environment for the whole session."""
    home = tmp_path_factory.mktemp("plexrl-home")
    previous = os.environ.get("PLEXRL_HOME")
    os.environ["PLEXRL_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("PLEXRL_HOME", None)
    else:
        os.environ["PLEXRL_HOME"] = previous


@pytest.fixture(scope="session")
def tiny_model_dir(plexrl_home) -> Path:
    """The ``tiny-arith`` preset, built with a 250-step supervised phase into PLEXRL_HOME/models.

    250 steps (about 20 s) give a model that is right now and then when sampling, so short training
    runs have groups with mixed rewards and really update the policy.

    It sits where the preset resolves, so both ``"tiny-arith"`` and this path name it. One thread:
    the full preset's two threads gain nothing on a model this small and fight other processes.
    """
    from engine.models.presets import TINY_ARITH
    from engine.models.tiny import build_preset

    preset = dataclasses.replace(TINY_ARITH, sft_steps=250, eval_size=50, threads=1)
    path = plexrl_home / "models" / TINY_ARITH.name
    build_preset(preset, path)
    return path


@pytest.fixture(scope="session")
def tiny_tools_model_dir(plexrl_home) -> Path:
    """The ``tiny-arith-tools`` preset, built with a 250-step supervised phase into PLEXRL_HOME/models
    (about 20 s): it calls the calculator for some problems and answers others itself, so short
    runs of the ``arith-tools`` task have calls, several turns and groups with mixed rewards."""
    from engine.models.presets import TINY_ARITH_TOOLS
    from engine.models.tiny import build_preset

    preset = dataclasses.replace(TINY_ARITH_TOOLS, sft_steps=250, eval_size=50, threads=1)
    path = plexrl_home / "models" / TINY_ARITH_TOOLS.name
    build_preset(preset, path)
    return path


@pytest.fixture(scope="session")
def ray_engine(plexrl_home) -> Iterator[None]:
    """Ray, started once for the session the way the engine starts it (and shut down at the end)."""
    import ray

    from engine.service.runtime import EngineConfig, start_ray

    owned = not ray.is_initialized()
    # A RAY_ADDRESS inherited from the caller would attach the tests to somebody else's cluster.
    saved_address = os.environ.pop("RAY_ADDRESS", None)
    start_ray(EngineConfig())
    yield
    if owned:
        from engine.state.manager import stop_state_manager

        stop_state_manager()  # its shared-memory folder would outlive Ray
        ray.shutdown()
    if saved_address is not None:
        os.environ["RAY_ADDRESS"] = saved_address


@pytest.fixture(scope="session")
def kill_state_manager(ray_engine) -> Callable[[object], None]:
    """``kill_state_manager(actor)`` kills a StateManager and returns once its process has exited.

    ``ray.kill`` only asks for the kill: until the process is gone its socket still answers, and a
    swap that reaches it there would be served from the host tier the test means to lose.
    """
    import time

    import ray

    def kill(manager) -> None:
        pid = ray.get(manager.pid.remote())
        ray.kill(manager, no_restart=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            assert time.monotonic() < deadline, "the killed StateManager did not exit"
            time.sleep(0.05)

    return kill


WORKER_THREADS = 1  # pinned torch threads of the session's worker rank


@pytest.fixture(scope="session")
def worker_group(ray_engine, plexrl_home, tiny_model_dir):
    """One torch worker group (a single rank) for every integration test."""
    from engine.workers.group import WorkerGroup

    group = WorkerGroup.start("test-torch-0", threads=WORKER_THREADS, data_dir=plexrl_home)
    yield group
    group.shutdown()


@pytest.fixture(scope="session")
def worker_threads() -> int:
    return WORKER_THREADS


@pytest.fixture
def router(worker_group):
    """A router of its own (no placements yet) over the session's worker group."""
    from engine.scheduler.router import Router

    return Router([worker_group])


@pytest.fixture
def client(router):
    """The function API over ``router``."""
    from engine.client import Client

    return Client(router)


@pytest.fixture
def job(request) -> str:
    """A job name unique to this test (deployments stay resident in the worker for the session)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)


# --- running the ``plexrl`` command -------------------------------------------------------------


@pytest.fixture(scope="session")
def run_plexrl() -> CliRunner:
    """Run ``python -m plexrl ARGS`` in a fresh process from the repository root.

    ``run_plexrl(*args, env={...}, timeout=...)``: the process inherits this environment minus the
    engine variables, plus ``env``.
    """

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
        argv = [sys.executable, "-m", "plexrl", *args]
        with subprocess.Popen(argv, cwd=REPO, env={**base, **(env or {})}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            stacks = None
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                stacks = _stacks(proc.pid)  # where it is stuck, before it is killed
                proc.kill()
                out, err = proc.communicate()
        if stacks is not None:
            pytest.fail(f"`plexrl {' '.join(args)}` ran past {timeout} s; its stderr ended:\n{err[-3000:]}\n"
                        f"its threads and its child processes' (py-spy dump):\n{stacks}")
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    return run


def _stacks(pid: int) -> str:
    """Every thread's Python stack of process ``pid`` and of its child processes (Ray's raylet
    and workers included), by py-spy (installed with Ray); what went wrong, if it could not."""
    spy = Path(sys.executable).with_name("py-spy")
    try:
        done = subprocess.run([str(spy), "dump", "--pid", str(pid), "--subprocesses"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy failed: {exc})"
    return (done.stdout + done.stderr)[-20000:]
