"""The gateway's configuration: typed, validated dataclasses built once from a YAML file.

Every mistake in the file raises `ConfigError` naming the offending path (`models[1].backends`)
and what to write instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

BACKEND_KINDS = ("openai", "anthropic")
ROUTING_POLICIES = ("round_robin", "least_outstanding", "latency_weighted", "prefix_aware")
STORE_KINDS = ("sqlite", "redis")
TRACE_EXPORTERS = ("none", "console", "memory")
NANO_USD_PER_USD = 1_000_000_000


class ConfigError(ValueError):
    """A gateway config that cannot be used; the message names the field and the fix."""


def _check(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"gateway config {where}: {message}")


def hash_key(plaintext_key: str) -> str:
    """The at-rest form of a virtual key: its SHA-256 hex digest (keys are random, so no salt is needed)."""
    return hashlib.sha256(plaintext_key.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """One upstream server. `url` is its API base (ending in /v1 for OpenAI-style servers).

    `continuous_usage`: the server reports usage on every stream chunk when asked with
    `stream_options.continuous_usage_stats` (ember serve and vLLM do), so a stream the client
    cuts is billed exactly; without it the gateway counts one token per content chunk.
    """

    name: str
    url: str
    kind: str = "openai"
    api_key: str | None = None
    timeout_s: float = 60.0
    connect_timeout_s: float = 2.0
    first_token_timeout_s: float = 30.0
    continuous_usage: bool = False

    def __post_init__(self) -> None:
        _check(self.kind in BACKEND_KINDS, f"backends.{self.name}.kind", f"must be one of {BACKEND_KINDS}")
        _check(self.url.startswith(("http://", "https://")), f"backends.{self.name}.url", "must start with http:// or https://")
        for field in ("timeout_s", "connect_timeout_s", "first_token_timeout_s"):
            _check(getattr(self, field) > 0, f"backends.{self.name}.{field}", "must be > 0")


@dataclasses.dataclass(frozen=True)
class Price:
    """Money per token, in nano-USD (integers, so budgets add up exactly)."""

    input_nano_usd_per_token: int = 0
    output_nano_usd_per_token: int = 0

    @staticmethod
    def per_million(input_usd: float, output_usd: float) -> Price:
        """A price from the usual quote: USD per million input / output tokens."""
        return Price(round(input_usd * 1000), round(output_usd * 1000))

    def cost_nano_usd(self, prompt_tokens: int, completion_tokens: int) -> int:
        """What these tokens cost, in nano-USD."""
        return prompt_tokens * self.input_nano_usd_per_token + completion_tokens * self.output_nano_usd_per_token


@dataclasses.dataclass(frozen=True)
class Deployment:
    """A model served by one backend, under the name that backend knows it by."""

    backend: str
    upstream_model: str


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model clients can ask for: its group of deployments, routing policy and fallback chain."""

    name: str
    deployments: tuple[Deployment, ...]
    aliases: tuple[str, ...] = ()
    routing: str = "round_robin"
    fallbacks: tuple[str, ...] = ()
    price: Price = Price()

    def __post_init__(self) -> None:
        _check(bool(self.deployments), f"models.{self.name}.backends", "list at least one backend")
        _check(self.routing in ROUTING_POLICIES, f"models.{self.name}.routing", f"must be one of {ROUTING_POLICIES}")


