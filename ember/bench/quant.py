"""`ember bench quant`: perplexity, bytes per parameter and batch-1 decode speed per quantization method.

The float model is the checkpoint loaded as float32 (for the shared SmolLM2: its Q4_1 GGUF
dequantized). Each method quantizes that float model with `ember quantize`, calibrated on one
corpus, and is evaluated on another, over `eval_windows` consecutive windows of
EVAL_WINDOW_TOKENS tokens (pooled NLL). Each row's change over the float model comes with its
standard error across windows, so a difference between two methods can be told from the
variation of the text. The source checkpoint as it is (dtype auto) is a row of its own. Results
go to JSON and a perplexity-vs-bytes PNG.

Floors (what `--scale` never shrinks below, `ember.bench.feature_benches.FeatureSizes`):
MIN_CALIB_TOKENS tokens of calibration, since GPTQ's Hessian of a 1536-wide input (SmolLM2's
down_proj) has rank at most the number of calibration tokens and needs a few times more to be
estimated (the GPTQ paper calibrates on 128 x 2048 tokens); MIN_EVAL_WINDOWS windows, since one
window's perplexity moves with the passage: on botchan the float model's 512-token windows range
over 22-47.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ember.bench.quant_methods import DEFAULT_METHODS, METHOD_SPECS
from ember.engine.engine_request import EngineRequest
from ember.quant.checkpoint import QUANTIZATION_FILE
from ember.quant.config import ALPHA_AUTO

EVAL_WINDOW_TOKENS = 512
MIN_EVAL_WINDOWS = 4
MIN_CALIB_TOKENS = 2048
# GPTQ rows run with act-order: ember keeps the file's column groups, so it costs nothing at run time (plain Q4_1
# blocks). Measured once on SmolLM2 (2048 tinyshakespeare tokens, 4 x 512 botchan tokens, g128): +34.7% perplexity
# with act-order, +47.3% without (RTN +63.4%); 4096 calibration tokens without act-order gave +45.3%.


@dataclass(frozen=True)
class QuantBenchOptions:
    model: str
    calib: Path
    eval_file: Path
    methods: tuple[str, ...] = DEFAULT_METHODS
    group_size: int = 128
    eval_windows: int = 8  # of EVAL_WINDOW_TOKENS tokens each
    calib_tokens: int = 4096
    decode_tokens: int = 32
    # SmoothQuant's alpha for the sq8 row: by default chosen per model on the calibration text (`--alpha auto`). A fixed
    # alpha does not suit every model: measured once on SmolLM2 (botchan, 1024 tokens, calibrated on tinyshakespeare):
    # +2.8% perplexity at 0.5 (the paper's default), +0.7% at 0.8, +3.1% at 0.85 (the value published for Llama-2),
    # +2.7% at 0.9, +12% at 1.0, +14% at 0; +2.9% without smoothing (s = 1).
    sq_alpha: float | str = ALPHA_AUTO

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHOD_SPECS]
        if unknown:
            raise ValueError(f"unknown --methods {', '.join(unknown)}; choose from {', '.join(METHOD_SPECS)}")
        if self.eval_windows < 1:
            raise ValueError(f"--eval-windows must be at least 1 (the bench's scale keeps at least {MIN_EVAL_WINDOWS})")
        for path in (self.calib, self.eval_file):
            if not path.is_file():
                raise ValueError(f"{path} is not a file; give plain-text corpora for --calib and --eval")


@dataclass
class QuantRow:
    """One line of the quality table."""

    name: str
    perplexity: float
    bytes_per_parameter: float
    nominal_bytes_per_parameter: float
    decode_tok_s: float
    window_perplexities: tuple[float, ...] = ()
    quantize_s: float = 0.0


def bench_quant(options: QuantBenchOptions, tick: Callable[[str], None] = lambda _: None, time_kernels: bool = True) -> dict:
    """Rows for the float model, the checkpoint as stored, and each method; ratios to the float model.
    `time_kernels`: also time the W8A8 product paths on the model's layer shapes (when a W8A8 method is among them)."""
    from ember.models.registry import resolve_model
    from ember.quant.pipeline import FamilyRefused

    source = str(resolve_model(options.model))
    rows = [_evaluate("float32", source, "float32", options, tick), _evaluate("checkpoint as stored", source, "auto", options, tick)]
    not_run: dict[str, str] = {}  # methods this model's family cannot take, with the reason
    with tempfile.TemporaryDirectory(prefix="ember-bench-quant-") as scratch:
        for name in options.methods:
            try:
                path, seconds, group_size = _quantize(source, name, Path(scratch) / name, options, tick)
            except FamilyRefused as refusal:
                not_run[name] = str(refusal)
                continue
            description = json.loads((Path(scratch) / name / QUANTIZATION_FILE).read_text(encoding="utf-8"))
            row = _evaluate(_row_name(name, group_size, description), path, "auto", options, tick)
            row.quantize_s = seconds
            rows.append(row)
    float_ppl = rows[0].perplexity
    kernels = {}
    if time_kernels and times_w8a8_kernels(options.methods):
        from ember.bench.w8a8_kernels import bench_w8a8_kernels, layer_shapes

        tick("quant: timing the W8A8 product paths")
        kernels["w8a8_kernels"] = bench_w8a8_kernels(layer_shapes(source))
    return {
        **kernels,
        "model": options.model,
        "calib": str(options.calib),
        "eval": str(options.eval_file),
        "eval_tokens": options.eval_windows * EVAL_WINDOW_TOKENS,
        "eval_windows": options.eval_windows,
        "calib_tokens": options.calib_tokens,
        "not_run": not_run,
        "rows": [{**asdict(r), "ppl_vs_float_pct": 100.0 * (r.perplexity / float_ppl - 1.0),
                  "ppl_vs_float_se_pct": change_standard_error(r.window_perplexities, rows[0].window_perplexities)} for r in rows],
    }


