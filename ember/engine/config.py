"""The engine's validated configuration: model, cache, scheduler and speculation, built once from flags or kwargs."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from ember.engine.device import DeviceConfig, add_device_arguments, device_from_args
from ember.engine.lora_request import LORA_DTYPES, LoRAConfig
from ember.engine.structured.grammars import BACKENDS
from ember.kv.cache_manager import PREFIX_CACHES
from ember.layers.draft_trees import MAX_TREE_NODES
from ember.parallel.config import ParallelConfig, add_parallel_arguments
from ember.quant.choices import (
    AT_LOAD_QUANTIZATIONS,
    QUANT_ACTIVATIONS,
    QUANTIZATION_ALIASES,
    QUANTIZATIONS,
)

# "auto": a quantized checkpoint stays quantized (float32 activations), a float one loads as float32.
DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other spellings
# "auto": the model's compute dtype; "fp8" (alias "fp8_e4m3"): float8 e4m3 with no scale, as vLLM's
# uncalibrated default, 1 byte per element; "fp8_e5m2": float8 e5m2 (2 mantissa bits, the range of float16)
# (torch dtypes: ember.kv.tensors.KV_CACHE_TORCH_DTYPES).
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass
class CacheConfig:
    """Paged KV cache: block size, the dtype of its elements and how much memory the blocks get.

    `num_kv_blocks` wins over `kv_cache_memory_bytes`; with neither, the cache gets enough
    blocks for `max_num_seqs` sequences of full context, capped at 1 GiB. A narrower
    `kv_cache_dtype` puts more blocks in the same bytes (fp8: 4x float32's, 2x bfloat16's).
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    prefix_cache: str = "hash"

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= 1024:
            raise ValueError("block_size must be from 1 to 1024 tokens")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if self.prefix_cache not in PREFIX_CACHES:
            raise ValueError(f"prefix_cache {self.prefix_cache!r} is not known; choose one of {', '.join(PREFIX_CACHES)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported; choose one of {', '.join(KV_CACHE_DTYPES)}"
            )


@dataclass
class SchedulerConfig:
    """Step budget: tokens per step, sequences per step, and whether long prompts are chunked."""

    # Small enough that a step with a prompt chunk stays short for the decoders sharing it
    # (CPU prefill runs ~1-2k tokens/s), large enough that the matrix products stay efficient.
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")


SPECULATIVE_METHODS = ("ngram", "draft", "medusa", "eagle")
MAX_SPECULATIVE_TOKENS = 16  # the deepest draft a sequence may verify in one step
DEFAULT_TREE_NODES = 7  # with the newest token, 8 rows: one query chunk of the attention op, as a decode row reads
# K when none is given. A lookup drafts for free, so a deeper cap costs only the rows verification rejects, which
# adaptive K weighs; copies run long (n-gram at K=8 over K=4 on SmolLM2, `ember bench spec`: code-edit 2.04x vs 1.93x).
LOOKUP_SPECULATIVE_TOKENS = 8
PRICED_SPECULATIVE_TOKENS = 4  # proposers whose every drafted token costs a forward (draft model, EAGLE) or a head


def default_speculative_tokens(method: str | None) -> int:
    """The draft length cap `method` gets when none is given."""
    return LOOKUP_SPECULATIVE_TOKENS if method == "ngram" else PRICED_SPECULATIVE_TOKENS


