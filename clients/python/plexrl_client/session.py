"""A training session: your own loop, on your machine, calling the platform's function API.

    from plexrl_client import ServiceClient

    client = ServiceClient("http://127.0.0.1:8000", token)
    session = client.create_session(model="tiny-arith", optimizer={"lr": 1e-3})
    out = session.generate(texts=["1+2="], n=4, max_tokens=4, temperature=1.0, seed=0)
    rewards = [my_reward(c.text) for c in out.completions]          # computed here, not there
    session.forward_backward(prompts=[out.prompts[c.prompt_index] for c in out.completions],
                             completions=[c.token_ids for c in out.completions],
                             advantages=advantages(rewards), loss="grpo")
    session.optim_step()
    session.sync_weights()
    session.log_metrics(1, reward=sum(rewards) / len(rewards))
    session.close()

A session is a job of yours on the platform (scheduled, metered, billed, on the dashboard, paused
and cancelled like any); while your loop computes, it holds no device. Each method has an
asynchronous twin (``generate_async``, ...) that returns a ``concurrent.futures.Future`` at once:
calls are numbered as you make them and the platform runs them in that order, so a loop may keep
several in flight. Results are the small dataclasses below; refusals raise the client's errors
(``BadRequest`` naming the field, ``PayloadTooLarge`` with the limit, ``Conflict`` once the session
has ended, ``NotFound`` for a session not yours).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plexrl_client.errors import ServerError

if TYPE_CHECKING:
    from plexrl_client.client import ServiceClient

WAIT_S = 20.0  # how long one request waits for an answer (the server allows up to 60)
PENDING_RETRY_S = 0.5  # between two sends of a call to a session the platform has not placed yet
PENDING_LIMIT_S = 600.0  # how long a call waits for the session to be placed at all
TIMINGS_KEPT = 4096  # calls whose times a session keeps


@dataclass(frozen=True)
class Completion:
    """One sample: which prompt it answers, its tokens, their text and log-probs (temperature 1)."""

    prompt_index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]


@dataclass(frozen=True)
class Generation:
    """``generate``'s answer: the completions, prompt-major (the n samples of prompt i are rows
    i*n .. i*n+n-1), and the prompts as token ids (for texts, as the model's tokenizer encoded them)."""

    completions: list[Completion]
    prompts: list[list[int]]


@dataclass(frozen=True)
class CallTiming:
    """Where one call's time went (``Session.timings``): ``seconds`` from the method call to its
    answer here, of which ``engine_seconds`` in the engine (its turn to its result); the rest was
    the way there and back (HTTP, the web server, the queue of calls sent before it)."""

    seq: int
    fn: str
    seconds: float
    engine_seconds: float


@dataclass(frozen=True)
class LossResult:
    loss: float
    tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


class Session:
    """An open session (``ServiceClient.create_session``); ``id`` is its job's id."""

    def __init__(self, client: ServiceClient, job: dict[str, Any], *, next_seq: int = 1):
        self.client, self.job = client, job
        self.id: int = job["id"]
        self._lock = threading.Lock()
        self._next = next_seq
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"plexrl-session-{self.id}-send")  # in order
        self._waiters = ThreadPoolExecutor(16, thread_name_prefix=f"plexrl-session-{self.id}-wait")
        self._blocking = threading.local()  # .now: the calling thread waits for its call's answer
        self.timings: deque[CallTiming] = deque(maxlen=TIMINGS_KEPT)  # the last calls' times, oldest first

    # -- transport -------------------------------------------------------------------------
    def _post(self, seq: int, fn: str, args: dict[str, Any], wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + PENDING_LIMIT_S
        while True:
            try:
                return self.client._json("POST", f"sessions/{self.id}/calls/",
                                         body={"seq": seq, "fn": fn, "args": args, "wait": wait}, waits=wait)
            except ServerError as exc:  # 503: not placed yet, nothing was sent; the same call again
                if exc.status != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(PENDING_RETRY_S)

    def _finish(self, seq: int, fn: str, called: float, answer: dict[str, Any], decode) -> Any:
        while answer["state"] != "done":
            answer = self.client._json("GET", f"sessions/{self.id}/calls/{seq}/", query={"wait": WAIT_S},
                                       waits=WAIT_S)
        self.timings.append(CallTiming(seq, fn, time.perf_counter() - called, answer["engine_ms"] / 1e3))
        return decode(answer["result"])

    def _call(self, fn: str, args: dict[str, Any], decode=lambda result: result) -> Future:
        """Number the call and send it; the future of its result. Made by an ``_async`` method, it
        is sent by the session's one sending thread (in number order) and returns at once, its
        answer long-polled for by another thread, so the next call can be sent meanwhile. Made by
        a blocking method (``_sync``), this thread sends it and its request waits for the answer:
        one round trip, and no hand-off between threads on the way."""
        called = time.perf_counter()
        with self._lock:
            seq = self._next
            self._next += 1
            if not getattr(self._blocking, "now", False):
                posted = self._sender.submit(self._post, seq, fn, args, 0.0)
                return self._waiters.submit(lambda: self._finish(seq, fn, called, posted.result(), decode))
        answered: Future = Future()
        try:
            answered.set_result(self._finish(seq, fn, called, self._post(seq, fn, args, WAIT_S), decode))
        except Exception as exc:
            answered.set_exception(exc)
        return answered

    def _sync(self, make_call, *args: Any, **kwargs: Any) -> Any:
        """``make_call(*args, **kwargs).result()``, made in this thread, its request waiting for the answer."""
        self._blocking.now = True
        try:
            future = make_call(*args, **kwargs)
        finally:
            self._blocking.now = False
        return future.result()

    def _now(self, fn: str, args: dict[str, Any], decode=lambda result: result) -> Any:
        return self._sync(self._call, fn, args, decode)

    # -- the function API --------------------------------------------------------------------
    def create_model(self, role: str = "policy", *, trainable: bool = False,
                     optimizer: dict[str, Any] | None = None) -> dict[str, Any]:
        """The session's ``policy`` (made by ``create_session``) or a frozen ``reference`` model."""
        return self._now("create_model", _create_args(role, trainable, optimizer))

    def generate_async(self, prompts: list[list[int]] | None = None, *, texts: list[str] | None = None,
                       n: int = 1, temperature: float = 1.0, max_tokens: int = 16, seed: int = 0,
                       stop_token_ids: list[int] | None = None, role: str = "policy") -> Future:
        args: dict[str, Any] = {"role": role, "sampling": {"n": n, "temperature": temperature, "max_tokens": max_tokens,
                                                           "seed": seed, "stop_token_ids": list(stop_token_ids or [])}}
        if texts is not None:
            args["texts"] = list(texts)
        if prompts is not None:
            args["prompts"] = [list(p) for p in prompts]

        def decode(result: dict[str, Any]) -> Generation:
            return Generation([Completion(**c) for c in result["completions"]], result.get("prompts", prompts or []))

        return self._call("generate", args, decode)

    def generate(self, prompts: list[list[int]] | None = None, **kwargs: Any) -> Generation:
        """Samples of each prompt (token ids, or ``texts=[...]``): ``n``, ``temperature`` (0:
        greedy), ``max_tokens``, ``seed`` (same seed and inputs, same samples), ``stop_token_ids``."""
        return self._sync(self.generate_async, prompts, **kwargs)

    def forward_async(self, prompts: list[list[int]], completions: list[list[int]], *, role: str = "policy") -> Future:
        return self._call("forward", {"role": role, "batch": _batch(prompts, completions)},
                          lambda result: result["logprobs"])

    def forward(self, prompts: list[list[int]], completions: list[list[int]], *,
                role: str = "policy") -> list[list[float]]:
        """Each completion's per-token log-probs under the model's current weights."""
        return self._sync(self.forward_async, prompts, completions, role=role)

    def forward_backward_async(self, prompts: list[list[int]], completions: list[list[int]], *,
                               loss: str = "grpo", advantages: list[float] | None = None,
                               old_logprobs: list[list[float]] | None = None,
                               ref_logprobs: list[list[float]] | None = None,
                               loss_config: dict[str, float] | None = None, role: str = "policy") -> Future:
        batch = _batch(prompts, completions, advantages=advantages, old_logprobs=old_logprobs,
                       ref_logprobs=ref_logprobs)
        args = {"role": role, "batch": batch, "loss": loss, "loss_config": dict(loss_config or {})}
        return self._call("forward_backward", args, lambda result: LossResult(**result))

    def forward_backward(self, prompts: list[list[int]], completions: list[list[int]], **kwargs: Any) -> LossResult:
        """The loss (``grpo``: per-row ``advantages``, ``old_logprobs`` per token, optional
        ``ref_logprobs``; ``cross_entropy``: the completions as targets) and its gradients, which
        add up until ``optim_step``."""
        return self._sync(self.forward_backward_async, prompts, completions, **kwargs)

    def optim_step_async(self, *, role: str = "policy") -> Future:
        return self._call("optim_step", {"role": role})

    def optim_step(self, *, role: str = "policy") -> dict[str, Any]:
        """Apply the gradients: ``{"grad_norm", "tokens"}``."""
        return self._sync(self.optim_step_async, role=role)

    def sync_weights_async(self) -> Future:
        return self._call("sync_weights", {"role": "policy"})

    def sync_weights(self) -> dict[str, Any]:
        """The trained weights become the ones ``generate`` samples from."""
        return self._sync(self.sync_weights_async)

    def save_checkpoint_async(self, tag: str) -> Future:
        return self._call("save_checkpoint", {"role": "policy", "tag": tag})

    def save_checkpoint(self, tag: str) -> dict[str, Any]:
        return self._sync(self.save_checkpoint_async, tag)

    def load_checkpoint_async(self, tag: str) -> Future:
        return self._call("load_checkpoint", {"role": "policy", "tag": tag})

    def load_checkpoint(self, tag: str) -> dict[str, Any]:
        return self._sync(self.load_checkpoint_async, tag)

    def tokenize_async(self, texts: list[str], *, eos: bool = False, special: bool = False) -> Future:
        return self._call("tokenize", {"texts": list(texts), "eos": eos, "special": special},
                          lambda result: result["token_ids"])

    def tokenize(self, texts: list[str], *, eos: bool = False, special: bool = False) -> list[list[int]]:
        """The texts as the model's tokenizer reads them: ``special``, with its special tokens, as
        ``generate`` encodes prompts; ``eos``: each ending with the end-of-sequence token, as a
        completion the model should learn to stop after."""
        return self._sync(self.tokenize_async, texts, eos=eos, special=special)

    def export_async(self) -> Future:
        return self._call("export", {})

    def export(self) -> dict[str, Any]:
        """The policy's weights now, as a Hugging Face folder: the job's ``final`` artifact."""
        return self._sync(self.export_async)

    def log_metrics_async(self, step: int, **values: float) -> Future:
        return self._call("log_metrics", {"step": step, "values": values})

    def log_metrics(self, step: int, **values: float) -> None:
        """A step's numbers, drawn on the session's page as a job's curves are."""
        self._sync(self.log_metrics_async, step, **values)

    def close(self) -> dict[str, Any]:
        """End the session once its calls are answered; its devices go to others, its billing stops."""
        try:
            return self._now("close", {})
        finally:
            self._sender.shutdown(wait=False)
            self._waiters.shutdown(wait=False)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create_args(role: str, trainable: bool, optimizer: dict[str, Any] | None) -> dict[str, Any]:
    args: dict[str, Any] = {"role": role, "trainable": trainable}
    if optimizer is not None:
        args["optimizer"] = dict(optimizer)
    return args


def _batch(prompts: list[list[int]], completions: list[list[int]], **loss_inputs: Any) -> dict[str, Any]:
    batch: dict[str, Any] = {"prompts": [list(p) for p in prompts], "completions": [list(c) for c in completions]}
    batch.update({name: value for name, value in loss_inputs.items() if value is not None})
    return batch
