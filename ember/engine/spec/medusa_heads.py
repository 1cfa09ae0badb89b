"""Medusa heads: K small residual blocks over the target's final hidden state, each read by the target's own LM head.

Head k (0-based) at position t predicts the token at t + k + 2: the target's own LM head at t
already gives t + 1, so one forward yields a chain of K + 1 guesses (Cai et al. 2024, "Medusa").
A head is `h + SiLU(W h + b)`, with W and b starting at zero so an untrained head repeats the
target's next-token guess. The LM head is shared, never copied: the heads file holds only the
blocks (K * (hidden^2 + hidden) numbers).

Heads are saved as a folder: `heads.safetensors` and `medusa_config.json`, which names the
base model they were trained on by its shape and a fingerprint (a fixed probe vector through
the LM head), so heads loaded onto another model fail with a message instead of drafting noise.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

HEADS_FILE = "heads.safetensors"
CONFIG_FILE = "medusa_config.json"
PROBE_TOKENS = 16  # logits of the probe vector read at this many evenly spread token ids
PROBE_TOLERANCE = 0.05  # relative to the probe logits' spread: dtype and quantization noise stay inside it


@dataclass(frozen=True)
class BaseModelIdentity:
    """Which model a set of heads belongs to: its shape and the LM head's answer to a fixed probe."""

    architecture: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    probe_logits: tuple[float, ...]

    @property
    def key(self) -> str:
        """A short stable id of the model (probe rounded), for cache folder names."""
        rounded = [round(v, 2) for v in self.probe_logits]
        text = json.dumps([self.architecture, self.hidden_size, self.vocab_size, self.num_layers, rounded])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def mismatch(self, other: BaseModelIdentity) -> str | None:
        """Why `other` is not this model (None when it is, up to dtype and quantization noise)."""
        for name in ("architecture", "hidden_size", "vocab_size", "num_layers"):
            if getattr(self, name) != getattr(other, name):
                return f"{name} {getattr(other, name)} vs {getattr(self, name)}"
        mine, theirs = torch.tensor(self.probe_logits), torch.tensor(other.probe_logits)
        scale = float(mine.abs().max()) or 1.0
        difference = float((mine - theirs).abs().max())
        if difference > PROBE_TOLERANCE * scale:
            return f"LM head fingerprint differs by {difference:.3g} (tolerance {PROBE_TOLERANCE * scale:.3g})"
        return None


def model_identity(model: nn.Module) -> BaseModelIdentity:
    """The identity of a loaded target model (any family with `config` and `compute_logits`)."""
    config = model.config
    hidden = config.embedding_width  # what compute_logits reads (OPT: its embedding width)
    probe = torch.sin(torch.arange(hidden, dtype=torch.float32) * 0.37 + 1.0)
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        logits = model.compute_logits(probe.to(dtype).unsqueeze(0)).float()[0]
    ids = torch.linspace(0, config.vocab_size - 1, PROBE_TOKENS).long()
    return BaseModelIdentity(
        architecture=config.architecture,
        hidden_size=hidden,
        vocab_size=config.vocab_size,
        num_layers=config.num_layers,
        probe_logits=tuple(float(v) for v in logits[ids]),
    )


class ResidualBlock(nn.Module):
    """h + SiLU(W h + b), starting as the identity (W = 0, b = 0)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + nn.functional.silu(self.linear(hidden))


class MedusaHeads(nn.Module):
    """K residual blocks; `forward` gives each head's input to the shared LM head."""

    def __init__(self, num_heads: int, identity: BaseModelIdentity) -> None:
        super().__init__()
        if not 1 <= num_heads <= 16:
            raise ValueError("the number of Medusa heads must be from 1 to 16")
        self.identity = identity
        self.blocks = nn.ModuleList(ResidualBlock(identity.hidden_size) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """[..., hidden] -> [..., num_heads, hidden]: what the LM head reads for each head (the first `num_heads`)."""
        blocks = self.blocks[: num_heads or self.num_heads]
        return torch.stack([block(hidden) for block in blocks], dim=-2)

    def logits(self, target: nn.Module, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """[B, hidden] -> [B, num_heads, vocab] through the target's own LM head (one product for every head).

        `hidden` may be wider than the heads' dtype (a bfloat16 model's compiled layers hand over float32)."""
        heads_in = self(hidden.to(self.blocks[0].linear.weight.dtype), num_heads)
        batch, count, size = heads_in.shape
        return target.compute_logits(heads_in.reshape(batch * count, size)).reshape(batch, count, -1)

    def save(self, folder: Path) -> None:
        """Write `heads.safetensors` and `medusa_config.json` into `folder` (created if missing)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: tensor.detach().float().contiguous() for name, tensor in self.state_dict().items()}
        save_file(tensors, str(folder / HEADS_FILE))
        config = {"num_heads": self.num_heads, "base_model": asdict(self.identity)}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load_medusa_heads(folder: Path | str, target: nn.Module | None = None) -> MedusaHeads:
    """Heads saved by `MedusaHeads.save`; with `target`, checked to belong to it and cast to its dtype."""
    folder = Path(folder).expanduser()
    config, tensors = read_saved_head(folder, CONFIG_FILE, HEADS_FILE, "Medusa heads", "ember medusa train")
    heads = MedusaHeads(int(config["num_heads"]), saved_identity(config))
    heads.load_state_dict(tensors)
    return fitted_to(heads, target, f"the Medusa heads in {folder} were", "ember medusa train")


def read_saved_head(folder: Path, config_name: str, tensors_name: str, what: str, command: str) -> tuple[dict, dict]:
    """A saved draft head's config (JSON) and tensors (safetensors) from `folder`; raises naming `command` when missing."""
    from safetensors.torch import load_file

    config_path, tensors_path = folder / config_name, folder / tensors_name
    if not config_path.is_file() or not tensors_path.is_file():
        raise FileNotFoundError(f"no {what} in {folder}: expected {config_name} and {tensors_name} (train with `{command}`)")
    return json.loads(config_path.read_text(encoding="utf-8")), load_file(str(tensors_path))


def saved_identity(config: dict) -> BaseModelIdentity:
    """The base model named in a saved head's config (its "base_model" entry)."""
    base = config["base_model"]
    return BaseModelIdentity(**{**base, "probe_logits": tuple(base["probe_logits"])})


H = TypeVar("H", bound=nn.Module)


def fitted_to(head: H, target: nn.Module | None, what: str, command: str) -> H:
    """`head` for inference: checked to belong to `target` and cast to its dtype (when given); a head of another
    model raises, naming `command` to train one for it."""
    if target is not None:
        problem = model_identity(target).mismatch(head.identity)
        if problem is not None:
            raise ValueError(f"{what} trained for another model ({problem}); train one for this model with `{command} --model ...`")
        head.to(next(target.parameters()).dtype)
    return head.eval().requires_grad_(False)
