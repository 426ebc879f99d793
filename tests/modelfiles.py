"""Tiny random Hugging Face model folders of each architecture the engine takes, built locally (no
hub): a word-level tokenizer over the arithmetic characters and a few layers of random weights,
saved with safetensors as ``save_pretrained`` writes them. For the model upload and architecture
tests."""

from __future__ import annotations

from pathlib import Path

VOCAB = ["<pad>", "<eos>", "<unk>", *"0123456789+-*=?()[] ", *[f"w{i}" for i in range(41)]]  # 64: splits in two
ARCHITECTURES = ("qwen2", "llama", "qwen3")


def _config(arch: str, tied: bool, vocab_size: int):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = {"vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 64,
              "tie_word_embeddings": tied, "initializer_range": 0.2, "pad_token_id": 0, "eos_token_id": 1,
              "bos_token_id": 1}
    kind = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config}[arch]
    return kind(**common)


def build_tiny_model(out: Path, arch: str = "qwen2", *, tied: bool = True, seed: int = 0,
                     vocab_size: int = len(VOCAB)) -> Path:
    """A random ``arch`` model (4 query heads, 2 KV heads, head_dim 32, 2 layers) and its tokenizer,
    saved in ``out``; ``vocab_size``: the model's (the tokenizer has ``len(VOCAB)`` tokens). vLLM's
    Qwen2 takes head_dim as hidden_size / heads (16 here), so it cannot serve the Qwen2 (its CPU
    attention takes no head_dim of 16 either): the Qwen2 runs on torch and Megatron."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch, tied, vocab_size)).float()
    with torch.no_grad():  # non-zero biases and norms, so a wrong layout cannot hide behind defaults
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
