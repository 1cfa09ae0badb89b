"""Multi-LoRA serving, against the reference: transformers + peft on the same random adapters (fp32, 1e-4).

Given a tiny random model of a family and random PEFT adapters saved by peft itself, ember's logits with an
adapter equal peft's, rows without one equal the base model's in the same batch, a batch mixing adapters gives
each request the tokens it gets alone, more adapters than slots are each served with their own, and adapters
ember cannot serve are refused at load, by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.lora_request import LoRAConfig, LoRARequest
from ember.engine.rejection import RequestRejected
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.model_factory import load_reference, save_random_adapter, save_tiny_model

LOGIT_TOLERANCE = 1e-4  # fp32, peft's reference
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ATTENTION_AND_MLP = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
PROMPTS = ([1, 5, 9, 33, 2, 7, 100, 3, 54, 8, 19], [4, 61, 7, 7, 200, 13])
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def peft_logits(base: Path, adapter: Path | None, prompt: list[int]) -> torch.Tensor:
    """transformers' logits of `prompt` with the adapter applied by peft (the base model's with none)."""
    from peft import PeftModel

    model = load_reference(base)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0]


def adapted_engine(base: Path, max_loras: int = 4, max_lora_rank: int = 64, **lora) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(base), cache=CacheConfig(block_size=4, num_kv_blocks=128),
                                  lora=LoRAConfig(max_loras=max_loras, max_lora_rank=max_lora_rank, **lora)))


def batch_logits(engine: LLMEngine, prompts: tuple[list[int], ...], adapters: list[LoRARequest | None]) -> list[torch.Tensor]:
    """Every prompt position's logits, all prompts in one step (one forward pass through the adapter pool)."""
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters, strict=True)):
        engine.add_request(EngineRequest(f"r{i}", prompt, SamplingParams(max_tokens=1), lora_request=adapter))
    plan = engine.scheduler.schedule()
    assert len(plan.scheduled) == len(prompts)
    return list(engine.runner.all_logits(plan).split([len(p) for p in prompts]))


FAMILIES = {  # family -> (what its adapters target, model overrides)
    "llama": (ATTENTION_AND_MLP, {}),
    "qwen2": (ATTENTION_AND_MLP, {}),  # q/k/v biases: the adapter adds to the biased fused product
    "mixtral": (ATTENTION, {}),  # a MoE: the attention carries the adapter, the experts run as they are
    "gemma2": (ATTENTION_AND_MLP, {}),  # soft-capping, sliding-window layers: two KV layer groups
}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_with_an_adapter_equal_peft_and_base_rows_stay_the_base_models(family: str, tmp_path: Path) -> None:
    targets, overrides = FAMILIES[family]
    base = save_tiny_model(family, tmp_path / "base", **overrides)
    adapter = save_random_adapter(base, tmp_path / "adapter", targets)
    engine = adapted_engine(base)
    ours = batch_logits(engine, PROMPTS, [LoRARequest("a", 1, str(adapter)), None])
    with_adapter, without = peft_logits(base, adapter, PROMPTS[0]), peft_logits(base, None, PROMPTS[1])
    assert (ours[0] - with_adapter).abs().max().item() <= LOGIT_TOLERANCE
    assert (ours[1] - without).abs().max().item() <= LOGIT_TOLERANCE
    assert (with_adapter - peft_logits(base, None, PROMPTS[0])).abs().max().item() > 1e-2  # the adapter does change them


@pytest.fixture(scope="module")
def llama_with_adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[LoRARequest]]:
    """A tiny Llama and four adapters of it: ranks 8, 16, 4 (rsLoRA, saved as a tensors-only .bin) and 8."""
    root = tmp_path_factory.mktemp("lora-llama")
    base = save_tiny_model("llama", root / "base")
    adapters = [
        save_random_adapter(base, root / "a1", ATTENTION_AND_MLP, rank=8, seed=1),
        save_random_adapter(base, root / "a2", ["q_proj", "v_proj", "down_proj"], rank=16, seed=2),
        save_random_adapter(base, root / "a3", ["gate_proj", "up_proj"], rank=4, seed=3, use_rslora=True,
                            safe_serialization=False),
        save_random_adapter(base, root / "a4", ATTENTION, rank=8, seed=4),
    ]
    return base, [LoRARequest(f"adapter{i + 1}", i + 1, str(path)) for i, path in enumerate(adapters)]


