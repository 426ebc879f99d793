"""Let Megatron-core's GPTModel (local layer spec) run on a machine without CUDA.

Megatron-core allocates a few scratch tensors with ``device=torch.cuda.current_device()``, which
raises on a CPU-only torch. ``apply()`` replaces exactly those allocations on the path our
backend uses (fp32, no sequence parallelism, rotary embeddings, gathered logits) with CPU ones:

- ``GlobalMemoryBuffer.get_tensor``: the scratch buffer core attention's baddbmm writes into;
- ``RotaryEmbedding.get_emb``: moves ``inv_freq`` to the current CUDA device on first use;
- ``mappings._gather_along_last_dim``: the receive buffer of the all-gather behind
  ``gather_from_tensor_model_parallel_region`` (logits with ``parallel_output=False`` at TP > 1).

Each replacement is the original function with the device changed to ``cpu``, nothing else. It is
applied only when CUDA is unavailable (on a GPU the originals run) and applying twice is a no-op.
(The default causal mask, also built on CUDA, needs no patch: the backend passes its own mask.)
"""

from __future__ import annotations

import operator
from functools import reduce

import torch

_APPLIED = False


def _get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
    required = reduce(operator.mul, tensor_shape, 1)
    buf = self.buffer.get((name, dtype))
    if buf is None or buf.numel() < required:
        buf = self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, requires_grad=False)
    return buf[:required].view(*tensor_shape)


def _get_emb(self, max_seq_len, offset=0):
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]  # [seq, 1, 1, dim]


def _gather_along_last_dim(input_, group):
    from megatron.core.tensor_parallel.mappings import dist_all_gather_func

    world_size = group.size()
    if world_size == 1:
        return input_
    size = list(input_.size())
    size[0] *= world_size
    output = torch.empty(size, dtype=input_.dtype)
    dist_all_gather_func(output, input_.contiguous(), group=group)
    return torch.cat(output.chunk(world_size, dim=0), dim=-1).contiguous()


def apply() -> bool:
    """Patch Megatron-core for CPU if CUDA is unavailable; returns whether the patch is in place."""
    global _APPLIED
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    from megatron.core import utils
    from megatron.core.models.common.embeddings import rotary_pos_embedding
    from megatron.core.tensor_parallel import mappings

    utils.GlobalMemoryBuffer.get_tensor = _get_tensor
    rotary_pos_embedding.RotaryEmbedding.get_emb = _get_emb
    mappings._gather_along_last_dim = _gather_along_last_dim
    _APPLIED = True
    return True