def change_standard_error(windows: tuple[float, ...], float_windows: tuple[float, ...]) -> float | None:
    """Standard error, in percent, of a row's perplexity change over the float model, from the spread of
    the per-window log-ratios (None with fewer than two windows)."""
    if len(windows) < 2 or len(windows) != len(float_windows):
        return None
    logs = [math.log(a / b) for a, b in zip(windows, float_windows, strict=True)]
    return 100.0 * (math.exp(statistics.stdev(logs) / math.sqrt(len(logs))) - 1.0)


def change_cell(row: dict) -> str:
    """'+47.3% ± 2.1' (± the standard error across evaluation windows), or without it where not measured."""
    error = row.get("ppl_vs_float_se_pct")
    return f"{row['ppl_vs_float_pct']:+.1f}%" + (f" ± {error:.1f}" if error else "")


def times_w8a8_kernels(methods: tuple[str, ...]) -> bool:
    """Whether the table gets the W8A8 product timings (one progress step): when a W8A8 method is in it."""
    return any(METHOD_SPECS[name][0] == "smoothquant" for name in methods)


def _quantize(source: str, name: str, out: Path, options: QuantBenchOptions, tick: Callable[[str], None]) -> tuple[str, float, int | None]:
    """(checkpoint path, seconds, group size: None for one scale per output channel) of `name` applied to `source`."""
    from ember.quant.config import FIXED_GROUP_SIZE, PER_CHANNEL_METHODS, QuantizeConfig
    from ember.quantize import quantize_checkpoint

    method, bits = METHOD_SPECS[name]
    tick(f"quant, {options.model}: quantizing {name}")
    start = time.perf_counter()
    group_size = None if method in PER_CHANNEL_METHODS else FIXED_GROUP_SIZE.get(method, options.group_size)
    config = QuantizeConfig(model=source, method=method, out=out, bits=bits, group_size=group_size, act_order=method == "gptq",
                            calib=options.calib, calib_tokens=options.calib_tokens, alpha=options.sq_alpha if method == "smoothquant" else None)
    quantize_checkpoint(config, show_progress=False)
    checkpoint = out / "model.gguf" if (out / "model.gguf").is_file() else out
    return str(checkpoint), time.perf_counter() - start, group_size


def _row_name(name: str, group_size: int | None, description: dict) -> str:
    """'rtn4 g128', 'gptq4 g128 act-order', or for one scale per output channel 'sq8 a0.85 per-channel' ('sq8 auto a0.8
    per-channel' where the checkpoint's `description` says the alpha was searched)."""
    if group_size is not None:
        return f"{name} g{group_size}" + (" act-order" if METHOD_SPECS[name][0] == "gptq" else "")
    searched = "auto " if "alpha_search" in description else ""
    return f"{name} {searched}a{description['alpha']:g} per-channel"


