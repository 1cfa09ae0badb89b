"""LLM: the offline Python entry point, `LLM(model).generate(prompts, params)`."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

from rich.progress import Progress

from ember.engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from ember.engine.device import DeviceConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.lora_request import LoRAConfig, LoRARequest
from ember.engine.outputs import OutputAccumulator, RequestOutput
from ember.engine.sampling_defaults import AUTO, sampling_defaults
from ember.engine.sampling_params import SamplingParams, embedding_params
from ember.models.loader import LoadedModel
from ember.parallel.config import ParallelConfig

# text, token ids, or as vLLM's TextPrompt / TokensPrompt: {"prompt": text} or {"prompt_token_ids": ids}
PromptInput = str | Sequence[int] | Mapping[str, object]


class LLM:
    """Runs a batch of prompts to completion with continuous batching, returning full outputs in order.

    `model` is a registered name, a GGUF file, an HF safetensors folder or a llama2.c .bin.
    Extra keyword arguments set `CacheConfig` / `SchedulerConfig` / `SpeculativeConfig` fields by
    name (e.g. `block_size=16, max_num_batched_tokens=512, enable_prefix_caching=False`,
    `kv_cache_dtype="fp8"`);
    speculation: `speculative_method="ngram"|"draft"|"medusa"|"eagle", num_speculative_tokens=K, draft_model=PATH`
    (draft), `medusa_heads=DIR` (medusa, from `ember medusa train`; `medusa_tree_nodes=N` sizes its greedy trees),
    `eagle_head=DIR` (eagle, from `ember eagle train`);
    tensor parallelism: `tensor_parallel_size=T` (T - 1 worker processes; `shutdown()` stops them);
    `quantization="int8"|"int4"|"fp8"|"nf4"` rounds a float checkpoint's decoder linears as it loads (vLLM's in-flight
    quantization; "bitsandbytes" is nf4); `generation_config="auto"|"vllm"|DIR`: where `generate` and `chat` without
    sampling params take theirs from (auto: the model folder's generation_config.json, as vLLM's LLM does);
    LoRA: `enable_lora=True, max_loras=N, max_lora_rank=R, max_cpu_loras=M` (vLLM's names), then
    `generate(..., lora_request=LoRARequest(name, int_id, path))` per call or per prompt;
    device: `device="cpu"|"cuda"|"auto"` (auto: cuda where torch sees one), `gpu_memory_utilization=F`,
    `enforce_eager=True` (`DeviceConfig`).
    structured outputs: `structured_outputs_backend="auto"|"ember"|"xgrammar"|"llguidance"`, `jump_forward=False` to
    sample every token a constraint forces.
    """

    def __init__(self, model: str, tokenizer: str | None = None, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
                 loaded: LoadedModel | None = None, **options) -> None:
        """`loaded`: `model`'s weights already in memory (as `load_model` gave them for `dtype`), used instead of loading
        them again."""
        cache_fields = {k: options.pop(k) for k in list(options) if k in CacheConfig.__dataclass_fields__}
        scheduler_fields = {k: options.pop(k) for k in list(options) if k in SchedulerConfig.__dataclass_fields__}
        speculative_fields = {
            k: options.pop(k) for k in list(options) if k in SpeculativeConfig.__dataclass_fields__ and k != "method"
        }
        parallel_fields = {k: options.pop(k) for k in list(options) if k in ParallelConfig.__dataclass_fields__}
        if "speculative_method" in options:
            speculative_fields["method"] = options.pop("speculative_method")
        quant_activations = options.pop("quant_activations", "int8")
        quantization = options.pop("quantization", None)
        generation_config = options.pop("generation_config", AUTO)
        lora = _lora_config(options)
        num_threads = options.pop("num_threads", None)
        device = DeviceConfig(**{k: options.pop(k) for k in list(options) if k in DeviceConfig.__dataclass_fields__})
        structured_outputs_backend = options.pop("structured_outputs_backend", "auto")
        jump_forward = options.pop("jump_forward", True)
        if options:
            raise TypeError(f"unknown LLM options: {', '.join(sorted(options))}")
        config = EngineConfig(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            quant_activations=quant_activations,
            quantization=quantization,
            seed=seed,
            max_model_len=max_model_len,
            cache=CacheConfig(**cache_fields),
            scheduler=SchedulerConfig(**scheduler_fields),
            speculative=SpeculativeConfig(**speculative_fields),
            parallel=ParallelConfig(**parallel_fields),
            lora=lora,
            num_threads=num_threads,
            device=device,
            structured_outputs_backend=structured_outputs_backend,
            jump_forward=jump_forward,
        )
        self.engine = LLMEngine(config, loaded=loaded)
        self.tokenizer = self.engine.tokenizer
        self._defaults = sampling_defaults(generation_config, model)
        self._next_id = 0

    def get_default_sampling_params(self) -> SamplingParams:
        """The params `generate` and `chat` use when given none: the model's generation config's, else SamplingParams()."""
        return self._defaults.sampling_params()

    def shutdown(self) -> None:
        """Stop the engine's worker processes (tensor parallel); a no-op for a single-process engine."""
        self.engine.shutdown()

    def encode(self, prompt: PromptInput) -> list[int]:
        """Token ids of a prompt: text goes through the model's tokenizer (BOS added if it wants one)."""
        if isinstance(prompt, Mapping):
            return self.encode(_prompt_field(prompt))
        if not isinstance(prompt, str):  # token ids (numpy's too): EngineRequest checks them
            return prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        if self.tokenizer is None:
            raise ValueError("this model carries no tokenizer; pass tokenizer=PATH or give token ids")
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        show_progress: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (one params for all, or one per prompt; one adapter for all, or one per prompt,
        None the base model); outputs in prompt order."""
        batch = _as_batch(prompts)
        params = sampling_params or self.get_default_sampling_params()
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(batch)
        if len(params_list) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(params_list)} sampling params")
        adapters = list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(batch)
        if len(adapters) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(adapters)} LoRA requests")
        requests = [EngineRequest(str(self._next_id + index), self.encode(prompt), request_params, prompt=_prompt_text(prompt),
                                  lora_request=adapter)
                    for index, (prompt, request_params, adapter) in enumerate(zip(batch, params_list, adapters, strict=True))]
        for request in requests:
            self.engine.limits.check(request)  # all of them before any runs: none left behind
            if request.lora_request is not None:
                self.engine.check_adapter(request.lora_request)
        self._next_id += len(requests)
        accumulators: dict[str, OutputAccumulator] = {}
        for request in requests:
            self.engine.add_checked_request(request)
            accumulators[request.request_id] = OutputAccumulator(request.request_id, request.params.n)
        self._run(accumulators, show_progress)
        return [accumulator.result() for accumulator in accumulators.values()]

    def embed(self, prompts: PromptInput | Sequence[PromptInput], show_progress: bool = False) -> list[list[float]]:
        """Each prompt's embedding, in prompt order: the final hidden state at its last token, L2-normalised (vLLM's
        `LLM.embed` on a decoder model: last-token pooling, as embedding models such as Qwen3-Embedding are read)."""
        outputs = self.generate(prompts, embedding_params(), show_progress)
        return [output.embedding for output in outputs]

    def chat(
        self,
        messages: Sequence[Mapping[str, str]] | Sequence[Sequence[Mapping[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        show_progress: bool = False,
        *,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: Mapping[str, object] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a batch of them, rendered with the model's chat template.

        A conversation is a list of `{"role": ..., "content": ...}`; `chat_template` (template
        text) overrides the model's own. As vLLM's `LLM.chat`: `continue_final_message` goes on
        writing a last assistant turn (with `add_generation_prompt=False`), `tools` are function
        definitions the template renders, `chat_template_kwargs` more template variables; `lora_request` as `generate`.
        """
        from ember.tokenizers.chat_template import load_chat_template

        if self.tokenizer is None:
            raise ValueError("this model carries no tokenizer; pass tokenizer=PATH to chat with it")
        template = load_chat_template(self.tokenizer, chat_template)
        if template is None:
            raise ValueError("this model has no chat template; pass chat_template=TEXT or use generate()")
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = [
            self.tokenizer.encode(template.render(conversation, add_generation_prompt, tools, variables=chat_template_kwargs,
                                                  continue_final_message=continue_final_message), add_special_tokens=False)
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, show_progress, lora_request)

    def _run(self, accumulators: dict[str, OutputAccumulator], show_progress: bool) -> None:
        remaining = set(accumulators)
        with Progress(disable=not show_progress, transient=True) as progress:
            task = progress.add_task("generating", total=len(remaining))
            while remaining:
                for output in self.engine.step():
                    if output.request_id in accumulators:
                        accumulators[output.request_id].add(output)
                    if output.finished and output.request_id in remaining:
                        remaining.discard(output.request_id)
                        progress.advance(task)


