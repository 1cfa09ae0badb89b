"""Each ember variant changes only its lever; everything else stays at the engine's own defaults."""

from __future__ import annotations

from ember.bench.ember_runner import EmberSettings
from ember.engine.config import CacheConfig, SchedulerConfig


def test_the_default_variant_is_the_engine_as_configured_by_default():
    config = EmberSettings().config("model", "float32")
    assert config.scheduler == SchedulerConfig()
    assert config.cache == CacheConfig()


def test_a_lever_variant_changes_only_what_it_names():
    config = EmberSettings(enable_chunked_prefill=False, max_num_batched_tokens=4096).config("model", "bfloat16")
    assert (config.scheduler.enable_chunked_prefill, config.scheduler.max_num_batched_tokens) == (False, 4096)
    assert config.scheduler.max_num_seqs == SchedulerConfig().max_num_seqs
    assert config.cache.enable_prefix_caching is True and config.dtype == "bfloat16"


def test_the_kv_cache_dtype_variant_changes_only_the_cache_dtype():
    config = EmberSettings(kv_cache_dtype="fp8").config("model", "float32")
    assert config.cache == CacheConfig(kv_cache_dtype="fp8")
    assert config.scheduler == SchedulerConfig()