@dataclasses.dataclass(frozen=True)
class KeyConfig:
    """A virtual key: only its SHA-256 is stored. `models` empty means every model."""

    name: str
    key_sha256: str
    tenant: str
    models: tuple[str, ...] = ()
    budget_nano_usd: int | None = None
    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        _check(len(self.key_sha256) == 64, f"keys.{self.name}.key_sha256", "must be a SHA-256 hex digest (`ember gateway hash-key KEY`)")
        for field in ("budget_nano_usd", "rpm", "tpm"):
            value = getattr(self, field)
            _check(value is None or value >= 0, f"keys.{self.name}.{field}", "must be >= 0")

    def allows(self, model: str) -> bool:
        """Whether this key may call `model` (a configured name, after alias resolution)."""
        return not self.models or "*" in self.models or model in self.models


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Attempts per request (across backends and fallback models) and exponential backoff."""

    max_attempts: int = 4
    backoff_base_s: float = 0.05
    backoff_max_s: float = 1.0

    def __post_init__(self) -> None:
        _check(self.max_attempts >= 1, "retry.max_attempts", "must be >= 1")
        _check(0 <= self.backoff_base_s <= self.backoff_max_s, "retry.backoff_base_s", "must be >= 0 and <= backoff_max_s")


@dataclasses.dataclass(frozen=True)
class BreakerConfig:
    """A backend that fails `failure_threshold` times in a row is skipped for `cooldown_s`."""

    failure_threshold: int = 3
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        _check(self.failure_threshold >= 1, "breaker.failure_threshold", "must be >= 1")
        _check(self.cooldown_s >= 0, "breaker.cooldown_s", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class PrefixRoutingConfig:
    """Prefix-aware routing hashes the first `num_blocks` blocks of `block_chars` prompt characters;
    a replica takes a request only while its load is under `load_factor` x the mean (bounded loads)."""

    block_chars: int = 128
    num_blocks: int = 4
    load_factor: float = 1.25
    virtual_nodes: int = 64

    def __post_init__(self) -> None:
        _check(self.block_chars >= 1 and self.num_blocks >= 1, "prefix_routing", "block_chars and num_blocks must be >= 1")
        _check(self.load_factor >= 1.0, "prefix_routing.load_factor", "must be >= 1.0")
        _check(self.virtual_nodes >= 1, "prefix_routing.virtual_nodes", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Semantic cache: exact prompt match, then canonical-form match (`ember/gateway/canonical.py`)."""

    enabled: bool = False
    ttl_s: float = 300.0
    max_entries_per_scope: int = 1024
    cache_sampled: bool = False

    def __post_init__(self) -> None:
        _check(self.ttl_s > 0, "cache.ttl_s", "must be > 0")
        _check(self.max_entries_per_scope >= 1, "cache.max_entries_per_scope", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """Where keys' spend, limits and the ledger live: SQLite (one gateway) or Redis (replicas)."""

    kind: str = "sqlite"
    path: str = "ember-gateway.sqlite3"
    url: str = "redis://127.0.0.1:6379/0"
    namespace: str = "ember-gateway"

    def __post_init__(self) -> None:
        _check(self.kind in STORE_KINDS, "store.kind", f"must be one of {STORE_KINDS}")


@dataclasses.dataclass(frozen=True)
class AccountingConfig:
    """How the gateway bounds a request's tokens before it knows them.

    The prompt bound is the prompt's UTF-8 byte count plus `template_tokens_per_message` per
    message (a byte-level tokenizer never makes more tokens than bytes; the chat template adds
    a few special tokens). `default_max_tokens` caps requests that name no max_tokens.
    """

    template_tokens_per_message: int = 16
    default_max_tokens: int = 1024

    def __post_init__(self) -> None:
        _check(self.template_tokens_per_message >= 0, "accounting.template_tokens_per_message", "must be >= 0")
        _check(self.default_max_tokens >= 1, "accounting.default_max_tokens", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class LimitsConfig:
    """What the gateway reads of a request body at most: `max_body_bytes` (larger bodies get 413
    before they are read whole) and `max_json_depth` nested arrays and objects (deeper get 400)."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        _check(self.max_body_bytes >= 1024, "limits.max_body_bytes", "must be >= 1024")
        _check(4 <= self.max_json_depth <= 500, "limits.max_json_depth", "must be in [4, 500] (JSON parsers recurse per level)")


@dataclasses.dataclass(frozen=True)
class ObservabilityConfig:
    """JSON request logs (prompts only when `log_prompts`) and the trace exporter."""

    log_prompts: bool = False
    trace_exporter: str = "none"

    def __post_init__(self) -> None:
        _check(self.trace_exporter in TRACE_EXPORTERS, "observability.trace_exporter", f"must be one of {TRACE_EXPORTERS}")


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """Everything one gateway process needs; several replicas share one file and one store."""

    backends: tuple[BackendConfig, ...]
    models: tuple[ModelConfig, ...]
    keys: tuple[KeyConfig, ...] = ()
    admin_key_sha256: str | None = None
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    prefix_routing: PrefixRoutingConfig = PrefixRoutingConfig()
    cache: CacheConfig = CacheConfig()
    store: StoreConfig = StoreConfig()
    accounting: AccountingConfig = AccountingConfig()
    limits: LimitsConfig = LimitsConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    def __post_init__(self) -> None:
        backend_names = [backend.name for backend in self.backends]
        _check(len(set(backend_names)) == len(backend_names), "backends", "names must be unique")
        names = self.model_names()
        _check(len(set(names)) == len(names), "models", "names and aliases must be unique")
        for model in self.models:
            for deployment in model.deployments:
                _check(deployment.backend in backend_names, f"models.{model.name}.backends", f"unknown backend {deployment.backend!r}")
            for fallback in model.fallbacks:
                _check(fallback in names, f"models.{model.name}.fallbacks", f"unknown model {fallback!r}")

    def model_names(self) -> list[str]:
        """Every name a client may send: configured names and aliases."""
        return [name for model in self.models for name in (model.name, *model.aliases)]

    def backend(self, name: str) -> BackendConfig:
        """The backend called `name`."""
        return next(backend for backend in self.backends if backend.name == name)

    def resolve_model(self, name: str) -> ModelConfig | None:
        """The model a client name (or alias) refers to, or None."""
        return next((model for model in self.models if name == model.name or name in model.aliases), None)

    @property
    def requires_keys(self) -> bool:
        """Requests need a virtual key once any key is configured."""
        return bool(self.keys)


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"gateway config {path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"gateway config {path}: not valid YAML: {error}") from None
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any]) -> GatewayConfig:
    """A GatewayConfig from the parsed YAML mapping (also handy for tests building configs in code)."""
    _check(isinstance(raw, dict), "(top level)", "must be a mapping")
    _no_unknown(raw, "(top level)", {field.name for field in dataclasses.fields(GatewayConfig)})
    backends = tuple(_backend(item, index) for index, item in enumerate(_list(raw, "backends", required=True)))
    models = tuple(_model(item, index) for index, item in enumerate(_list(raw, "models", required=True)))
    keys = tuple(_key(item, index) for index, item in enumerate(_list(raw, "keys")))
    try:
        return GatewayConfig(
            backends=backends,
            models=models,
            keys=keys,
            admin_key_sha256=raw.get("admin_key_sha256"),
            retry=_section(raw, "retry", RetryConfig),
            breaker=_section(raw, "breaker", BreakerConfig),
            prefix_routing=_section(raw, "prefix_routing", PrefixRoutingConfig),
            cache=_section(raw, "cache", CacheConfig),
            store=_section(raw, "store", StoreConfig),
            accounting=_section(raw, "accounting", AccountingConfig),
            limits=_section(raw, "limits", LimitsConfig),
            observability=_section(raw, "observability", ObservabilityConfig),
        )
    except TypeError as error:
        raise ConfigError(f"gateway config: {error}") from None


def _backend(item: Any, index: int) -> BackendConfig:
    where = f"backends[{index}]"
    _check(isinstance(item, dict) and "name" in item and "url" in item, where, "needs `name` and `url`")
    _no_unknown(item, where, {field.name for field in dataclasses.fields(BackendConfig)})
    item = dict(item)
    api_key = item.get("api_key")
    if isinstance(api_key, str) and api_key.startswith("env:"):
        item["api_key"] = os.environ.get(api_key[4:])
    return BackendConfig(**item)


def _model(item: Any, index: int) -> ModelConfig:
    where = f"models[{index}]"
    _check(isinstance(item, dict) and "name" in item, where, "needs `name` and `backends`")
    _no_unknown(item, where, {"name", "backends", "aliases", "routing", "fallbacks", "price", "upstream_model"})
    upstream_default = item.get("upstream_model", item["name"])
    deployments = []
    for entry in _list(item, "backends", required=True, where=where):
        if isinstance(entry, str):
            deployments.append(Deployment(entry, upstream_default))
        else:
            _check(isinstance(entry, dict) and "backend" in entry, f"{where}.backends", "entries are names or {backend, model}")
            deployments.append(Deployment(entry["backend"], entry.get("model", upstream_default)))
    price = item.get("price") or {}
    _check(isinstance(price, dict), f"{where}.price", "must be {input_per_million, output_per_million} in USD")
    _no_unknown(price, f"{where}.price", {"input_per_million", "output_per_million"})
    return ModelConfig(
        name=item["name"],
        deployments=tuple(deployments),
        aliases=tuple(item.get("aliases") or ()),
        routing=item.get("routing", "round_robin"),
        fallbacks=tuple(item.get("fallbacks") or ()),
        price=Price.per_million(float(price.get("input_per_million", 0)), float(price.get("output_per_million", 0))),
    )


def _key(item: Any, index: int) -> KeyConfig:
    where = f"keys[{index}]"
    _check(isinstance(item, dict) and "name" in item and "key_sha256" in item, where, "needs `name` and `key_sha256`")
    _no_unknown(item, where, {"name", "key_sha256", "tenant", "models", "budget_usd", "rpm", "tpm"})
    budget = item.get("budget_usd")
    return KeyConfig(
        name=item["name"],
        key_sha256=str(item["key_sha256"]).lower(),
        tenant=item.get("tenant", item["name"]),
        models=tuple(item.get("models") or ()),
        budget_nano_usd=None if budget is None else round(float(budget) * NANO_USD_PER_USD),
        rpm=item.get("rpm"),
        tpm=item.get("tpm"),
    )


def _section(raw: dict, name: str, cls: type):
    values = raw.get(name) or {}
    _check(isinstance(values, dict), name, "must be a mapping")
    _no_unknown(values, name, {field.name for field in dataclasses.fields(cls)})
    return cls(**values)


def _list(raw: dict, name: str, required: bool = False, where: str = "") -> list:
    values = raw.get(name)
    path = f"{where}.{name}" if where else name
    if values is None:
        _check(not required, path, "is required")
        return []
    _check(isinstance(values, list), path, "must be a list")
    return values


def _no_unknown(values: dict, where: str, known: set[str]) -> None:
    unknown = sorted(set(values) - known)
    _check(not unknown, where, f"unknown field(s) {unknown}; known: {sorted(known)}")
