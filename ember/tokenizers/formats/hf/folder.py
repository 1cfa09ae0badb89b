"""What an HF model folder says about its tokenizer beside tokenizer.json.

tokenizer_config.json names BOS and EOS and usually holds the chat template; newer folders keep the template in
chat_template.jinja, image-text ones (a processor's) in chat_template.json. Generation ends on EOS, on the end-of-turn
tokens of common chat formats, and on every id generation_config.json lists as eos_token_id (Llama 3's three), as
transformers and vLLM stop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ember.tokenizers.formats.gguf.vocab import END_OF_TURN_TOKENS


def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """tokenizer_config.json (BOS/EOS names as plain strings), or {} where there is none."""
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return {}
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("bos_token", "eos_token"):
        if isinstance(config.get(key), dict):  # {"content": "<s>", ...}
            config[key] = config[key].get("content")
    return config


def chat_template_of(folder: Path, config: dict[str, Any]) -> str | None:
    """The folder's chat template: tokenizer_config.json's (its "default" where it names several), else
    chat_template.jinja, else chat_template.json's."""
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default", next(iter(named.values()), None))
    if isinstance(template, str):
        return template
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if (folder / "chat_template.json").is_file():
        return json.loads((folder / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
    return None


def stop_token_ids(folder: Path, special_tokens: dict[str, int]) -> list[int]:
    """Ids beyond EOS that end generation: end-of-turn tokens the vocabulary has, generation_config.json's EOS ids."""
    ids = [special_tokens[text] for text in END_OF_TURN_TOKENS if text in special_tokens]
    generation = folder / "generation_config.json"
    if generation.is_file():
        listed = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
        ids += [listed] if isinstance(listed, int) else [i for i in listed or () if isinstance(i, int)]
    return sorted(set(ids))