@dataclass
class SpeculativeConfig:
    """Speculative decoding: which proposer drafts, how many tokens, and the draft model if any.

    `method` None switches speculation off. "ngram" looks the last `ngram_max`..`ngram_min`
    tokens up earlier in the sequence (prompt lookup) and drafts what followed; "draft" runs
    `draft_model` (same tokenizer as the target; `draft_dtype` may differ from the target's, e.g.
    a bfloat16 copy of a float32 target as its own cheaper draft); "medusa" drafts with the heads
    saved in the folder `medusa_heads` (`ember medusa train`) over the target's last hidden state,
    at most one token per head; for greedy requests they draft a tree of `medusa_tree_nodes` candidates (each
    head's likeliest tokens, combined where the heads' ranks make them likeliest) verified in one ancestry-masked
    pass, 0 for one chain of each head's top token. None: `DEFAULT_TREE_NODES` where activations stay float, a chain
    where a layer rounds them to int8 (a tree's rows sum the same attention terms grouped otherwise than plain
    decoding does; the last-bit difference can move an int8 rounding step and flip a near-tie, so greedy output
    would no longer be plain decoding's token for token). "eagle" drafts token by token with the EAGLE-style head
    saved in the folder `eagle_head` (`ember eagle train`), which extrapolates the target's last hidden
    state. `adaptive` lets each sequence's draft length
    follow its acceptance rate, down to 0 (with a probe now and then) when speculation does
    not pay.
    """

    method: str | None = None
    num_speculative_tokens: int | None = None  # None: default_speculative_tokens(method)
    draft_model: str | None = None
    draft_dtype: str | None = None  # None: the target's dtype
    medusa_heads: str | None = None
    medusa_tree_nodes: int | None = None
    eagle_head: str | None = None
    ngram_max: int = 4
    ngram_min: int = 2
    adaptive: bool = True
    # Whether num_speculative_tokens was given (False: the method's default, which Medusa lowers to its head count).
    draft_length_given: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.draft_length_given = self.num_speculative_tokens is not None
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = default_speculative_tokens(self.method)
        if self.method is None:
            return
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method {self.method!r} is unknown; choose one of {', '.join(SPECULATIVE_METHODS)}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be from 1 to {MAX_SPECULATIVE_TOKENS}")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs a draft model; pass draft_model=PATH (--draft-model)")
        if self.method != "draft" and self.draft_model:
            raise ValueError(f"a draft model is only used by speculative method 'draft', not {self.method!r}; drop draft_model")
        if self.method == "medusa" and not self.medusa_heads:
            raise ValueError(
                "speculative method 'medusa' needs trained heads; pass medusa_heads=DIR (--medusa-heads), "
                "made by `ember medusa train`"
            )
        if self.method != "medusa" and self.medusa_heads:
            raise ValueError(f"Medusa heads are only used by speculative method 'medusa', not {self.method!r}; drop medusa_heads")
        if self.method == "eagle" and not self.eagle_head:
            raise ValueError(
                "speculative method 'eagle' needs a trained head; pass eagle_head=DIR (--eagle-head), made by `ember eagle train`"
            )
        if self.method != "eagle" and self.eagle_head:
            raise ValueError(f"an EAGLE head is only used by speculative method 'eagle', not {self.method!r}; drop eagle_head")
        if self.medusa_tree_nodes is not None and not 0 <= self.medusa_tree_nodes <= MAX_TREE_NODES:
            raise ValueError(f"medusa_tree_nodes must be from 0 (a chain) to {MAX_TREE_NODES}")
        if self.draft_dtype is not None and self.draft_dtype not in DTYPES:
            raise ValueError(f"draft dtype {self.draft_dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 16:
            raise ValueError("n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 16")

    @property
    def enabled(self) -> bool:
        return self.method is not None


@dataclass
class EngineConfig:
    """Everything needed to build an engine: which model, which tokenizer, dtype, cache, scheduler.

    `model` is a path (GGUF file, HF safetensors folder, llama2.c .bin) or a registered name;
    `tokenizer` overrides the model's own tokenizer. `lora`: serve LoRA adapters chosen per request (None: none).
    `device`: where the engine runs (ember.engine.device; "auto" is cuda where torch sees a GPU).
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    served_model_name: str | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    quant_activations: str = "int8"  # GGML layers: "int8" (fast, rounded per 32 values) or "float32" (exact)
    quantization: str | None = None  # one of QUANTIZATIONS (an alias becomes its name); None: the checkpoint as it is
    lora: LoRAConfig | None = None
    num_threads: int | None = None  # CPU threads of the step (torch and ember's kernels), fixed; None: ThreadGovernor's choice
    device: DeviceConfig = field(default_factory=DeviceConfig)
    num_threads: int | None = None  # CPU threads of the step (torch and ember's kernels); None: ember.engine.threads' default
    # who enforces structured outputs (ember.engine.structured.grammars.BACKENDS), and whether a run of tokens the
    # constraint forces is appended without a model step (jump-forward)
    structured_outputs_backend: str = "auto"
    jump_forward: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.parallel, ParallelConfig):
            raise TypeError("EngineConfig.parallel must be a ParallelConfig")
        if self.num_threads is not None and (isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int)
                                             or self.num_threads < 1):
            raise ValueError(f"num_threads must be a whole number of at least 1 (--threads), not {self.num_threads!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.quant_activations not in QUANT_ACTIVATIONS:
            raise ValueError(f"quant_activations {self.quant_activations!r} is not supported; choose one of {', '.join(QUANT_ACTIVATIONS)}")
        if not isinstance(self.device, DeviceConfig):
            raise TypeError("EngineConfig.device must be a DeviceConfig (LLM(device=...) takes the name)")
        self._check_quantization()
        self._check_lora()
        if self.structured_outputs_backend not in BACKENDS:
            raise ValueError(f"structured_outputs_backend {self.structured_outputs_backend!r} is unknown; choose one of "
                             f"{', '.join(BACKENDS)}")
        if self.device.device == "cuda":
            self.check_runs_on_cuda()

    def check_runs_on_cuda(self) -> None:
        """Refuse what ember runs on a CPU only so far, once the device is cuda (asked for by name: at config time;
        "auto" resolved to cuda: by the builder)."""
        cpu_only = [
            ("--tensor-parallel-size / --pipeline-parallel-size", self.parallel.is_parallel),
            ("--speculative-method", self.speculative.enabled),
            ("--enable-lora", self.lora is not None),
            (f"--quantization {self.quantization}", self.quantization in AT_LOAD_QUANTIZATIONS),
            (f"--kv-cache-dtype {self.cache.kv_cache_dtype}", self.cache.kv_cache_dtype.startswith("fp8")),
        ]
        for flag, is_set in cpu_only:
            if is_set:
                raise ValueError(f"{flag} runs on a CPU engine only so far; drop it or run with --device cpu")

    def _check_lora(self) -> None:
        """Adapters run in one process, on the target model: the target's adapter applies to verification, so the
        output is the adapter's. An n-gram proposer needs nothing; a draft model drafts without the adapter (a lower
        acceptance, never other tokens). Medusa / EAGLE heads, trained on the base model's hidden states, are refused."""
        if self.lora is None:
            return
        if self.parallel.is_parallel:
            raise ValueError("LoRA adapters (--enable-lora) run in one process: ember does not yet split adapters across "
                             "tensor / pipeline parallel ranks; drop --tensor-parallel-size / --pipeline-parallel-size")
        if self.speculative.method in ("medusa", "eagle"):
            raise ValueError(f"LoRA adapters (--enable-lora) do not run with speculative method {self.speculative.method!r}: "
                             "its heads were trained on the base model's hidden states, not an adapter's; use "
                             "--speculative-method ngram or draft, or drop --enable-lora")

    def _check_quantization(self) -> None:
        if self.quantization is None:
            return
        self.quantization = QUANTIZATION_ALIASES.get(self.quantization, self.quantization)
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization {self.quantization!r} is unknown; choose one of {', '.join(QUANTIZATIONS)}")
        if self.quantization in AT_LOAD_QUANTIZATIONS and self.dtype not in ("auto", "float32"):
            raise ValueError(f"--quantization {self.quantization} runs block layers with float32 activations; "
                             f"use --dtype auto or float32, not {self.dtype}")
        if self.quantization in AT_LOAD_QUANTIZATIONS and self.parallel.is_parallel:
            raise ValueError(f"--quantization {self.quantization} rounds weights in one process (worker ranks do not round "
                             "at load); quantize the checkpoint with `ember quantize` (its ranks keep the blocks), or drop "
                             "--tensor-parallel-size / --pipeline-parallel-size")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """Build the config from the flags `add_engine_arguments` defined."""
        return cls(
            model=model_from_args(args),
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            quant_activations=args.quant_activations,
            quantization=args.quantization,
            max_model_len=args.max_model_len,
            seed=args.seed,
            served_model_name=getattr(args, "served_model_name", None),
            cache=CacheConfig(
                block_size=args.block_size,
                num_kv_blocks=args.num_kv_blocks,
                kv_cache_memory_bytes=args.kv_cache_memory,
                enable_prefix_caching=args.enable_prefix_caching,
                kv_cache_dtype=args.kv_cache_dtype,
                prefix_cache=args.prefix_cache,
            ),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_num_seqs=args.max_num_seqs,
                enable_chunked_prefill=args.enable_chunked_prefill,
            ),
            speculative=_speculative_from_args(args),
            parallel=ParallelConfig.from_args(args),
            lora=LoRAConfig(args.max_loras, args.max_lora_rank, args.max_cpu_loras, args.lora_dtype) if args.enable_lora else None,
            num_threads=args.threads,
            device=device_from_args(args),
            structured_outputs_backend=args.structured_outputs_backend,
            jump_forward=args.jump_forward,
        )


