"""The ``tiny-arith`` preset: a Qwen2-architecture causal LM with a locally trained tokenizer,
warm-started by a short supervised phase into a weak base for RL.

The supervised phase runs a full warm-up + cosine schedule that ends at learning rate zero, so the
base is converged for its budget: a checkpoint cut off at a high learning rate would "improve"
under any small update and make RL look better than it is. The budget is small on purpose, so the
base is weak (held-out greedy accuracy well below what RL reaches) but answers in the right form.

``tiny-arith-tools`` is the same model taught the calculator of the ``arith-tools`` task: a share
of its supervised examples are tool traces, ``37+45-12=[37+45-12]70<eos>``, where the loss covers
what the model writes (the call and the EOS) and not the result the environment inserts, exactly
as RL trains it; the rest answer directly.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from engine.api import SamplingParams
from engine.models.presets import TinyPreset
from engine.tasks.arithmetic import ArithToolsTask, Problem, eval_problems, sample_problems
from engine.tasks.rewards import score_answers
from engine.workers.sampling import generate

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
BUILD_INFO = "plexrl_build.json"


def train_tokenizer(problems: list[Problem], extra: str = ""):
    """A character-level word-level tokenizer trained on the task's text (and the characters of
    ``extra``), as a fast HF tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=[PAD, EOS, UNK], min_frequency=1)
    texts = [p.prompt + p.answer for p in problems] + ([extra] if extra else [])
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def _tool_characters() -> str:
    from engine.tasks.tools import CALL_CLOSE, CALL_OPEN, ERROR_MARKER

    return CALL_OPEN + CALL_CLOSE + ERROR_MARKER


def make_model(preset: TinyPreset, vocab_size: int, tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=preset.max_positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(preset.seed)
    return Qwen2ForCausalLM(config)


def lr_at(step: int, total: int, peak: float, warmup_frac: float, decay_frac: float) -> float:
    """Warm-up, stable, decay (WSD): linear warm-up, constant peak, linear decay reaching exactly
    zero at the last step. A short final decay anneals the model without the long low-rate tail of
    a cosine schedule, which sharpens it so much that any later fine-tuning first undoes it."""
    warm = max(1, int(total * warmup_frac))
    decay = max(2, int(total * decay_frac))
    if step < warm:
        return peak * (step + 1) / warm
    if step < total - decay:
        return peak
    return peak * (total - 1 - step) / (decay - 1)


def _sft_batch(tokenizer, problems: list[Problem], tools: list[bool] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids, attention mask and labels for supervised examples. Learned are the answer and
    EOS, or where ``tools[i]`` the call ``[expression]`` and EOS (the result after it is the
    environment's, only context). A step's texts are encoded in one tokenizer call: one call per
    text cost a fifth of a preset's build time."""
    from engine.tasks.tools import CALL_CLOSE, CALL_OPEN

    uses_tool = [bool(tools and tools[i]) for i in range(len(problems))]
    texts = [p.prompt for p in problems] + [p.answer for p in problems]
    texts += [CALL_OPEN + p.prompt.removesuffix("=") + CALL_CLOSE
              for p, tool in zip(problems, uses_tool, strict=True) if tool]
    encoded = tokenizer(texts)["input_ids"]
    n = len(problems)
    prompts, answers, calls = encoded[:n], encoded[n:2 * n], iter(encoded[2 * n:])
    eos = tokenizer.eos_token_id
    examples: list[tuple[list[int], list[bool]]] = []
    for prompt, answer, tool in zip(prompts, answers, uses_tool, strict=True):
        if tool:
            call = next(calls)
            examples.append((prompt + call + answer + [eos],
                             [False] * len(prompt) + [True] * len(call) + [False] * len(answer) + [True]))
        else:
            examples.append((prompt + answer + [eos], [False] * len(prompt) + [True] * (len(answer) + 1)))
    width = max(len(s) for s, _ in examples)
    pad = [tokenizer.pad_token_id] * width
    ids = torch.tensor([s + pad[len(s):] for s, _ in examples], dtype=torch.long)
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in examples], dtype=torch.long)
    labels = torch.tensor([[t if keep else -100 for t, keep in zip(s, learned, strict=True)] + [-100] * (width - len(s))
                           for s, learned in examples], dtype=torch.long)
    return ids, attn, labels


def greedy_eval(model, tokenizer, problems: list[Problem], max_tokens: int = 8, *,
                tools: bool = False) -> dict[str, float]:
    """Held-out greedy accuracy and well-formed share; with ``tools``, answers may call the
    calculator (without its latency) and the calls per answer are reported too."""
    from engine.tasks.tools import ToolConfig, ToolProtocol, rollout

    model.eval()
    prompts = [tokenizer.encode(p.prompt) for p in problems]
    protocol = ToolProtocol.for_tokenizer(tokenizer) if tools else None
    if tools:
        max_tokens = max(max_tokens, ArithToolsTask.min_turn_tokens)
    out = rollout(lambda ctx, sampling: generate(model, tokenizer, ctx, sampling), prompts,
                  SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens), protocol=protocol,
                  config=ToolConfig(latency_median_s=0.0))
    metrics = score_answers([t.answer for t in out.trajectories], [p.answer for p in problems],
                            ArithToolsTask.reward if tools else None)
    if tools:
        metrics["tool_calls"] = sum(len(t.calls) for t in out.trajectories) / len(problems)
    return metrics


def build_preset(preset: TinyPreset, out: Path, *, progress: bool = False, position: int = 0) -> dict:
    """Build the preset deterministically into ``out`` (atomically: a half-built folder never shows).
    ``position``: its progress bar's line on a terminal, where several builds show theirs at once."""
    from engine.support.progress import progress_bar

    torch.set_num_threads(preset.threads)
    started = time.perf_counter()
    rng = np.random.default_rng(preset.seed)
    corpus = sample_problems(rng, 5000) + eval_problems(50)
    tools = preset.tool_fraction > 0
    tokenizer = train_tokenizer(corpus, extra=_tool_characters() if tools else "")
    # a stream of its own, so a preset without tools draws exactly the problems it always drew
    tool_rng = np.random.default_rng([preset.seed, 1])
    vocab = ((len(tokenizer) + 7) // 8) * 8
    model = make_model(preset, vocab, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=preset.sft_lr, betas=(0.9, 0.98),
                            weight_decay=preset.sft_weight_decay)
    model.train()
    bar = progress_bar(range(preset.sft_steps), desc=f"build {preset.name}", enabled=progress, unit="step",
                       position=position)
    loss_value = float("nan")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, preset.sft_steps, preset.sft_lr, preset.sft_warmup, preset.sft_decay)
        use_tool = (tool_rng.random(preset.sft_batch) < preset.tool_fraction).tolist() if tools else None
        ids, attn, labels = _sft_batch(tokenizer, sample_problems(rng, preset.sft_batch), use_tool)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        bar.set_postfix(loss=f"{loss_value:.3f}")
    metrics = greedy_eval(model, tokenizer, eval_problems(preset.eval_size), tools=tools)
    info = {
        "preset": asdict(preset),
        "final_sft_loss": loss_value,
        "final_lr": lr_at(preset.sft_steps - 1, preset.sft_steps, preset.sft_lr, preset.sft_warmup, preset.sft_decay),
        "held_out_accuracy": metrics["accuracy"],
        "held_out_well_formed": metrics["well_formed"],
        **({"held_out_tool_calls": metrics["tool_calls"]} if tools else {}),
        "build_seconds": time.perf_counter() - started,
    }
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info
