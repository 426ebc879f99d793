"""GRPO: group-relative advantages and a PPO-clip update, written against the function API only.

One step: sample ``samples_per_prompt`` answers for each of ``prompts_per_step`` problems, score
them with the verifiable reward, normalise rewards within each prompt's group, take the
old-policy (and, with ``kl_coef > 0``, reference) log-probs, then ``updates_per_step``
minibatch updates, then sync the trainer's weights to the sampler. Groups whose rewards are all
equal carry no advantage and are left out of the update (with ``kl_coef == 0`` their gradient is
exactly zero anyway).

A task with a tool (``arith-tools``) samples each answer in turns (engine/rl/tools.py): every turn
is its own batch row, ``(context before the turn, tokens the model wrote in it)``, carrying the
answer's advantage and the log-probs its generate call returned, so tool results the environment
inserted are context and never trained on, and the loss code needs no change.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from engine.client import Batch, Client, OptimizerConfig, SamplingParams, SpecError
from engine.rl.rewards import math_reward, score_answers
from engine.rl.tasks import get_task
from engine.rl.tools import Rollout, ToolConfig, ToolProtocol, rollout, training_rows

ADV_EPS = 1e-6
LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class GRPOConfig:
    # `plexrl train --task arith --steps 150 --seed 0` (vLLM + Megatron, 2 cores), held-out greedy
    # accuracy from 0.182. More prompts a step average out more of the gradient's noise; the gain
    # also moves by a few hundredths with the run's float rounding (TP=2 against TP=1, or how the
    # trainer packs its batch), so the default keeps a margin over +0.30 on both layouts:
    #   before packed trainer batches: 512 +0.279, 704 +0.313 (TP=2 +0.292), 768 +0.339 (TP=2 +0.309)
    #   packed (half the train step):  768 +0.311, 1024 +0.347 (TP=2 +0.331)
    prompts_per_step: int = 1024
    samples_per_prompt: int = 8
    updates_per_step: int = 8  # minibatches per step, one optimizer step each
    # lr, warm-up and temperature (same command, 512 prompts, base 0.208): +0.275 held-out with 3e-4,
    # 10 warm-up steps and T = 0.6, against +0.20 with 2e-4, 5 and T = 1 (5e-4 thrashes this base:
    # per-step KL spikes above 1). From 0.182, 2e-4 gained +0.257, and a constant 3e-4 (no cosine
    # decay) stood at 0.21 by step 80 where the decayed rate was at 0.33.
    lr: float = 3e-4
    warmup_steps: int = 10  # RL steps of linear learning-rate warm-up
    lr_schedule: str = "cosine"  # "cosine": decay to zero over the run's steps; "constant"
    clip_eps: float = 0.2
    clip_eps_high: float = 0.0  # > 0: the ratio's upper clip bound is 1 + this ("clip-higher"); 0: clip_eps
    dual_clip: float = 0.0  # > 1: cap negative-advantage token losses at dual_clip * |A| (0: off)
    kl_coef: float = 0.0  # > 0 adds a frozen reference model and a k3 KL penalty
    # Rollout temperature. Below 1 the samples sit nearer the greedy answer that is evaluated and
    # more groups have mixed rewards (log-probs stay those of the model's own distribution).
    temperature: float = 0.6
    max_tokens: int = 8  # per generate call: with a tool, per turn, and never below the task's min_turn_tokens
    eval_every: int = 10
    eval_size: int = 500
    shuffle_rewards: bool = False  # negative control: permute rewards within each step
    # Old-policy log-probs: False takes the sampled tokens' log-probs that generate returned (the
    # rollout holds the weights just synced from the trainer, so they are the old policy's); True
    # recomputes them with a trainer forward pass, for rollout engines whose numerics differ
    # (e.g. bf16 sampling against an fp32 trainer).
    recompute_logprobs: bool = False
    # Every this many steps the policy (weights and optimizer state) is checkpointed, so that a job
    # whose driver or worker dies resumes from there and replays the steps since (0: never).
    checkpoint_every: int = 10

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = type(f.default)
            # bool is an int subclass: accept exact types only, ints where floats are expected
            ok = type(value) is kind or (kind is float and type(value) is int)
            if not ok:
                raise SpecError(f.name, f"must be {kind.__name__}, got {type(value).__name__} {value!r}")
        positive = ("prompts_per_step", "samples_per_prompt", "updates_per_step", "max_tokens",
                    "eval_every", "eval_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise SpecError(name, "must be >= 1")
        if self.samples_per_prompt < 2:
            raise SpecError("samples_per_prompt", "GRPO needs at least 2 samples per prompt")
        if not self.lr > 0:
            raise SpecError("lr", "must be > 0")
        if not 0 < self.clip_eps < 1:
            raise SpecError("clip_eps", "must be in (0, 1)")
        if not 0 <= self.clip_eps_high < 1:
            raise SpecError("clip_eps_high", "must be in (0, 1), or 0 for clip_eps")
        if self.dual_clip and self.dual_clip <= 1:
            raise SpecError("dual_clip", "must be > 1 (or 0 for off)")
        if self.kl_coef < 0:
            raise SpecError("kl_coef", "must be >= 0")
        if self.temperature <= 0:
            raise SpecError("temperature", "must be > 0 for training rollouts")
        if self.lr_schedule not in LR_SCHEDULES:
            raise SpecError("lr_schedule", f"must be one of {', '.join(LR_SCHEDULES)}")
        if self.warmup_steps < 0:
            raise SpecError("warmup_steps", "must be >= 0")
        if self.checkpoint_every < 0:
            raise SpecError("checkpoint_every", "must be >= 0 (0: never)")


def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """(r - mean) / (std + 1e-6) within each consecutive group (population std)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    adv = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + ADV_EPS)
    return adv.reshape(-1)


