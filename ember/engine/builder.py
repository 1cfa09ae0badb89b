"""Wiring an LLMEngine from its config: the model (and worker ranks), tokenizer, KV cache, scheduler, request
limits, speculator and runner, each built once, in the order their sizes depend on one another.

`LLMEngine` takes the parts (`EngineParts`) and only runs steps; everything here runs once per engine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ember.config.model import ModelConfig
from ember.engine.config import DEFAULT_TREE_NODES, EngineConfig
from ember.engine.cuda_graphs import GraphSettings, capture_sizes
from ember.engine.limits import RequestLimits
from ember.engine.lora import AdapterPool
from ember.engine.runner import ModelRunner, kv_cache_bytes_per_block, verifies_trees
from ember.engine.scheduler import Scheduler
from ember.engine.spec.speculator import Proposer, Speculator
from ember.engine.stop_checker import StopChecker
from ember.engine.structured.structured_outputs import StructuredOutputs
from ember.kv.cache_manager import KVCacheManager
from ember.kv.tensors import kv_cache_layout, kv_cache_torch_dtype
from ember.layers.rejection_sampler import RejectionSampler
from ember.layers.sampler import Sampler
from ember.models.loader import LoadedModel, compute_dtype, load_model
from ember.models.registry import resolve_model
from ember.quant.ggml.kernels import MAX_GEMV_ROWS
from ember.quant.ggml.layers import set_activations
from ember.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from ember.parallel.driver import WorkerGroup

logger = logging.getLogger(__name__)

DEFAULT_KV_CACHE_BYTES = 1 << 30


@dataclass
class EngineParts:
    """What an LLMEngine runs with, wired once from its config by `EngineBuilder`."""

    model_config: ModelConfig
    model_name: str
    tokenizer_source: Path | None
    tokenizer: Tokenizer | None
    max_model_len: int
    block_size: int
    workers: WorkerGroup | None
    kv: KVCacheManager
    scheduler: Scheduler
    limits: RequestLimits
    speculator: Speculator | None
    runner: ModelRunner
    stop_checker: StopChecker
    structured_outputs: StructuredOutputs
    adapters: AdapterPool | None  # LoRA: adapters beside the model's linears (None: config.lora is None)


class EngineBuilder:
    """Builds an engine's parts from `config`, once (`build`). A `--medusa-heads` engine without a draft length
    given takes its K from the heads, written back into `config.speculative`."""

    def __init__(self, config: EngineConfig, show_progress: bool = False) -> None:
        self.config = config
        self.show_progress = show_progress
        self.block_size = config.cache.block_size
        self.workers: WorkerGroup | None = None
        self.device = config.device.resolved()
        self.load_dtype = config.device.load_dtype(config.dtype, self.device)

    def build(self, loaded: LoadedModel | None = None, draft_loaded: LoadedModel | None = None) -> EngineParts:
        """`loaded` (`draft_loaded`) reuses weights already in memory (they hold no per-engine state);
        else `config.model` (the speculative draft model) is loaded."""
        config, show_progress = self.config, self.show_progress
        torch.manual_seed(config.seed)
        model_path = resolve_model(config.model)
        if self.device.type == "cuda":
            config.check_runs_on_cuda()  # "auto" became cuda here
            _refuse_cuda_without_triton()
        if loaded is None and config.parallel.is_parallel:
            from ember.parallel.driver import WorkerGroup

            self.workers, loaded = WorkerGroup.start(model_path, config.dtype, config.parallel, show_progress, config.max_model_len,
                                                     config.quant_activations)
        loaded = loaded or load_model(model_path, self.load_dtype, show_progress=show_progress, max_model_len=config.max_model_len,
                                      quantization=config.quantization, device=self.device)
        num_ggml_layers = set_activations(loaded.model, config.quant_activations)  # 0 without GGML layers
        self.rounds_activations = rounds_activations(loaded.model, num_ggml_layers, config.quant_activations)
        self.rows_per_weight_pass = MAX_GEMV_ROWS if num_ggml_layers else None  # decode-sized products run in passes
        self.model_config = loaded.config
        tokenizer_source = _tokenizer_source(config, loaded)
        tokenizer = load_tokenizer_from(tokenizer_source)
        positions = loaded.config.rotary_table_positions  # the model's context, or the one it was loaded for
        self.max_model_len = min(config.max_model_len or positions, positions)
        self.kv_layout = kv_cache_layout(loaded.model)
        self.kv_cache_dtype = kv_cache_torch_dtype(config.cache.kv_cache_dtype) or compute_dtype(self.load_dtype)
        num_blocks = self._num_kv_blocks(loaded.config)
        kv = KVCacheManager(num_blocks, self.block_size, config.cache.enable_prefix_caching, self.kv_layout.group_windows,
                            config.cache.prefix_cache)
        limits = RequestLimits(
            vocab_size=loaded.config.vocab_size,
            max_model_len=self.max_model_len,
            num_kv_blocks=num_blocks,
            block_size=self.block_size,
            group_windows=tuple(self.kv_layout.group_windows),
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
            max_num_seqs=config.scheduler.max_num_seqs,
            enable_chunked_prefill=config.scheduler.enable_chunked_prefill,
            has_tokenizer=tokenizer is not None,
            structured_outputs_backend=config.structured_outputs_backend,
        )
        generator = torch.Generator(device=self.device).manual_seed(config.seed)
        eos_ids = tokenizer.eos_ids if tokenizer is not None else frozenset()
        speculator = self._make_speculator(num_blocks, show_progress, draft_loaded, loaded.model)
        rejection = RejectionSampler(generator) if speculator is not None else None
        adapters = AdapterPool(loaded.model, config.lora) if config.lora is not None else None
        runner = ModelRunner(
            loaded.model, num_blocks, self.block_size, kv, Sampler(generator), eos_ids, rejection, self.workers,
            self.kv_cache_dtype, keeps_last_hidden=speculator is not None and speculator.proposer.uses_last_hidden,
            adapters=adapters, device=self.device, graphs=self._graph_settings(),
        )
        return EngineParts(
            model_config=loaded.config,
            model_name=config.served_model_name or default_model_name(config.model),
            tokenizer_source=tokenizer_source,
            tokenizer=tokenizer,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            workers=self.workers,
            kv=kv,
            scheduler=Scheduler(config.scheduler, kv, None if config.lora is None else config.lora.max_loras),
            limits=limits,
            speculator=speculator,
            runner=runner,
            stop_checker=StopChecker(eos_ids, self.max_model_len),
            structured_outputs=StructuredOutputs(tokenizer, loaded.config.vocab_size, config.structured_outputs_backend),
            adapters=adapters,
        )

    def _make_speculator(
        self, num_blocks: int, show_progress: bool, draft: LoadedModel | None, target: torch.nn.Module
    ) -> Speculator | None:
        """The configured proposer behind a speculator, or None when speculation is off."""
        spec = self.config.speculative
        if not spec.enabled:
            return None
        if spec.method == "ngram":
            from ember.engine.spec.ngram import NgramProposer

            return self._speculator(NgramProposer(spec.ngram_max, spec.ngram_min))
        if spec.method == "medusa":
            return self._medusa_speculator(target)
        if spec.method == "eagle":
            return self._eagle_speculator(target)
        from ember.engine.spec.draft_model import DraftModelProposer

        assert spec.draft_model is not None  # SpeculativeConfig checked it
        draft = draft or load_model(resolve_model(spec.draft_model), spec.draft_dtype or self.config.dtype, show_progress=show_progress,
                                    max_model_len=self.max_model_len)
        if self.config.lora is not None and draft.model is target:
            raise ValueError("a draft model sharing the target's weights object would run the target's adapter layers: "
                             "load the draft's weights on their own (draft_loaded=None) when serving LoRA adapters")
        if draft.config.vocab_size != self.model_config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft.config.vocab_size} tokens) differs from the target's "
                f"({self.model_config.vocab_size}); give a draft model with the same tokenizer"
            )
        # An explicit cache dtype holds for the draft's cache too (same block count); "auto" follows the draft's dtype.
        cache_dtype = kv_cache_torch_dtype(self.config.cache.kv_cache_dtype)
        proposer = DraftModelProposer(draft.model, num_blocks, self.block_size, self._proposer_generator(),
                                      draft.config.max_position_embeddings, cache_dtype)
        return self._speculator(proposer)

    def _eagle_speculator(self, target: torch.nn.Module) -> Speculator:
        """An EAGLE-style head checked against the target."""
        from ember.engine.spec.eagle import EagleProposer
        from ember.engine.spec.eagle_head import load_eagle_head

        spec = self.config.speculative
        self._refuse_split_lm_head("an EAGLE head reads")
        assert spec.eagle_head is not None  # SpeculativeConfig checked it
        head = load_eagle_head(spec.eagle_head, target)
        return self._speculator(EagleProposer(head, target, self._proposer_generator()))

    def _medusa_speculator(self, target: torch.nn.Module) -> Speculator:
        """Medusa heads checked against the target, drafting at most one token per head."""
        from ember.engine.spec.medusa import MedusaProposer
        from ember.engine.spec.medusa_heads import load_medusa_heads

        spec = self.config.speculative
        self._refuse_split_lm_head("Medusa heads read")
        assert spec.medusa_heads is not None  # SpeculativeConfig checked it
        heads = load_medusa_heads(spec.medusa_heads, target)
        if not spec.draft_length_given and spec.num_speculative_tokens > heads.num_heads:
            spec = self.config.speculative = replace(spec, num_speculative_tokens=heads.num_heads)  # as vLLM takes K from the heads
        if spec.num_speculative_tokens > heads.num_heads:
            raise ValueError(
                f"the Medusa heads in {spec.medusa_heads} draft at most {heads.num_heads} tokens; "
                f"pass num_speculative_tokens <= {heads.num_heads} (--num-speculative-tokens) or train more heads"
            )
        # The runner is built after the speculator; whether it verifies trees follows from the same model and workers.
        tree_nodes = spec.medusa_tree_nodes
        if tree_nodes is None:
            tree_nodes = 0 if self.rounds_activations else DEFAULT_TREE_NODES
        if not verifies_trees(kv_cache_layout(target), self.workers):
            tree_nodes = 0
        return self._speculator(MedusaProposer(heads, target, self._proposer_generator(), tree_nodes))

    def _speculator(self, proposer: Proposer) -> Speculator:
        """`proposer` behind this engine's speculative config, told how the target's products run (passes or not)."""
        return Speculator(self.config.speculative, proposer, self.rows_per_weight_pass)

    def _refuse_split_lm_head(self, reader: str) -> None:
        """Heads over the target's LM head need all of it, which tensor parallelism splits across ranks."""
        if self.workers is not None:
            raise ValueError(f"{reader} the whole LM head, which tensor parallelism splits; run without --tensor-parallel-size")

    def _proposer_generator(self) -> torch.Generator:
        """The proposers' own random stream (unseeded sampled drafts), apart from the sampler's."""
        return torch.Generator().manual_seed(self.config.seed + 1)

    def _graph_settings(self) -> GraphSettings | None:
        """Decode graphs on CUDA unless --enforce-eager, for a model whose layers form one group of full attention (the
        graphs' static buffers hold one block table per sequence); None on a CPU."""
        if self.device.type != "cuda" or self.config.device.enforce_eager:
            return None
        if self.kv_layout.group_windows != (None,):
            logger.info("decode steps run eagerly: CUDA graphs are captured for models with one group of full-attention "
                        "layers, and this one has sliding windows %s", self.kv_layout.group_windows)
            return None
        max_num_seqs = self.config.scheduler.max_num_seqs
        return GraphSettings(capture_sizes(max_num_seqs), -(-self.max_model_len // self.block_size))

    def _num_kv_blocks(self, config: ModelConfig) -> int:
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        per_block = kv_cache_bytes_per_block(config, self.block_size, self.kv_cache_dtype, self.kv_layout)
        if cache.kv_cache_memory_bytes is None and self.device.type == "cuda":
            return self._blocks_in_gpu_memory(config, per_block)
        if cache.kv_cache_memory_bytes is not None:
            blocks = cache.kv_cache_memory_bytes // per_block
            if blocks < 1:
                raise ValueError(f"--kv-cache-memory {cache.kv_cache_memory_bytes} holds no block; one block takes {per_block} bytes")
            return blocks
        wanted = -(-self.max_model_len // self.block_size) * self.config.scheduler.max_num_seqs
        return max(1, min(wanted, DEFAULT_KV_CACHE_BYTES // per_block))


    def _blocks_in_gpu_memory(self, config: ModelConfig, per_block: int) -> int:
        """The blocks that fit in --gpu-memory-utilization of the GPU once the weights (loaded), other processes' memory
        and a step's activations are counted."""
        free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
        scheduler = self.config.scheduler
        element = torch.empty((), dtype=compute_dtype(self.load_dtype)).element_size()
        budget = gpu_kv_cache_bytes(total_bytes, free_bytes, self.config.device.gpu_memory_utilization,
                                    step_activation_bytes(config, scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
                                                          element))
        blocks = budget // per_block - 1  # one scratch block for the decode graphs' padding rows
        if blocks < 1:
            raise ValueError(f"--gpu-memory-utilization {self.config.device.gpu_memory_utilization} leaves no room for the "
                             f"KV cache ({free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB free after loading the "
                             "weights); raise it, or lower --max-num-batched-tokens / --max-num-seqs")
        logger.info("KV cache: %d blocks of %d tokens (%.2f GiB) in --gpu-memory-utilization %.2f", blocks, self.block_size,
                    blocks * per_block / 2**30, self.config.device.gpu_memory_utilization)
        return blocks


def _refuse_cuda_without_triton() -> None:
    """A CUDA engine's attention runs in the Triton kernels (the torch code beside them is their reference)."""
    from ember.layers.triton_kernels import load_triton_kernels

    if load_triton_kernels() is None:
        raise ValueError("a CUDA engine runs its attention in Triton kernels, and triton is not installed: "
                         "pip install triton (or pip install -e '.[gpu]'), or run with --device cpu")


# Beyond the weights and the cache: the CUDA context's own allocations, cuBLAS workspaces and the graphs' pool.
GPU_RUNTIME_RESERVE_BYTES = 512 << 20


def gpu_kv_cache_bytes(total_bytes: int, free_bytes: int, utilization: float, activation_bytes: int) -> int:
    """Bytes the KV cache may take on a GPU: `utilization` of its total memory, less what is in use already (this
    process's weights, any other process's memory), a step's activations and the runtime's reserve (vLLM's rule,
    with the activations estimated instead of profiled); 0 when nothing is left."""
    in_use = total_bytes - free_bytes
    return max(0, int(total_bytes * utilization) - in_use - activation_bytes - GPU_RUNTIME_RESERVE_BYTES)


def step_activation_bytes(config: ModelConfig, max_tokens: int, max_seqs: int, element_bytes: int) -> int:
    """A bound on one step's live activations: a few hidden-sized and two intermediate-sized tensors per token
    (the layer's projections, freed layer by layer) and float32 logits, softmax and noise for the sampled rows."""
    per_token = (6 * config.hidden_size + 3 * config.intermediate_size + 2 * config.num_heads * config.head_dim) * element_bytes
    return max_tokens * per_token + 4 * max_seqs * config.vocab_size * 4


def rounds_activations(model: torch.nn.Module, num_ggml_layers: int, quant_activations: str) -> bool:
    """Whether some layer rounds its input to int8 (GGML layers with int8 activations, SmoothQuant's W8A8)."""
    from ember.quant.int8.w8a8_layers import W8A8Linear

    if num_ggml_layers and quant_activations == "int8":
        return True
    return any(isinstance(module, W8A8Linear) for module in model.modules())


def default_model_name(given: str) -> str:
    """A registered name as it is; a path by its file or folder name (a folder holding one GGUF: the folder's)."""
    return given if not Path(given).exists() else Path(os.path.abspath(Path(given).expanduser())).stem


def _tokenizer_source(config: EngineConfig, loaded: LoadedModel) -> Path | None:
    """The file the tokenizer comes from: `--tokenizer`, else the model's own, else none."""
    return Path(config.tokenizer) if config.tokenizer else loaded.tokenizer_path


def load_tokenizer_from(source: Path | None) -> Tokenizer | None:
    """The tokenizer stored at `source` (None when there is none)."""
    if source is None:
        return None
    from ember.tokenizers import load as load_tokenizer

    return load_tokenizer(source)
