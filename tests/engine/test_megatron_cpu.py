"""The CPU patch for Megatron-core: applied only without CUDA, once, and the buffers it replaces
really come back on the CPU."""

import pytest
import torch

from engine.workers import megatron_cpu


def test_not_applied_when_cuda_is_there(monkeypatch):
    monkeypatch.setattr(megatron_cpu, "_APPLIED", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert megatron_cpu.apply() is False
    assert megatron_cpu._APPLIED is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="the patch is for machines without CUDA")
def test_applied_once_and_buffers_are_on_the_cpu():
    from megatron.core import utils
    from megatron.core.tensor_parallel import mappings

    assert megatron_cpu.apply() is True
    assert megatron_cpu.apply() is True  # a second call changes nothing
    assert utils.GlobalMemoryBuffer.get_tensor is megatron_cpu._get_tensor
    assert mappings._gather_along_last_dim is megatron_cpu._gather_along_last_dim
    buffer = utils.GlobalMemoryBuffer()
    t = buffer.get_tensor((2, 3), torch.float32, "scratch")
    assert (t.shape, t.device.type) == ((2, 3), "cpu")
    again = buffer.get_tensor((3, 2), torch.float32, "scratch")  # reuses the same storage
    assert again.data_ptr() == t.data_ptr()
