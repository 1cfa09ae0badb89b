"""Gateway YAML configs: a full example loads; mistakes name the field and the fix."""

from __future__ import annotations

import pytest

from ember.gateway.config import (
    NANO_USD_PER_USD,
    ConfigError,
    config_from_dict,
    hash_key,
    load_config,
)
from tests.gateway.harness import write_config

EXAMPLE = {
    "backends": [
        {"name": "ember-a", "url": "http://127.0.0.1:8001/v1", "continuous_usage": True},
        {"name": "claude", "url": "http://127.0.0.1:8002/v1", "kind": "anthropic", "api_key": "env:NO_SUCH_VARIABLE"},
    ],
    "models": [
        {"name": "small", "aliases": ["default"], "backends": ["ember-a"], "routing": "prefix_aware",
         "fallbacks": ["big"], "price": {"input_per_million": 0.15, "output_per_million": 0.6}},
        {"name": "big", "backends": [{"backend": "claude", "model": "claude-x"}]},
    ],
    "keys": [{"name": "team-a", "key_sha256": hash_key("sk-a"), "models": ["small"], "budget_usd": 0.5, "rpm": 10, "tpm": 1000}],
    "store": {"kind": "redis", "url": "redis://127.0.0.1:6379/0"},
}  # fmt: skip


def test_the_example_config_loads_with_prices_in_nano_usd(tmp_path):
    config = load_config(write_config(tmp_path, EXAMPLE))
    small = config.resolve_model("default")
    assert small.name == "small" and small.routing == "prefix_aware" and small.fallbacks == ("big",)
    assert small.price.cost_nano_usd(1000, 100) == 1000 * 150 + 100 * 600
    assert config.resolve_model("big").deployments[0].upstream_model == "claude-x"
    assert config.backend("claude").api_key is None
    key = config.keys[0]
    assert key.budget_nano_usd == NANO_USD_PER_USD // 2 and key.allows("small") and not key.allows("big")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["models"][0].update(routing="random"), "models.small.routing: must be one of"),
        (lambda c: c["models"][0].update(fallbacks=["nope"]), "models.small.fallbacks: unknown model 'nope'"),
        (lambda c: c["models"][1].update(backends=["ghost"]), "models.big.backends: unknown backend 'ghost'"),
        (lambda c: c["keys"][0].update(key_sha256="sk-a"), "keys.team-a.key_sha256: must be a SHA-256 hex digest"),
        (lambda c: c.update(retry={"max_attempts": 0}), "retry.max_attempts: must be >= 1"),
        (lambda c: c.update(cache={"treshold": 0.5}), "cache: unknown field(s) ['treshold']"),
        (lambda c: c.update(store={"kind": "memcached"}), "store.kind: must be one of"),
    ],
)
def test_mistakes_name_the_field(change, message):
    import copy
    import re

    raw = copy.deepcopy(EXAMPLE)
    change(raw)
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict(raw)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