def test_partial_targets_rslora_and_bin_adapters_equal_peft(llama_with_adapters) -> None:
    base, requests = llama_with_adapters
    engine = adapted_engine(base)
    prompt = PROMPTS[0]
    ours = batch_logits(engine, (prompt, prompt, prompt), requests[1:])
    for logits, request in zip(ours, requests[1:], strict=True):
        assert (logits - peft_logits(base, Path(request.lora_path), prompt)).abs().max().item() <= LOGIT_TOLERANCE


def test_a_batch_mixing_three_adapters_and_the_base_gives_each_request_its_tokens_alone(llama_with_adapters) -> None:
    base, requests = llama_with_adapters
    llm = LLM(str(base), enable_lora=True, max_loras=4, max_lora_rank=64, block_size=4, num_kv_blocks=128,
              max_num_batched_tokens=7)  # chunked prefill: adapters' rows split across steps too
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[1]]
    adapters = [requests[0], requests[1], None, requests[2]]
    alone = [llm.generate([prompt], GREEDY, lora_request=adapter)[0].outputs[0].token_ids
             for prompt, adapter in zip(prompts, adapters, strict=True)]
    mixed = [output.outputs[0].token_ids for output in llm.generate(prompts, GREEDY, lora_request=adapters)]
    assert mixed == alone
    assert len({tuple(tokens) for tokens in alone}) == 4  # every adapter (and the base) answers differently


def test_more_adapters_than_slots_each_request_answered_with_its_own(llama_with_adapters) -> None:
    base, requests = llama_with_adapters
    roomy = LLM(str(base), enable_lora=True, max_loras=4, max_lora_rank=64, block_size=4, num_kv_blocks=128)
    expected = [output.outputs[0].token_ids for output in roomy.generate([PROMPTS[0]] * 4, GREEDY, lora_request=requests)]
    tight = LLM(str(base), enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=64, block_size=4, num_kv_blocks=128)
    prompts, adapters = [PROMPTS[0]] * 8, requests + requests  # each adapter twice, four adapters in two slots
    answered = [output.outputs[0].token_ids for output in tight.generate(prompts, GREEDY, lora_request=adapters)]
    assert answered == expected + expected
    assert tight.engine.kv.num_free_blocks == 128


def test_two_adapters_never_share_kv_blocks(llama_with_adapters) -> None:
    base, requests = llama_with_adapters
    llm = LLM(str(base), enable_lora=True, max_loras=2, block_size=4, num_kv_blocks=128)
    params = SamplingParams(temperature=0, max_tokens=1)
    first = llm.generate([PROMPTS[0]], params, lora_request=requests[0])[0]
    again = llm.generate([PROMPTS[0]], params, lora_request=requests[0])[0]
    other = llm.generate([PROMPTS[0]], params, lora_request=requests[3])[0]
    base_model = llm.generate([PROMPTS[0]], params)[0]
    assert (first.num_cached_tokens, again.num_cached_tokens, other.num_cached_tokens, base_model.num_cached_tokens) == (0, 8, 0, 0)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_with_an_adapter_and_speculation_equals_greedy_with_the_adapter_alone(llama_with_adapters, method: str) -> None:
    """The target's adapter applies to verification; the n-gram proposer needs none, the draft model (here the base
    model itself) drafts without it: some drafts are rejected, the tokens are the adapter's."""
    base, requests = llama_with_adapters
    prompts = [[9, 10, 11, 12] * 5, PROMPTS[0], PROMPTS[1]]
    adapters = [requests[0], requests[1], None]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(base), enable_lora=True, max_loras=2, block_size=4, num_kv_blocks=128)
    expected = [output.outputs[0].token_ids for output in plain.generate(prompts, params, lora_request=adapters)]
    spec = LLM(str(base), enable_lora=True, max_loras=2, block_size=4, num_kv_blocks=128, speculative_method=method,
               draft_model=str(base) if method == "draft" else None, num_speculative_tokens=3, adaptive=False)
    assert [output.outputs[0].token_ids for output in spec.generate(prompts, params, lora_request=adapters)] == expected
    stats = spec.engine.speculator.stats
    assert stats.draft_tokens > 0
    if method == "draft":
        assert 0 < stats.accepted_tokens < stats.draft_tokens  # the base model drafts, the adapters' tokens differ
    assert spec.engine.kv.num_free_blocks == 128


def _edited_adapter(source: Path, folder: Path, **config) -> Path:
    """A copy of the adapter in `source` with adapter_config.json fields replaced."""
    folder.mkdir()
    for path in source.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    settings = json.loads((source / "adapter_config.json").read_text()) | config
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    return folder


