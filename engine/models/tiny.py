"""The ``tiny-arith`` preset: a Qwen2-architecture causal LM with a locally trained tokenizer,
warm-started by a short supervised phase into a weak base for RL.

The supervised phase runs a full warm-up + cosine schedule that ends at learning rate zero, so the
base is converged for its budget: a checkpoint cut off at a high learning rate would "improve"
under any small update and make RL look better than it is. The budget is small on purpose, so the
base is weak (held-out greedy accuracy well below what RL reaches) but answers in the right form.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from engine.rl.rewards import score_answers
from engine.rl.tasks import Problem, eval_problems, sample_problems
from engine.workers.sampling import sample

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
BUILD_INFO = "plexrl_build.json"


@dataclass(frozen=True)
class TinyPreset:
    name: str
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention rejects 16
    max_positions: int = 64
    sft_steps: int = 1200
    sft_batch: int = 128
    sft_lr: float = 2e-3
    sft_warmup: float = 0.05
    sft_decay: float = 0.05  # final fraction of steps over which the rate falls linearly to zero
    sft_weight_decay: float = 0.1  # keeps the annealed base stable under RL learning rates
    seed: int = 0
    eval_size: int = 500
    threads: int = 2


TINY_ARITH = TinyPreset(name="tiny-arith")


def train_tokenizer(problems: list[Problem]):
    """A character-level word-level tokenizer trained on the task's text, as a fast HF tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=[PAD, EOS, UNK], min_frequency=1)
    tok.train_from_iterator((p.prompt + p.answer for p in problems), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


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


def _sft_batch(tokenizer, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs, starts = [], []
    for p in problems:
        prompt = tokenizer.encode(p.prompt)
        seqs.append(prompt + tokenizer.encode(p.answer) + [eos])
        starts.append(len(prompt))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, k) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.as_tensor(s)
        attn[i, : len(s)] = 1
        labels[i, k : len(s)] = torch.as_tensor(s[k:])  # loss on the answer and EOS only
    return ids, attn, labels


def greedy_eval(model, tokenizer, problems: list[Problem], max_tokens: int = 8) -> dict[str, float]:
    model.eval()
    prompts = [tokenizer.encode(p.prompt) for p in problems]
    ids, _ = sample(
        model, prompts, max_tokens=max_tokens, temperature=0.0,
        eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, generator=None,
    )
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return score_answers(texts, [p.answer for p in problems])


def build_preset(preset: TinyPreset, out: Path, *, progress: bool = False) -> dict:
    """Build the preset deterministically into ``out`` (atomically: a half-built folder never shows)."""
    from tqdm import tqdm

    torch.set_num_threads(preset.threads)
    started = time.perf_counter()
    rng = np.random.default_rng(preset.seed)
    corpus = sample_problems(rng, 5000) + eval_problems(50)
    tokenizer = train_tokenizer(corpus)
    vocab = ((len(tokenizer) + 7) // 8) * 8
    model = make_model(preset, vocab, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=preset.sft_lr, betas=(0.9, 0.98),
                            weight_decay=preset.sft_weight_decay)
    model.train()
    bar = tqdm(range(preset.sft_steps), desc=f"build {preset.name}", disable=not progress, unit="step")
    loss_value = float("nan")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, preset.sft_steps, preset.sft_lr, preset.sft_warmup, preset.sft_decay)
        ids, attn, labels = _sft_batch(tokenizer, sample_problems(rng, preset.sft_batch))
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        bar.set_postfix(loss=f"{loss_value:.3f}")
    metrics = greedy_eval(model, tokenizer, eval_problems(preset.eval_size))
    info = {
        "preset": asdict(preset),
        "final_sft_loss": loss_value,
        "final_lr": lr_at(preset.sft_steps - 1, preset.sft_steps, preset.sft_lr, preset.sft_warmup, preset.sft_decay),
        "held_out_accuracy": metrics["accuracy"],
        "held_out_well_formed": metrics["well_formed"],
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