def _lora_config(options: dict[str, object]) -> LoRAConfig | None:
    """vLLM's LoRA options taken out of `options`: a LoRAConfig with enable_lora=True, None without (refusing the
    others then, as they would do nothing)."""
    fields = {k: options.pop(k) for k in list(options) if k in LoRAConfig.__dataclass_fields__}
    if not options.pop("enable_lora", False):
        if fields:
            raise TypeError(f"{', '.join(sorted(fields))} need enable_lora=True")
        return None
    return LoRAConfig(**fields)


def _as_batch(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    if isinstance(prompts, str | Mapping):
        return [prompts]
    if len(prompts) and all(isinstance(t, numbers.Integral) for t in prompts):
        return [prompts]  # one prompt of token ids
    return list(prompts)


def _prompt_field(prompt: Mapping[str, object]) -> str | Sequence[int]:
    """What a prompt dict holds: its token ids where it gives them (as vLLM), else its text."""
    if prompt.get("multi_modal_data"):
        raise ValueError("ember runs text models: a prompt's multi_modal_data (images, audio) cannot be given to them")
    if "prompt_token_ids" in prompt:
        return prompt["prompt_token_ids"]
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError(f"a prompt dict holds 'prompt' (text) or 'prompt_token_ids', not {sorted(prompt)}")


def _prompt_text(prompt: PromptInput) -> str | None:
    if isinstance(prompt, Mapping):
        text = prompt.get("prompt")
        return text if isinstance(text, str) else None
    return prompt if isinstance(prompt, str) else None