def _evaluate(name: str, model: str, dtype: str, options: QuantBenchOptions, tick: Callable[[str], None]) -> QuantRow:
    from ember.engine.config import CacheConfig, EngineConfig
    from ember.engine.llm_engine import LLMEngine
    from ember.eval.perplexity import windowed_perplexity

    tick(f"quant, {options.model}: evaluating {name}")
    engine = LLMEngine(EngineConfig(model=model, dtype=dtype, cache=CacheConfig(kv_cache_memory_bytes=256 << 20)))
    text = options.eval_file.read_text(encoding="utf-8", errors="replace")
    ppl = windowed_perplexity(engine, text, EVAL_WINDOW_TOKENS, options.eval_windows)
    weights = weight_bytes(engine.runner.model)
    return QuantRow(name, ppl.perplexity, weights.bytes_per_parameter, weights.nominal_bytes_per_parameter,
                    _decode_tok_s(engine, options.decode_tokens), ppl.window_perplexities)


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of a model's weights in memory, and nominally (each group's scales once), over its parameters."""

    memory_bytes: int
    nominal_bytes: float
    parameters: int

    @property
    def bytes_per_parameter(self) -> float:
        return self.memory_bytes / self.parameters

    @property
    def nominal_bytes_per_parameter(self) -> float:
        return self.nominal_bytes / self.parameters


def weight_bytes(model: torch.nn.Module) -> WeightBytes:
    """GGML blocks and W8A8 int8 rows (non-persistent buffers, shared blocks once) plus every state-dict tensor.

    The state dict is the weights' dense view (packed float panels are unpacked there); a tied
    table appears under two names with equal values and is counted once.
    """
    from ember.quant.ggml.layers import GGMLEmbedding, GGMLLinear
    from ember.quant.int8.w8a8_layers import W8A8Linear

    memory = parameters = 0
    nominal = 0.0
    seen_blocks: set[int] = set()
    for module in model.modules():
        if isinstance(module, W8A8Linear):
            blocks = module.weight_tensor
        elif isinstance(module, (GGMLLinear, GGMLEmbedding)) and module.qweight.data_ptr() not in seen_blocks:
            seen_blocks.add(module.qweight.data_ptr())
            blocks = module.weight_blocks
        else:
            continue
        memory += blocks.nbytes
        nominal += blocks.nominal_bytes()
        parameters += blocks.shape[0] * blocks.shape[1]
    kept: dict[tuple, list[torch.Tensor]] = {}
    for tensor in model.state_dict().values():
        same_kind = kept.setdefault((tuple(tensor.shape), tensor.dtype, tuple(tensor.flatten()[:8].tolist())), [])
        if any(torch.equal(t, tensor) for t in same_kind):
            continue  # a tied weight under its second name
        same_kind.append(tensor)
        memory += tensor.numel() * tensor.element_size()
        nominal += tensor.numel() * tensor.element_size()
        parameters += tensor.numel()
    return WeightBytes(memory, nominal, parameters)


def _decode_tok_s(engine, decode_tokens: int) -> float:
    """Median single-stream decode steps per second after a 64-token prompt."""
    from ember.engine.sampling_params import SamplingParams

    engine.add_request(EngineRequest("decode", list(range(10, 74)), SamplingParams(max_tokens=decode_tokens, temperature=0.0, ignore_eos=True)))
    step_s = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - start)
    return 1.0 / statistics.median(step_s[1:])  # the first step is the prompt


def plot_quant(section: dict, path: Path) -> Path:
    """Perplexity against bytes per parameter, one labelled point per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for row in section["rows"]:
        axes.scatter(row["bytes_per_parameter"], row["perplexity"])
        axes.annotate(row["name"], (row["bytes_per_parameter"], row["perplexity"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("bytes per parameter (in memory)")
    axes.set_ylabel(f"perplexity ({Path(section['eval']).name}, {section['eval_tokens']} tokens)")
    axes.set_title(f"{section['model']}: quantization methods, calibrated on {Path(section['calib']).name}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