def test_adapters_ember_cannot_serve_are_refused_by_name_with_the_fix(llama_with_adapters, tmp_path: Path) -> None:
    base, requests = llama_with_adapters
    llm = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=8, block_size=4, num_kv_blocks=64)
    source = Path(requests[0].lora_path)
    cases = {
        "uses DoRA": _edited_adapter(source, tmp_path / "dora", use_dora=True),
        "rank 16, above max_lora_rank 8: start the engine with max_lora_rank=16": Path(requests[1].lora_path),
        "targets 'lm_head', which this model family has no adaptable linear": save_random_adapter(base, tmp_path / "head", ["lm_head"]),
        "has no adapter_config.json": tmp_path,
        "modules_to_save": _edited_adapter(source, tmp_path / "saved", modules_to_save=["lm_head"]),
    }
    for number, (message, path) in enumerate(cases.items(), start=10):
        with pytest.raises(RequestRejected, match=message) as refused:
            llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("bad", number, str(path)))
        assert refused.value.param == "lora_request"
    assert llm.engine.scheduler.has_work is False  # nothing was queued by a refused batch


def test_an_engine_without_enable_lora_refuses_an_adapter_and_heads_or_parallel_ranks_with_adapters_are_refused(llama_with_adapters, tmp_path: Path) -> None:
    base, requests = llama_with_adapters
    llm = LLM(str(base), block_size=4, num_kv_blocks=64)
    with pytest.raises(RequestRejected, match="enable_lora=True"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=requests[0])
    with pytest.raises(ValueError, match="speculative method 'medusa'.*trained on the base model's hidden states"):
        LLM(str(base), enable_lora=True, speculative_method="medusa", medusa_heads=str(tmp_path))
    with pytest.raises(ValueError, match="speculative method 'eagle'.*trained on the base model's hidden states"):
        LLM(str(base), enable_lora=True, speculative_method="eagle", eagle_head=str(tmp_path))
    with pytest.raises(ValueError, match="tensor / pipeline parallel"):
        LLM(str(base), enable_lora=True, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor / pipeline parallel"):
        LLM(str(base), enable_lora=True, pipeline_parallel_size=2)
    with pytest.raises(TypeError, match="need enable_lora=True"):
        LLM(str(base), max_loras=2)


def test_an_adapter_on_the_quantized_smollm2_gguf_changes_it_as_on_the_dequantized_weights(smollm2_gguf: Path, tmp_path: Path) -> None:
    """QLoRA serving: the adapter stays float beside the GGML blocks (bfloat16 by default there). With float32
    activations a float32 adapter's effect on the quantized model equals its effect on the dequantized float32 weights
    (1e-3), a bfloat16 one's within bfloat16's rounding of it (1% of the largest change); with int8 activations
    (`--dtype auto`'s default) within the error the int8 rounding already makes without it."""
    from ember.bench.lora import save_random_adapter
    from ember.models.loader import load_model

    quantized, dequantized = load_model(smollm2_gguf, "auto"), load_model(smollm2_gguf, "float32")
    adapter = LoRARequest("qlora", 1, str(save_random_adapter(quantized.model, tmp_path / "adapter", rank=8, seed=0)))
    prompt = [1, 504, 3458, 282, 4529, 314, 253, 1345, 30, 378, 6330, 314]
    changes, bases, held_in = {}, {}, {}
    for name, dtype, activations, lora_dtype, loaded in (("float32", "float32", "int8", "auto", dequantized),
                                                         ("exact", "auto", "float32", "float32", quantized),
                                                         ("bfloat16", "auto", "float32", "auto", quantized),
                                                         ("int8", "auto", "int8", "auto", quantized)):
        config = EngineConfig(model=str(smollm2_gguf), dtype=dtype, quant_activations=activations,
                              cache=CacheConfig(block_size=4, num_kv_blocks=32),
                              lora=LoRAConfig(max_loras=1, max_lora_rank=8, lora_dtype=lora_dtype))
        engine = LLMEngine(config, loaded=loaded)
        held_in[name] = engine.adapters.dtype
        adapted, plain = batch_logits(engine, (prompt, prompt), [adapter, None])
        changes[name], bases[name] = adapted - plain, plain
    assert held_in == {"float32": torch.float32, "exact": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16}
    largest = changes["float32"].abs().max().item()
    assert largest > 1.0  # the adapter changes the model
    assert (changes["exact"] - changes["float32"]).abs().max().item() <= 1e-3
    assert 1e-3 < (changes["bfloat16"] - changes["float32"]).abs().max().item() <= 0.01 * largest
    int8_error = (bases["int8"] - bases["float32"]).abs().max().item()  # the int8 activations' error without adapter
    assert changes["int8"].abs().max().item() > 1.0
    assert (changes["int8"] - changes["float32"]).abs().max().item() <= 2 * int8_error
