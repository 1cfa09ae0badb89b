"""What a request that leaves a sampling field out gets: OpenAI's defaults, or the model's own (vLLM's
`--generation-config`).

A model folder's generation_config.json may recommend sampling settings (Qwen2.5: temperature 0.7, top_p 0.8,
top_k 20, repetition_penalty 1.05). vLLM applies them to requests that do not set those fields (`--generation-config
auto`, its default), or ignores them (`vllm`), or reads them from another folder (a path); ember does the same. Only
these fields are read: temperature, top_p, top_k, min_p, repetition_penalty, and max_new_tokens (the default
max_tokens). A GGUF file carries none of them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path

from ember.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
AUTO, VLLM = "auto", "vllm"
_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}  # the file's name -> ours


@dataclass(frozen=True)
class SamplingDefaults:
    """Each field's value where a request leaves it out (OpenAI's unless a generation config says otherwise)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None  # None: up to the context window

    @classmethod
    def from_file(cls, path: Path) -> SamplingDefaults:
        """The settings a generation_config.json recommends (OpenAI's for those it leaves out); raises naming a bad value."""
        try:
            given = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read {path}: {error}") from None
        values = {}
        for theirs, ours in _FIELDS.items():
            value = given.get(theirs) if isinstance(given, dict) else None
            if value is None:
                continue
            kind = int if ours in ("top_k", "max_tokens") else float
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise ValueError(f"{path}: {theirs} must be a number, got {value!r}")
            values[ours] = kind(value)
        try:  # a value no request could take would fail every request that leaves it out: refuse it at start
            SamplingParams(**{name: value for name, value in values.items() if name != "max_tokens"},
                           max_tokens=values.get("max_tokens"))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        return cls(**values)

    def sampling_params(self) -> SamplingParams:
        """Offline `LLM.generate`'s params when none are given (vLLM's `get_default_sampling_params`): these
        defaults, and SamplingParams' own max_tokens unless the generation config sets one."""
        values = {name: value for name, value in self.changed().items() if value is not None}
        return SamplingParams(**values)

    def changed(self) -> dict[str, float | int | None]:
        """The fields that differ from OpenAI's defaults."""
        plain = SamplingDefaults()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(plain, f.name)}


def sampling_defaults(setting: str, model: str | Path | None) -> SamplingDefaults:
    """The defaults `--generation-config` asks for: "auto" reads the model folder's generation_config.json (none for a
    GGUF, a folder without one, or a model that resolves nowhere: its loader names that), "vllm" keeps OpenAI's,
    anything else is a folder holding a generation_config.json."""
    if setting == VLLM:
        return SamplingDefaults()
    if setting == AUTO:
        folder = _model_folder(model)
        if folder is None or not (folder / GENERATION_CONFIG_FILE).is_file():
            return SamplingDefaults()
    else:
        folder = Path(setting).expanduser()
        if not (folder / GENERATION_CONFIG_FILE).is_file():
            raise ValueError(f"--generation-config {setting}: no {GENERATION_CONFIG_FILE} there; give its folder, 'auto' or 'vllm'")
    defaults = SamplingDefaults.from_file(folder / GENERATION_CONFIG_FILE)
    changed = defaults.changed()
    if changed:
        logger.info("default sampling parameters from %s: %s (a request's own values win; --generation-config vllm "
                    "keeps OpenAI's)", folder / GENERATION_CONFIG_FILE, changed)
    return defaults


def _model_folder(model: str | Path | None) -> Path | None:
    """The folder `model` (a path or registered name) lies in, if it is one."""
    from ember.models.registry import resolve_model

    try:
        path = None if model is None else resolve_model(str(model))
    except FileNotFoundError:
        return None
    return path if path is not None and path.is_dir() else None
