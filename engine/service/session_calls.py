"""A session's calls in their JSON form: what a tenant's own loop sends over the network, turned
into the function API's arguments (``engine.api``), and the API's results turned back into JSON.

One codec, in the engine: the REST layer passes a call's JSON through unread, and every check of
its contents happens here, each failure a ``SpecError`` naming the field (``batch.advantages``) so
that the edge answers 400 with it. Floats cross as JSON numbers: a float32 array written as
numbers and read back as float32 is the same array, bit for bit, so a loop run from outside
computes what the same loop computes inside the engine.

    decode("generate", {"role": "policy", "prompts": [[1, 2]], "sampling": {"n": 4}})
        -> ("policy", {"prompts": [[1, 2]], "sampling": SamplingParams(n=4)})
    encode("generate", [Completion(...), ...]) -> {"completions": [{"token_ids": ..., ...}]}

Pure: no Ray, no torch.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from engine.api import ROLES, Batch, Completion, ForwardResult, LossResult, OptimizerConfig, SamplingParams
from engine.errors import SpecError, TooLarge

# the function API's calls, as a session serves them
MODEL_CALLS = ("generate", "forward", "forward_backward", "optim_step", "sync_weights", "save_checkpoint",
               "load_checkpoint")
# a session's own: its models made, texts as its tokenizer reads them, its curves logged, its
# weights exported, its end
SESSION_CALLS = ("create_model", *MODEL_CALLS, "tokenize", "export", "log_metrics", "close")
MAX_ROWS = 4096  # prompts of a generate call (times n), rows of a batch
MAX_TOKENS_PER_ROW = 8192  # tokens of one prompt or completion
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def decode(fn: str, args: Any) -> tuple[str | None, dict[str, Any]]:
    """The role a call is for (None for the session's own calls) and its keyword arguments."""
    if fn not in SESSION_CALLS:
        raise SpecError("fn", f"unknown call {fn!r}; known: {', '.join(SESSION_CALLS)}")
    if not isinstance(args, dict):
        raise SpecError("args", f"must be an object, got {type(args).__name__}")
    reader = _READERS.get(fn)
    out = reader(args) if reader is not None else {}
    known = _FIELDS[fn]
    unknown = sorted(set(args) - known)
    if unknown:
        raise SpecError(unknown[0], f"unknown field of {fn}; known: {', '.join(sorted(known)) or 'none'}")
    role = _role(args) if fn in MODEL_CALLS or fn == "create_model" else None
    return role, out


def encode(fn: str, result: Any) -> dict[str, Any]:
    """A call's result as JSON: completions, log-probs (each row as long as its completion),
    a loss and its metrics, or the backend's small dict as it is."""
    if fn == "generate":
        if isinstance(result, tuple):  # (the texts' prompts, their completions)
            return {"prompts": result[0], "completions": [_completion(c) for c in result[1]]}
        return {"completions": [_completion(c) for c in result]}
    if fn == "forward":
        assert isinstance(result, ForwardResult)
        lengths = result.mask.sum(axis=1)
        return {"logprobs": [row[:n].tolist() for row, n in zip(result.logprobs, lengths, strict=True)]}
    if fn == "forward_backward":
        assert isinstance(result, LossResult)
        return {"loss": result.loss, "tokens": result.tokens, "metrics": dict(result.metrics)}
    return {k: v for k, v in (result or {}).items() if k != "path"}  # where it lives is the engine's business


def _completion(c: Completion) -> dict[str, Any]:
    return {"prompt_index": c.prompt_index, "token_ids": list(c.token_ids), "text": c.text,
            "logprobs": [float(x) for x in c.logprobs]}


# -- readers, one per call -----------------------------------------------------------------------
def _role(args: dict[str, Any]) -> str:
    role = args.get("role", "policy")
    if role not in ROLES:
        raise SpecError("role", f"unknown role {role!r}; known: {', '.join(ROLES)}")
    return role


def _token_lists(field: str, value: Any, *, empty_ok: bool = False) -> list[list[int]]:
    if not isinstance(value, list) or not value:
        raise SpecError(field, "must be a non-empty list of token-id lists")
    if len(value) > MAX_ROWS:
        raise TooLarge(field, f"at most {MAX_ROWS} rows per call, got {len(value)}", MAX_ROWS)
    for i, row in enumerate(value):
        if not isinstance(row, list) or (not row and not empty_ok):
            raise SpecError(f"{field}[{i}]", "must be a non-empty list of token ids")
        if len(row) > MAX_TOKENS_PER_ROW:
            raise TooLarge(f"{field}[{i}]", f"at most {MAX_TOKENS_PER_ROW} tokens, got {len(row)}", MAX_TOKENS_PER_ROW)
        if not all(type(t) is int and t >= 0 for t in row):
            raise SpecError(f"{field}[{i}]", "token ids are non-negative integers")
    return value


def _config(field: str, kind: type, value: Any) -> Any:
    if value is None:
        return kind()
    if not isinstance(value, dict):
        raise SpecError(field, f"must be an object, got {type(value).__name__}")
    names = {f.name for f in dataclasses.fields(kind)}
    bad = sorted(set(value) - names)
    if bad:
        raise SpecError(f"{field}.{bad[0]}", f"unknown field; known: {', '.join(sorted(names))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    try:
        return kind(**values)
    except (TypeError, ValueError) as exc:
        raise SpecError(field, str(exc)) from None


def _generate(args: dict[str, Any]) -> dict[str, Any]:
    """Prompts as token ids, or as ``texts`` the session's tokenizer encodes (the answer then
    gives their ``prompts`` as token ids too: what a batch of them is built from)."""
    if ("prompts" in args) == ("texts" in args):
        raise SpecError("prompts", "give prompts (token-id lists) or texts (strings), one of the two")
    if "texts" in args:
        texts, prompts = _texts(args), None
    else:
        texts, prompts = None, _token_lists("prompts", args.get("prompts"))
    sampling = _config("sampling", SamplingParams, args.get("sampling"))
    if len(texts or prompts or ()) * sampling.n > MAX_ROWS:
        raise TooLarge("sampling.n", f"prompts x n is at most {MAX_ROWS} per call, got "
                                     f"{len(texts or prompts or ()) * sampling.n}", MAX_ROWS)
    return {"prompts": prompts, "sampling": sampling} if texts is None else {"texts": texts, "sampling": sampling}


def _per_token(field: str, value: Any, completions: list[list[int]]) -> np.ndarray | None:
    """A per-token float input, one list per row as long as its completion (or longer, padded),
    as the ``[B, T]`` float32 array the API takes (T the longest completion, zero-padded)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != len(completions):
        raise SpecError(field, f"must be a list of {len(completions)} rows, one per completion")
    width = max(len(c) for c in completions)
    out = np.zeros((len(completions), width), dtype=np.float32)
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) > width or not all(_finite(x) for x in row):
            raise SpecError(f"{field}[{i}]", f"must be finite numbers, at most {width} of them")
        out[i, :len(row)] = np.asarray(row, dtype=np.float32)
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _batch(args: dict[str, Any]) -> Batch:
    value = args.get("batch")
    if not isinstance(value, dict):
        raise SpecError("batch", "must be an object with prompts and completions")
    bad = sorted(set(value) - {"prompts", "completions", "advantages", "old_logprobs", "ref_logprobs"})
    if bad:
        raise SpecError(f"batch.{bad[0]}", "unknown field")
    prompts = _token_lists("batch.prompts", value.get("prompts"))
    completions = _token_lists("batch.completions", value.get("completions"))
    if len(prompts) != len(completions):
        raise SpecError("batch.completions", f"must have one row per prompt ({len(prompts)}), got {len(completions)}")
    advantages = value.get("advantages")
    if advantages is not None:
        if not isinstance(advantages, list) or len(advantages) != len(prompts) or not all(map(_finite, advantages)):
            raise SpecError("batch.advantages", f"must be {len(prompts)} finite numbers, one per row")
        advantages = np.asarray(advantages, dtype=np.float32)
    return Batch(prompts=prompts, completions=completions, advantages=advantages,
                 old_logprobs=_per_token("batch.old_logprobs", value.get("old_logprobs"), completions),
                 ref_logprobs=_per_token("batch.ref_logprobs", value.get("ref_logprobs"), completions))


def _forward_backward(args: dict[str, Any]) -> dict[str, Any]:
    loss = args.get("loss")
    if not isinstance(loss, str) or not loss:
        raise SpecError("loss", "names a loss (grpo, cross_entropy)")
    config = args.get("loss_config") or {}
    if not isinstance(config, dict) or not all(isinstance(k, str) and _finite(v) for k, v in config.items()):
        raise SpecError("loss_config", "must be an object of numbers")
    return {"batch": _batch(args), "loss": loss, "loss_config": config}


def _texts(args: dict[str, Any]) -> list[str]:
    texts = args.get("texts")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise SpecError("texts", "must be a non-empty list of non-empty strings")
    if len(texts) > MAX_ROWS:
        raise TooLarge("texts", f"at most {MAX_ROWS} rows per call, got {len(texts)}", MAX_ROWS)
    if any(len(t) > MAX_TOKENS_PER_ROW for t in texts):
        raise TooLarge("texts", f"at most {MAX_TOKENS_PER_ROW} characters a text", MAX_TOKENS_PER_ROW)
    return texts


def _tokenize(args: dict[str, Any]) -> dict[str, Any]:
    flags = {name: args.get(name, False) for name in ("eos", "special")}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise SpecError(name, "must be true or false")
    return {"texts": _texts(args), **flags}


def _tag(args: dict[str, Any]) -> dict[str, Any]:
    tag = args.get("tag")
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise SpecError("tag", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return {"tag": tag}


def _create_model(args: dict[str, Any]) -> dict[str, Any]:
    trainable = args.get("trainable", False)
    if not isinstance(trainable, bool):
        raise SpecError("trainable", "must be true or false")
    optimizer = _config("optimizer", OptimizerConfig, args.get("optimizer")) if trainable else None
    if not trainable and args.get("optimizer") is not None:
        raise SpecError("optimizer", "only a trainable model has an optimizer")
    return {"trainable": trainable, "optimizer": optimizer}


def _log_metrics(args: dict[str, Any]) -> dict[str, Any]:
    step, values = args.get("step"), args.get("values")
    if type(step) is not int or step < 0:
        raise SpecError("step", "must be a non-negative integer")
    if not isinstance(values, dict) or not values:
        raise SpecError("values", "must be an object of named numbers")
    for name, v in values.items():
        if name == "step" and v != step:
            raise SpecError("values.step", f"is the step's own number ({step}) where given, got {v!r}")
        if not isinstance(name, str) or not name or not _finite(v):
            raise SpecError(f"values.{name}", "must be a finite number")
    return {"step": step, "values": values}


_READERS = {
    "generate": _generate,
    "forward": lambda args: {"batch": _batch(args)},
    "forward_backward": _forward_backward,
    "save_checkpoint": _tag,
    "load_checkpoint": _tag,
    "tokenize": _tokenize,
    "create_model": _create_model,
    "log_metrics": _log_metrics,
}
_FIELDS: dict[str, set[str]] = {
    "create_model": {"role", "trainable", "optimizer"},
    "generate": {"role", "prompts", "texts", "sampling"},
    "forward": {"role", "batch"},
    "forward_backward": {"role", "batch", "loss", "loss_config"},
    "optim_step": {"role"},
    "sync_weights": {"role"},
    "save_checkpoint": {"role", "tag"},
    "load_checkpoint": {"role", "tag"},
    "tokenize": {"texts", "eos", "special"},
    "export": set(),
    "log_metrics": {"step", "values"},
    "close": set(),
}


# -- the other way: a loop written against the function API, calling a session -------------------
def to_args(fn: str, role: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON ``args`` of ``handle.fn(**kwargs)`` on the ``role`` model (``decode``'s inverse)."""
    out: dict[str, Any] = {"role": role}
    if fn == "generate":
        sampling = dataclasses.asdict(kwargs["sampling"])
        out.update(prompts=[list(p) for p in kwargs["prompts"]],
                   sampling={**sampling, "stop_token_ids": list(sampling["stop_token_ids"])})
    elif fn in ("forward", "forward_backward"):
        out["batch"] = _batch_json(kwargs["batch"])
        if fn == "forward_backward":
            out.update(loss=kwargs["loss"], loss_config=dict(kwargs.get("loss_config") or {}))
    elif fn in ("save_checkpoint", "load_checkpoint"):
        out["tag"] = kwargs["tag"]
    return out


def _batch_json(batch: Batch) -> dict[str, Any]:
    out: dict[str, Any] = {"prompts": [list(p) for p in batch.prompts],
                           "completions": [list(c) for c in batch.completions]}
    for name in ("advantages", "old_logprobs", "ref_logprobs"):
        value = getattr(batch, name)
        if value is not None:  # float32 as numbers: read back as float32, the same array
            out[name] = np.asarray(value, dtype=np.float32).tolist()
    return out


def from_result(fn: str, result: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """The API's result of ``fn`` from its JSON (``encode``'s inverse); ``kwargs`` are the call's."""
    if fn == "generate":
        return [Completion(**c) for c in result["completions"]]
    if fn == "forward":
        completions = kwargs["batch"].completions
        width = max(len(c) for c in completions)
        logprobs = np.zeros((len(completions), width), dtype=np.float32)
        mask = np.zeros((len(completions), width), dtype=bool)
        for i, row in enumerate(result["logprobs"]):
            logprobs[i, :len(row)] = np.asarray(row, dtype=np.float32)
            mask[i, :len(row)] = True
        return ForwardResult(logprobs=logprobs, mask=mask)
    if fn == "forward_backward":
        return LossResult(loss=result["loss"], tokens=result["tokens"], metrics=result["metrics"])
    if fn == "save_checkpoint":  # a loop outside knows a session's checkpoint by its tag
        return {**result, "path": kwargs["tag"]}
    return result
