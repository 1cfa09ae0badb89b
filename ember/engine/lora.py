"""Multi-LoRA serving in the engine: a fixed pool of adapter slots over one model.

A request names its adapter with a `LoRARequest` (ember.engine.lora_request, vLLM's spelling). The pool reads an adapter when a request
first asks for it (a bad one is refused then, naming the problem), keeps up to `max_cpu_loras` read adapters in
memory, and before each step puts the step's adapters into its `max_loras` slots, evicting the least recently
used adapter no row of the step needs (the scheduler never plans more distinct adapters than slots).
"""

from __future__ import annotations

import collections
from pathlib import Path

import torch

from ember.engine.lora_request import LoRAConfig, LoRARequest
from ember.engine.rejection import RequestRejected
from ember.layers.cpu_decoder_layer import CompilableLayer
from ember.layers.linear import Linear
from ember.layers.lora import LoRALinear, LoRARows
from ember.models.causal_lm import CausalLM
from ember.models.lora_adapter import (
    LoRAAdapter,
    LoRAAdapterError,
    adaptable_modules,
    load_lora_adapter,
)


class AdapterPool:
    """The adapters of one model: read ones (LRU, `max_cpu_loras`) and `max_loras` slots in its adapted layers.

    Installing wraps every adaptable linear of the decoder layers in a `LoRALinear` (once, for this model object);
    the compiled CPU decoder layers fall back to their Python forward, which calls those wrappers.
    Invariant: `slot_ids[s]` is the id of the adapter whose products fill slot s of every layer, or None."""

    def __init__(self, model: CausalLM, config: LoRAConfig) -> None:
        self.model = model
        self.config = config
        self.rows = LoRARows()
        self.dtype = adapter_dtype(model, config.lora_dtype)
        self.layers = _install(model, self.rows, config.max_loras, self.dtype)
        self.slot_ids: list[int | None] = [None] * config.max_loras
        self._slot_order: collections.OrderedDict[int, int] = collections.OrderedDict()  # adapter id -> slot, LRU first
        self._read: collections.OrderedDict[int, LoRAAdapter] = collections.OrderedDict()  # adapter id -> adapter, LRU first
        self._paths: dict[int, str] = {}

    def add(self, request: LoRARequest) -> LoRAAdapter:
        """Read (or find) the adapter `request` names; RequestRejected naming "lora_request" when it cannot be served."""
        known_path = self._paths.get(request.lora_int_id)
        if known_path is not None and known_path != request.lora_path:
            raise RequestRejected(f"lora_int_id {request.lora_int_id} already names the adapter at {known_path}, not "
                                  f"{request.lora_path}: give each adapter its own id", "lora_request")
        adapter = self._read.get(request.lora_int_id)
        if adapter is None:
            try:
                adapter = load_lora_adapter(Path(request.lora_path), self.model, self.config.max_lora_rank, self.dtype)
            except LoRAAdapterError as error:
                raise RequestRejected(str(error), "lora_request") from error
            self._read[request.lora_int_id] = adapter
            self._paths[request.lora_int_id] = request.lora_path
            while len(self._read) > self.config.num_cpu_adapters:
                self._read.popitem(last=False)
        self._read.move_to_end(request.lora_int_id)
        return adapter

    def prepare_step(self, row_requests: list[LoRARequest | None]) -> None:
        """Put the adapters of this step's rows (one entry per row; None: the base model) into slots, then group rows."""
        wanted = list(dict.fromkeys(request for request in row_requests if request is not None))
        if len({request.lora_int_id for request in wanted}) > self.config.max_loras:
            raise RuntimeError(f"a step asks for {len(wanted)} adapters, above max_loras {self.config.max_loras}")
        slots = {request.lora_int_id: self._slot_for(request, {r.lora_int_id for r in wanted}) for request in wanted}
        self.rows.set_rows([-1 if request is None else slots[request.lora_int_id] for request in row_requests])

    def _slot_for(self, request: LoRARequest, in_step: set[int]) -> int:
        """The slot holding `request`'s adapter, loading it into a free or least recently used slot not in this step."""
        slot = self._slot_order.get(request.lora_int_id)
        if slot is None:
            free = [s for s, held in enumerate(self.slot_ids) if held is None]
            if free:
                slot = free[0]
            else:
                evicted = next(held for held in self._slot_order if held not in in_step)
                slot = self._slot_order.pop(evicted)
            self._fill(slot, request)
            self._slot_order[request.lora_int_id] = slot
        self._slot_order.move_to_end(request.lora_int_id)
        return slot

    def _fill(self, slot: int, request: LoRARequest) -> None:
        adapter = self.add(request)  # read again if it left the in-memory adapters
        for name, layer in self.layers.items():
            layer.set_slot(slot, adapter.products.get(name))
        self.slot_ids[slot] = request.lora_int_id


def adapter_dtype(model: CausalLM, lora_dtype: str) -> torch.dtype:
    """The dtype adapters are held in beside `model`'s linears (LoRAConfig.lora_dtype): "auto" is the float linears'
    own dtype, bfloat16 beside quantized ones (or float ones of mixed dtypes)."""
    if lora_dtype != "auto":
        return getattr(torch, lora_dtype)
    modules = dict(model.named_modules())
    bases = [modules[target.module_name] for target in adaptable_modules(model).values()]
    float_dtypes = {_weight_dtype(base.base if isinstance(base, LoRALinear) else base) for base in bases}
    return float_dtypes.pop() if len(float_dtypes) == 1 and None not in float_dtypes else torch.bfloat16


def _weight_dtype(layer: torch.nn.Module) -> torch.dtype | None:
    """A float linear's weight dtype (its packed panels' when packed); None for a quantized layer."""
    if isinstance(layer, Linear) and layer.packed is not None:
        return layer.packed.dtype
    return layer.weight.dtype if isinstance(layer, torch.nn.Linear) else None


def _install(model: CausalLM, rows: LoRARows, num_slots: int, dtype: torch.dtype) -> dict[str, LoRALinear]:
    """Wrap each adaptable linear of `model` in a LoRALinear reading `rows`, with `num_slots` empty slots for
    adapters in `dtype`.

    Weights reused by a later engine (`LLMEngine(loaded=...)`, one engine after another as benchmarks build them)
    already hold wrappers: the new pool takes them over, empty, and the earlier engine must not step again."""
    modules = dict(model.named_modules())
    layers = {}
    for name in sorted({target.module_name for target in adaptable_modules(model).values()}):
        layer = modules[name]
        if isinstance(layer, LoRALinear):
            layer.reset(rows, num_slots, dtype)
        else:
            parent_name, _, child = name.rpartition(".")
            layer = LoRALinear(layer, rows, num_slots, dtype)
            setattr(modules[parent_name], child, layer)
        layers[name] = layer
    for module in model.modules():  # compiled again, through the wrappers' products (or left to the Python forward)
        if isinstance(module, CompilableLayer) and module.drop_compiled():
            module.compile_for_cpu()
    return layers
