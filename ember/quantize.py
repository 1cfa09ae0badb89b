"""`ember quantize` end to end: the float32 model in an engine, driven for ember.quant's calibration.

ember.quant holds the methods (calibration statistics, GPTQ, AWQ, SmoothQuant, the checkpoint
writer) and sits below the engine; this module, a floor above both, builds the engine and runs the
calibration text through it on quant's behalf (`EngineCalibration`, quant's `CalibrationRun`).
"""

from __future__ import annotations

from collections.abc import Callable

from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.eval.perplexity import token_nll
from ember.models.family_registry import family_of, quantizable_architectures
from ember.models.loader import source_names
from ember.models.registry import resolve_model
from ember.quant.config import QuantizeConfig
from ember.quant.pipeline import QuantizeResult, QuantizeTarget, quantize_model


def quantize_checkpoint(config: QuantizeConfig, show_progress: bool = True) -> QuantizeResult:
    """Quantize `config.model` by `config.method` and write the checkpoint to `config.out`."""
    engine = float_engine(config)
    source = resolve_model(config.model)
    architecture = engine.model_config.architecture
    target = QuantizeTarget(source, source_names(source, engine.model_config), family_of(architecture).quantize_formats,
                            quantizable_architectures())
    return quantize_model(EngineCalibration(engine), engine.runner.model, engine.model_config, engine.tokenizer, config,
                          target, show_progress)


def float_engine(config: QuantizeConfig) -> LLMEngine:
    """The float32 model in an engine whose step budget and KV cache take every calibration chunk in one step (GPTQ)."""
    sequences = -(-config.calib_tokens // (config.seq_len - 1)) + 1
    batch = SchedulerConfig(max_num_batched_tokens=max(512, config.calib_tokens), max_num_seqs=max(64, sequences))
    cache = CacheConfig(num_kv_blocks=config.calib_tokens // 16 + 2 * sequences + 64, enable_prefix_caching=False)
    return LLMEngine(EngineConfig(model=config.model, tokenizer=config.tokenizer, dtype="float32", max_model_len=config.seq_len,
                                  cache=cache, scheduler=batch))


class EngineCalibration:
    """Calibration chunks run through an engine as prefills (one greedy token each): quant's `CalibrationRun`."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def prefill_each(self, chunks: list[list[int]], after_each: Callable[[], None]) -> None:
        """Each chunk to completion on its own, in order; `after_each` called after each one."""
        for index, chunk in enumerate(chunks):
            self._add(index, chunk)
            self._finish()
            after_each()

    def prefill_together(self, chunks: list[list[int]]) -> None:
        """Every chunk in one engine step: the scheduler's budget (`float_engine`) holds all calibration tokens."""
        for index, chunk in enumerate(chunks):
            self._add(index, chunk)
        self.engine.step()
        self._finish()

    def token_nll(self, request_id: str, token_ids: list[int]) -> list[float]:
        """The NLL of every token after the first (ember.eval.perplexity's scoring)."""
        return token_nll(self.engine, request_id, token_ids)

    def _add(self, index: int, chunk: list[int]) -> None:
        self.engine.add_request(EngineRequest(f"calibration-{index}", chunk, SamplingParams(max_tokens=1, temperature=0.0)))

    def _finish(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()
