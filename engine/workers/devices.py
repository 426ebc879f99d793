"""Which device a worker rank computes on: the one place that decides it.

On a GPU node each rank is given its GPUs by Ray (``num_gpus``), which sets ``CUDA_VISIBLE_DEVICES``
so the rank sees its own device as index 0; a rank that sees several (outside Ray) takes
``rank % count``. Without CUDA every rank computes on the CPU.
"""

from __future__ import annotations

import torch


def worker_device(rank: int = 0) -> torch.device:
    if torch.cuda.is_available():
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def accelerator_count() -> int:
    """GPUs this process can see (0 on a CPU machine)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