def rollout_logprobs(completions) -> torch.Tensor:
    """The completions' (or turns') sampled-token log-probs, laid out as ``forward`` returns
    log-probs: ``[B, T]`` with T the longest completion, right-padded with zeros."""
    width = max(len(c.logprobs) for c in completions)
    out = torch.zeros((len(completions), width), dtype=torch.float32)
    for i, c in enumerate(completions):
        out[i, : len(c.logprobs)] = torch.as_tensor(c.logprobs, dtype=torch.float32)
    return out


def _generator(policy):
    return lambda prompts, sampling: policy.generate(prompts, sampling).result()


def evaluate(client: Client, policy, problems, tokenizer, max_tokens: int, *, protocol: ToolProtocol | None = None,
             tools: ToolConfig | None = None, latency_key=(0,), reward=None) -> tuple[dict[str, float], float]:
    """Held-out greedy accuracy, the fraction of answers that are one well-formed number and, with a
    tool, the calls per answer; and the seconds the evaluation waited on the tool."""
    prompts = [tokenizer.encode(p.prompt) for p in problems]
    out = rollout(_generator(policy), prompts, SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens),
                  protocol=protocol, config=tools, latency_key=latency_key)
    metrics = score_answers([t.answer for t in out.trajectories], [p.answer for p in problems], reward)
    if protocol is not None:
        metrics["tool_calls"] = _tool_stats(out)["tool_calls"]
    return metrics, out.stall_s


def _tool_stats(out: Rollout) -> dict[str, float]:
    """Calls per answer and failed calls (the calculator refused the expression) per answer."""
    calls = [c for t in out.trajectories for c in t.calls]
    n = len(out.trajectories)
    return {"tool_calls": len(calls) / n, "tool_errors": sum(not c.ok for c in calls) / n}