def model_from_args(args: argparse.Namespace) -> str:
    """The model given as --model or first on the command line (not both, unless they agree)."""
    positional = getattr(args, "model_tag", None)
    if positional and args.model and positional != args.model:
        raise ValueError(f"two models given: {positional!r} and --model {args.model!r}; give one")
    if not (positional or args.model):
        raise ValueError("give the model to load: ember serve MODEL (or --model MODEL)")
    return positional or args.model


def _speculative_from_args(args: argparse.Namespace) -> SpeculativeConfig:
    """The speculation flags, or vLLM's --speculative-config JSON in their place."""
    flags = dict(method=args.speculative_method, num_speculative_tokens=args.num_speculative_tokens, draft_model=args.draft_model,
                 medusa_heads=args.medusa_heads, eagle_head=args.eagle_head)
    if args.speculative_config is not None:
        given = [name for name, value in flags.items() if value is not None]
        if given:
            flag = "speculative-method" if given[0] == "method" else given[0].replace("_", "-")
            raise ValueError(f"--speculative-config already says how to speculate; drop --{flag}")
        flags = args.speculative_config
    return SpeculativeConfig(**flags, draft_dtype=args.draft_dtype, medusa_tree_nodes=args.medusa_tree_nodes,
                             adaptive=not args.no_adaptive_speculation)


