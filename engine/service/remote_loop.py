"""The function API's ``Client`` over a session's calls: algorithm code written against
``engine.client`` (the platform's own GRPO, say) runs outside the engine, each of its calls sent to
a session (``engine.service.session``) as JSON and its result read back as the API's types, bit for
bit (``engine.service.session_calls``).

    loop = engine_client.session_loop("sess-7")     # or over any transport: RemoteClient(submit)
    grpo.train(loop, job="sess-7", model="tiny-arith", ...)

``submit(fn, args)`` sends one call and returns at once something whose ``result()`` is the JSON
answer; calls are sent in the order the loop makes them, so a loop may keep several in flight.
Tokenizers load on the caller's side, from the model's folder (a preset built locally).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.api import OptimizerConfig
from engine.client import load_tokenizer
from engine.models import resolve_model
from engine.service.session_calls import from_result, to_args

Submit = Callable[[str, dict[str, Any]], Any]


class RemoteFuture:
    def __init__(self, answer: Any, fn: str, kwargs: dict[str, Any]):
        self._answer, self._fn, self._kwargs = answer, fn, kwargs

    def result(self, timeout: float | None = None) -> Any:
        return from_result(self._fn, self._answer.result(timeout), self._kwargs)


class RemoteHandle:
    """A model of the session, by role; its methods are ``engine.client.ModelHandle``'s."""

    def __init__(self, submit: Submit, role: str, model: str):
        self._submit, self.role, self.model = submit, role, model

    def _call(self, fn: str, **kwargs: Any) -> RemoteFuture:
        return RemoteFuture(self._submit(fn, to_args(fn, self.role, kwargs)), fn, kwargs)

    def generate(self, prompts, sampling) -> RemoteFuture:
        return self._call("generate", prompts=prompts, sampling=sampling)

    def forward(self, batch) -> RemoteFuture:
        return self._call("forward", batch=batch)

    def forward_backward(self, batch, loss: str, loss_config: dict[str, Any] | None = None) -> RemoteFuture:
        return self._call("forward_backward", batch=batch, loss=loss, loss_config=loss_config)

    def optim_step(self) -> RemoteFuture:
        return self._call("optim_step")

    def sync_weights(self) -> RemoteFuture:
        return self._call("sync_weights")

    def save_checkpoint(self, tag: str) -> RemoteFuture:
        return self._call("save_checkpoint", tag=tag)

    def load_checkpoint(self, tag: str) -> RemoteFuture:
        return self._call("load_checkpoint", tag=tag)


class RemoteClient:
    """``engine.client.Client``'s methods, for a loop whose session is ``submit``'s. The job and
    base model a loop names are the session's (it was opened with one); checkpoints and timings
    stay with the loop (its state is its own), metrics go to the session's log."""

    def __init__(self, submit: Submit, model: str):
        self._submit_one, self.model = submit, model
        self.calls = 0  # sent so far

    def _submit(self, fn: str, args: dict[str, Any]) -> Any:
        self.calls += 1
        return self._submit_one(fn, args)

    def close(self) -> dict[str, Any]:
        """End the session (once its calls are answered): ``{"closed": why, "calls": answered}``."""
        return self._submit_one("close", {}).result()

    def create_model(self, job: str, role: str, base: str, *, trainable: bool = False,
                     optimizer_config: OptimizerConfig | None = None) -> RemoteHandle:
        import dataclasses

        args: dict[str, Any] = {"role": role, "trainable": trainable}
        if optimizer_config is not None:
            args["optimizer"] = {k: list(v) if isinstance(v, tuple) else v
                                 for k, v in dataclasses.asdict(optimizer_config).items()}
        self._submit("create_model", args).result()
        return RemoteHandle(self._submit, role, self.model)

    def tokenizer(self, handle_or_base: RemoteHandle | str):
        base = handle_or_base.model if isinstance(handle_or_base, RemoteHandle) else handle_or_base
        return load_tokenizer(str(resolve_model(base)))

    def log_metrics(self, step: int, values: dict[str, Any]) -> None:
        self._submit("log_metrics", {"step": step, "values": values}).result()

    def log_timings(self, step: int, values: dict[str, float]) -> None:
        pass  # the loop's own: its wall clock, not the session's

    def log_checkpoint(self, step: int, tag: str, path: str, state: dict[str, Any]) -> None:
        pass  # a loop that resumes keeps its own state; the weights are in the session's checkpoint

    def log(self, message: str) -> None:
        pass
