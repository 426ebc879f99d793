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