# vLLM's --speculative-config methods -> ember's proposer, and the SpeculativeConfig field its "model" fills
_VLLM_SPECULATION = {"ngram": ("ngram", None), "draft_model": ("draft", "draft_model"), "eagle": ("eagle", "eagle_head"),
                     "medusa": ("medusa", "medusa_heads")}
_VLLM_SPECULATION_KEYS = {"num_speculative_tokens": "num_speculative_tokens", "prompt_lookup_max": "ngram_max",
                          "prompt_lookup_min": "ngram_min"}


def parse_speculative_config(text: str) -> dict[str, Any]:
    """vLLM's --speculative-config JSON ({"method": "ngram", "num_speculative_tokens": 5}, {"model": DRAFT, ...})
    -> SpeculativeConfig fields; a key or method ember has no counterpart for is named."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"--speculative-config is not JSON ({error}); write e.g. "
                                         '\'{"method": "ngram", "num_speculative_tokens": 5}\'') from None
    if not isinstance(given, dict):
        raise argparse.ArgumentTypeError("--speculative-config is a JSON object, e.g. '{\"method\": \"ngram\"}'")
    method = given.get("method") or ("draft_model" if given.get("model") else None)
    if method not in _VLLM_SPECULATION:
        raise argparse.ArgumentTypeError(f"--speculative-config method {method!r} is not one ember runs; choose one of "
                                         f"{', '.join(_VLLM_SPECULATION)}")
    unknown = sorted(set(given) - {"method", "model", *_VLLM_SPECULATION_KEYS})
    if unknown:
        raise argparse.ArgumentTypeError(f"--speculative-config key {unknown[0]!r} has no counterpart in ember; drop it")
    proposer, model_field = _VLLM_SPECULATION[method]
    fields: dict[str, Any] = {"method": proposer}
    if model_field is not None and given.get("model"):
        fields[model_field] = given["model"]
    fields.update({ours: given[theirs] for theirs, ours in _VLLM_SPECULATION_KEYS.items() if theirs in given})
    return fields


def parse_bytes(text: str) -> int:
    """'512MiB', '2GB', '1e9' or a plain integer -> bytes."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    lowered = text.strip().lower()
    for suffix, factor in units.items():
        if lowered.endswith(suffix):
            return int(float(lowered[: -len(suffix)]) * factor)
    try:
        return int(float(lowered))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a size; write e.g. 512MiB or 2GB") from None