def _step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def train(
    client: Client, *, job: str, model: str, task: str, steps: int, seed: int, config: GRPOConfig,
    tools: ToolConfig | None = None, on_step=None, dataset: str | None = None, resume: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``steps`` GRPO steps; metrics go to the job's event log. Returns the summary.

    ``tools`` configures the calculator of a tool-using task (ignored by other tasks). ``resume``:
    the data of the job's last ``checkpoint`` event (``Client.log_checkpoint``): the run goes on
    after that step from the checkpointed policy, as if it had never stopped (every step's data,
    samples and shuffles come from (seed, step), not from what ran before)."""
    task_impl = get_task(task, dataset)
    tools = tools or ToolConfig()
    U = config.updates_per_step
    optimizer = OptimizerConfig(lr=config.lr, warmup_steps=config.warmup_steps * U,
                                decay_steps=steps * U if config.lr_schedule == "cosine" else 0)
    policy = client.create_model(job, "policy", model, trainable=True, optimizer_config=optimizer)
    reference = client.create_model(job, "reference", model) if config.kl_coef > 0 else None
    tokenizer = client.tokenizer(policy)
    protocol = None
    if task_impl.uses_tools:
        try:
            protocol = ToolProtocol.for_tokenizer(tokenizer)
        except ValueError as exc:
            raise SpecError("model", f"task {task!r}: {exc}") from None
    max_tokens = max(config.max_tokens, task_impl.min_turn_tokens)
    reward = task_impl.reward or math_reward
    eval_set = task_impl.eval_set(config.eval_size)
    G = config.samples_per_prompt
    loss_config = {"clip_eps": config.clip_eps, "clip_eps_high": config.clip_eps_high or config.clip_eps,
                   "kl_coef": config.kl_coef, "dual_clip": config.dual_clip}

    def run_eval(step: int) -> tuple[dict[str, float], float]:
        return evaluate(client, policy, eval_set, tokenizer, max_tokens, protocol=protocol, tools=tools,
                        latency_key=(seed, step, 1), reward=reward)

    first = 1
    if resume is not None:
        policy.load_checkpoint(resume["tag"]).result()  # weights, optimizer moments and step count
        policy.sync_weights().result()  # the rollout side samples from the restored weights
        initial, evals, first = resume["state"]["initial"], list(resume["state"]["evals"]), resume["step"] + 1
        client.log(f"resumed after step {resume['step']} from checkpoint {resume['tag']}")
    else:
        initial, _ = run_eval(0)
        client.log(f"initial held-out accuracy {initial['accuracy']:.3f}")
        evals = []
    for step in range(first, steps + 1):
        t_start = time.perf_counter()
        rng = np.random.default_rng([seed, step, 1])
        problems = task_impl.train_batch(seed, step, config.prompts_per_step)
        prompts = [tokenizer.encode(p.prompt) for p in problems]
        sampling = SamplingParams(n=G, temperature=config.temperature, max_tokens=max_tokens,
                                  seed=_step_seed(seed, step))
        out = rollout(_generator(policy), prompts, sampling, protocol=protocol, config=tools,
                      latency_key=(seed, step, 0))
        answers = out.trajectories
        stall = out.stall_s
        t_gen = time.perf_counter()

        correct = np.array([reward(a.answer, problems[a.prompt_index].answer) for a in answers])
        rewards = rng.permutation(correct) if config.shuffle_rewards else correct
        adv = group_advantages(rewards, G)
        keep_groups = np.flatnonzero(rewards.reshape(-1, G).std(axis=1) > 0)
        rows = (keep_groups[:, None] * G + np.arange(G)[None, :]).reshape(-1).tolist()
        t_reward = time.perf_counter()

        metrics: dict[str, Any] = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "train_accuracy": float(correct.mean()),
            "response_length": float(np.mean([a.tokens_written for a in answers])),  # model-written only
            "groups_used": len(keep_groups) / config.prompts_per_step,
        }
        if protocol is not None:
            metrics.update(_tool_stats(out))
        losses, clip_fracs, kls, kl_old, grad_norms = [], [], [], [], []
        t_logprob = t_train = t_reward
        if rows:
            owners, turns = training_rows(out, rows)  # one row per turn of each kept answer
            batch = Batch(
                prompts=[t.context for t in turns],
                completions=[t.tokens for t in turns],
                advantages=torch.as_tensor(adv[owners], dtype=torch.float32),
            )
            old_f = policy.forward(batch) if config.recompute_logprobs else None
            ref_f = reference.forward(batch) if reference is not None else None
            batch = dataclasses.replace(
                batch,
                old_logprobs=old_f.result().logprobs if old_f is not None else
                rollout_logprobs(turns),
                ref_logprobs=ref_f.result().logprobs if ref_f is not None else None,
            )
            t_logprob = time.perf_counter()
            # Rows spread at random over the minibatches, each group's among many: minibatches of
            # whole groups (fewer distinct prompts per update, though the trainer computes a shared
            # prompt once) learned markedly slower here: +0.15 against +0.22 in 150 steps (default config).
            order = rng.permutation(len(turns))
            futures = []
            for chunk in np.array_split(order, config.updates_per_step):
                if len(chunk):
                    futures.append((policy.forward_backward(batch.select(chunk.tolist()), "grpo", loss_config),
                                    policy.optim_step()))
            for fb, opt in futures:
                result, stepped = fb.result(), opt.result()
                losses.append(result.loss)
                clip_fracs.append(result.metrics["clip_frac"])
                kl_old.append(result.metrics["kl_old"])
                if "kl_ref" in result.metrics:
                    kls.append(result.metrics["kl_ref"])
                grad_norms.append(stepped["grad_norm"])
            t_train = time.perf_counter()
        policy.sync_weights().result()
        t_sync = time.perf_counter()

        metrics.update({
            "loss": float(np.mean(losses)) if losses else 0.0,
            # KL to the frozen reference when there is one, else to the policy that sampled the step
            "kl": float(np.mean(kls)) if kls else (float(np.mean(kl_old)) if kl_old else 0.0),
            "clip_frac": float(np.mean(clip_fracs)) if clip_fracs else 0.0,
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
        })
        if step % config.eval_every == 0 or step == steps:
            result, eval_stall = run_eval(step)
            stall += eval_stall
            metrics["eval_accuracy"] = result["accuracy"]
            metrics["eval_well_formed"] = result["well_formed"]
            if protocol is not None:
                metrics["eval_tool_calls"] = result["tool_calls"]
            evals.append(result["accuracy"])
        t_end = time.perf_counter()
        client.log_metrics(step, metrics)
        timings = {
            "generate": t_gen - t_start, "reward": t_reward - t_gen, "logprobs": t_logprob - t_reward,
            "train": t_train - t_logprob, "sync": t_sync - t_train, "eval": t_end - t_sync,
            "total": t_end - t_start,
        }
        if protocol is not None:
            timings["tool_stall"] = stall  # waited on the tool, in generate and eval: idle rollout time
        client.log_timings(step, timings)
        if config.checkpoint_every and step % config.checkpoint_every == 0 and step < steps:
            tag = f"step-{step}"
            saved = policy.save_checkpoint(tag).result()
            client.log_checkpoint(step, tag, saved["path"], {"initial": initial, "evals": evals})
        if on_step is not None:
            on_step(step, metrics)

    final = float(np.mean(evals[-3:])) if evals else initial["accuracy"]
    checkpoint = policy.save_checkpoint("final").result()  # the trained weights, for export
    return {
        "final_checkpoint": checkpoint["path"],
        "initial_accuracy": initial["accuracy"],
        "initial_well_formed": initial["well_formed"],
        "final_accuracy": final,
        "accuracy_gain": final - initial["accuracy"],
        "steps": steps,
        "seed": seed,
        "task": task,
        "model": model,
        "config": asdict(config),
        **({"tools": asdict(tools)} if protocol is not None else {}),
    }
