"""Loading a model folder's tokenizer. Kept apart from ``engine.models`` (presets, task data and
rewards) so that the worker backends import only torch and transformers for it."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir):
    """The tokenizer saved with a model, exactly as saved.

    ``AutoTokenizer`` picks the class of the config's model type, and transformers' Qwen2 tokenizer
    rebuilds its own pre-tokenizer (one digit per token), so a locally trained tokenizer whose
    ``tokenizer.json`` keeps whole numbers would be loaded as a different tokenizer than the one
    its model was trained with. A folder with a ``tokenizer.json`` is loaded from that file, the
    whole pipeline as written; other folders go through ``AutoTokenizer``.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (Path(model_dir) / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    return AutoTokenizer.from_pretrained(str(model_dir))


class PlainTokenizer:
    """A model folder's ``tokenizer.json`` through the ``tokenizers`` library alone: the ids
    transformers' fast tokenizer gives for it (the same pipeline, as written), without transformers,
    which imports torch. For a job's driver, which encodes prompts and tool results and decodes
    nothing the workers have not (completions come back with their text)."""

    def __init__(self, model_dir):
        import json

        from tokenizers import Tokenizer

        folder = Path(model_dir)
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}

        def special(name: str) -> str | None:
            value = config.get(name)
            return value.get("content") if isinstance(value, dict) else value

        self.eos_token, self.pad_token = special("eos_token"), special("pad_token")
        self.eos_token_id = self.token_to_id(self.eos_token)
        self.pad_token_id = self.token_to_id(self.pad_token)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def load_plain_tokenizer(model_dir):
    """``PlainTokenizer`` for a folder with a ``tokenizer.json`` (every preset and every folder
    saved by a fast tokenizer), else transformers' (``load_tokenizer``; torch comes with it)."""
    if (Path(model_dir) / "tokenizer.json").is_file():
        return PlainTokenizer(model_dir)
    return load_tokenizer(model_dir)
