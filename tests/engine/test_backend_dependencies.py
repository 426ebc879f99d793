"""The training backends run in a process that has only torch, transformers, safetensors and
megatron-core: what a worker rank needs, and what the GPU check (``tests/gpu/run.sh``) finds on an
image without the platform's other dependencies. A backend that reaches presets, task data or
rewards on its way (``math_verify``), or Ray or Django, fails here rather than on the GPU machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.engine.repo import REPO

# Importing any of these in the child fails, as it would where they are not installed.
ABSENT = ["math_verify", "ray", "django", "celery", "channels", "vllm", "engine.models", "engine.rl"]

CHILD = textwrap.dedent(
    """
    import importlib.abc, sys
    from pathlib import Path

    absent = {absent!r}

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == a or name.startswith(a + ".") for a in absent):
                raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)")
            return None

    sys.meta_path.insert(0, Absent())

    import torch
    from engine.api import Batch, OptimizerConfig
    from engine.workers.{module} import {cls}

    backend = {cls}(rank=0, world_size=1, data_dir=Path(sys.argv[2]))
    dep = ("deps", "policy")
    backend.create(dep, Path(sys.argv[1]), trainable=True, optimizer=OptimizerConfig(lr=1e-3))
    batch = Batch(prompts=[[3, 4, 5], [3, 4, 5]], completions=[[6, 1], [7, 8, 1]],
                  advantages=torch.tensor([1.0, -1.0]))
    backend.execute(dep, "forward_backward", {{"batch": batch, "loss": "grpo", "loss_config": {{}}}})
    print("grad_norm", backend.execute(dep, "optim_step", {{}})["grad_norm"])
    """
)


@pytest.mark.parametrize(("module", "cls"), [("torch_backend", "TorchBackend"),
                                             ("megatron_backend", "MegatronBackend")])
def test_training_backend_needs_no_platform_dependencies(module, cls, build_gqa_qwen, tmp_path):
    if module == "megatron_backend":
        pytest.importorskip("megatron.core")
    model = build_gqa_qwen(tmp_path / "model", hidden=64, tied=True, seed=0)
    code = CHILD.format(absent=ABSENT, module=module, cls=cls)
    result = subprocess.run([sys.executable, "-c", code, str(model), str(tmp_path / "data")], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "grad_norm" in result.stdout