def add_engine_arguments(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    """The engine's flags, shared by every command that builds an engine; with `model_positional` the model may also
    come first, unflagged, as `vllm serve MODEL` takes it (`model_from_args`)."""
    defaults = EngineConfig(model="")
    if model_positional:
        parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="the model, as --model gives it")
    parser.add_argument("--model", required=not model_positional, help="registered name, GGUF file, HF folder or llama2.c .bin")
    parser.add_argument("--tokenizer", default=None, help="tokenizer file overriding the model's own")
    parser.add_argument("--dtype", default=defaults.dtype, choices=DTYPES, type=lambda name: DTYPE_ALIASES.get(name, name),
                        help="auto: keep a quantized checkpoint (GGUF Q4_0/Q4_1/Q8_0/k-quants) quantized; a float dtype forces "
                             "a float copy (vLLM's half and float name float16 and float32)")
    parser.add_argument("--quant-activations", default=defaults.quant_activations, choices=QUANT_ACTIVATIONS,
                        help="quantized (GGML) layers: int8 rounds activations per 32 values for integer dot products (fast); "
                             "float32 keeps them (exact: the dequantized float model's results)")
    parser.add_argument("--quantization", "-q", default=None, choices=QUANTIZATIONS,
                        help="round a float checkpoint's decoder linears as it loads: int8 (Q8_0), int4 (Q4_1), fp8 (e4m3, "
                             "a power-of-two scale per 32), nf4 (vLLM's bitsandbytes); a checkpoint format's name (gptq, "
                             "awq, ...) only asserts the checkpoint is quantized")
    parser.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's)")
    parser.add_argument("--block-size", type=int, default=defaults.cache.block_size)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--kv-cache-memory", type=parse_bytes, default=None, help="KV cache budget, e.g. 512MiB")
    parser.add_argument("--kv-cache-dtype", default=defaults.cache.kv_cache_dtype, choices=KV_CACHE_DTYPES,
                        help="KV cache elements: auto (the model's compute dtype), float32, bfloat16, fp8 (float8 e4m3, "
                             "unscaled: half bfloat16's bytes, so twice the tokens in the same memory) or fp8_e5m2 (float8 "
                             "with float16's range and 2 mantissa bits)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.scheduler.max_num_batched_tokens)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.scheduler.max_num_seqs)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="share the KV blocks of common prompt prefixes (default on; --no-prefix-caching too)")
    parser.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--prefix-cache", default=defaults.cache.prefix_cache, choices=PREFIX_CACHES,
                        help="radix: a token-granular radix tree (a prompt reuses a cached block's first tokens too); "
                             "hash: chained hashes of whole blocks (vLLM's)")
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                        help="split long prompts across steps beside the decoders (default on; --no-chunked-prefill too)")
    parser.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of unseeded sampling")
    lora = LoRAConfig()
    parser.add_argument("--structured-outputs-backend", choices=BACKENDS, default=defaults.structured_outputs_backend,
                        help="who enforces JSON / regex / choice / grammar outputs: ember's own engine (no grammars), "
                             "xgrammar, llguidance, or auto (ember's, and a grammar backend for grammars)")
    parser.add_argument("--jump-forward", action=argparse.BooleanOptionalAction, default=defaults.jump_forward,
                        help="append tokens a structured output forces without a model step (default on)")
    parser.add_argument("--enable-lora", action="store_true", help="serve PEFT LoRA adapters chosen per request")
    parser.add_argument("--max-loras", type=int, default=lora.max_loras, help="distinct adapters in one step (the slots)")
    parser.add_argument("--max-lora-rank", type=int, default=lora.max_lora_rank, help="highest adapter rank served")
    parser.add_argument("--max-cpu-loras", type=int, default=None, help="read adapters kept in memory (default: --max-loras)")
    parser.add_argument("--lora-dtype", choices=LORA_DTYPES, default=lora.lora_dtype,
                        help="adapters' dtype (auto: a float base's own, bfloat16 beside a quantized base)")
    parser.add_argument("--speculative-method", default=None, choices=SPECULATIVE_METHODS,
                        help="speculative decoding proposer (default: off)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help=f"most tokens drafted per step and sequence (default: {LOOKUP_SPECULATIVE_TOKENS} for ngram, "
                             f"{PRICED_SPECULATIVE_TOKENS} for the others)")
    parser.add_argument("--draft-model", default=None, help="draft model (same tokenizer) for --speculative-method draft")
    parser.add_argument("--draft-dtype", default=None, choices=DTYPES, help="dtype of the draft model (default: --dtype)")
    parser.add_argument("--medusa-heads", default=None,
                        help="folder of Medusa heads (`ember medusa train`) for --speculative-method medusa")
    parser.add_argument("--medusa-tree-nodes", type=int, default=None,
                        help=f"candidates a greedy Medusa step verifies as one tree (0: a chain of each head's top token; "
                             f"default {DEFAULT_TREE_NODES}, a chain where activations are rounded to int8)")
    parser.add_argument("--eagle-head", default=None,
                        help="folder of an EAGLE-style head (`ember eagle train`) for --speculative-method eagle")
    parser.add_argument("--no-adaptive-speculation", action="store_true",
                        help="always draft --num-speculative-tokens instead of following the acceptance rate")
    parser.add_argument("--speculative-config", type=parse_speculative_config, default=None,
                        help='vLLM\'s JSON in place of the flags above, e.g. \'{"method": "ngram", "num_speculative_tokens": 5}\' '
                             "or '{\"model\": DRAFT, \"num_speculative_tokens\": 4}'")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of each engine step, fixed (default: up to one per core, fewer while another "
                             "process keeping cores busy makes fewer faster; see ember.engine.threads)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="accepted so vLLM command lines run: ember executes no code shipped in a model folder")
    add_parallel_arguments(parser)
    add_device_arguments(parser)
