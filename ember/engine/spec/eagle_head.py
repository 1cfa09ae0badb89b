"""The EAGLE-style draft head: it predicts the target's next final hidden state from the current one and the
token drawn from it, so drafting runs autoregressively at the feature level.

Medusa's heads read one hidden state and guess several tokens ahead blind to the tokens in
between; the EAGLE idea (Li et al. 2024) is to extrapolate features instead: given the target's
feature f_t and the token x_(t+1) it produced, the head gives f_(t+1), whose LM-head product
drafts x_(t+2); its own output then feeds the next draft step. Here the head is a fusion of the
two inputs (`2h -> h`, starting as f_t itself) and residual blocks; EAGLE's draft decoder layer
also attends over earlier features, which this head does not (it has no cache to keep or roll
back, and each draft step costs two small products plus the LM head).

The LM head product is the price of each draft step, so drafts come from a draft vocabulary:
the `vocab_ids` most frequent in the training corpus (then the lowest ids, which byte-level BPE
gives its most frequent merges), their rows read once from the target's own LM head. A token
outside it is never drafted; verification by the target keeps the output exact regardless.

Saved as a folder: `eagle.safetensors` (the head and its vocabulary) and `eagle_config.json`,
which names the base model as Medusa heads do (heads of another model are refused).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ember.engine.spec.medusa_heads import (
    BaseModelIdentity,
    ResidualBlock,
    fitted_to,
    read_saved_head,
    saved_identity,
)
from ember.models.causal_lm import CausalLM

HEAD_FILE = "eagle.safetensors"
CONFIG_FILE = "eagle_config.json"


class EagleHead(nn.Module):
    """(feature f_t, embedding of x_(t+1)) -> feature f_(t+1); `vocab_ids` are the tokens it may draft."""

    def __init__(self, identity: BaseModelIdentity, vocab_ids: torch.Tensor, num_blocks: int = 2) -> None:
        super().__init__()
        if not 1 <= num_blocks <= 8:
            raise ValueError("an EAGLE head has from 1 to 8 residual blocks")
        hidden = identity.hidden_size
        self.identity = identity
        self.fuse = nn.Linear(2 * hidden, hidden)
        with torch.no_grad():  # start as f_t itself: the head first repeats the target's next-token guess
            self.fuse.weight.zero_()
            self.fuse.weight[:, :hidden] = torch.eye(hidden)
            self.fuse.bias.zero_()
        self.blocks = nn.ModuleList(ResidualBlock(hidden) for _ in range(num_blocks))
        self.register_buffer("vocab_ids", vocab_ids.long().clone())

    def forward(self, feature: torch.Tensor, token_embedding: torch.Tensor) -> torch.Tensor:
        dtype = self.fuse.weight.dtype
        x = self.fuse(torch.cat([feature.to(dtype), token_embedding.to(dtype)], dim=-1))
        for block in self.blocks:
            x = block(x)
        return x

    def save(self, folder: Path) -> None:
        """Write `eagle.safetensors` and `eagle_config.json` into `folder` (created if missing)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            name: tensor.detach().contiguous() if name == "vocab_ids" else tensor.detach().float().contiguous()
            for name, tensor in self.state_dict().items()
        }
        save_file(tensors, str(folder / HEAD_FILE))
        config = {"num_blocks": len(self.blocks), "draft_vocab_size": len(self.vocab_ids), "base_model": asdict(self.identity)}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def token_embeddings(target: CausalLM, token_ids: torch.Tensor) -> torch.Tensor:
    """The target's input embeddings of `token_ids` (its `input_embedding()` table)."""
    return target.input_embedding()(token_ids)


def load_eagle_head(folder: Path | str, target: nn.Module | None = None) -> EagleHead:
    """A head saved by `EagleHead.save`; with `target`, checked to belong to it and cast to its dtype."""
    folder = Path(folder).expanduser()
    config, tensors = read_saved_head(folder, CONFIG_FILE, HEAD_FILE, "EAGLE head", "ember eagle train")
    head = EagleHead(saved_identity(config), tensors["vocab_ids"], int(config["num_blocks"]))
    head.load_state_dict(tensors)
    return fitted_to(head, target, f"the EAGLE head in {folder} was", "ember eagle train")
