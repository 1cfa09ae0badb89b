"""`ember quantize` end to end on tiny random models: written atomically, loaded back in blocks, bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader

from ember.cli.main import main
from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.models.loader import load_model
from ember.quant.at_load import decoder_linears
from ember.quant.checkpoint import QUANTIZATION_FILE
from ember.quant.config import QuantizeConfig
from ember.quant.ggml.layers import GGMLLinear
from ember.quant.int8.w8a8_layers import W8A8Linear
from ember.quantize import EngineCalibration, quantize_checkpoint
from tests.model_factory import save_tiny_model

VOCAB = 512  # the stories260K tokenizer's size, so calibration text tokenizes inside the vocabulary
W8A8_LOGPROB_BOUND = 0.05  # nats: a W8A8 model against its dequantized float copy on the tiny random model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("quant-src"), vocab_size=VOCAB)


@pytest.fixture(scope="module")
def tokenizer(stories_dir) -> str:
    return str(stories_dir / "tok512.bin")


@pytest.fixture(scope="module")
def calib(shared_dir) -> Path:
    return shared_dir / "corpus" / "tinyshakespeare.txt"


def _greedy(model: str, dtype: str, activations: str = "int8") -> list[int]:
    engine = LLMEngine(EngineConfig(model=model, dtype=dtype, quant_activations=activations, cache=CacheConfig(num_kv_blocks=16)))
    engine.add_request(EngineRequest("r", list(range(5, 40)), SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():  # step deltas: each holds the tokens new since the last
            tokens.extend(output.outputs[0].token_ids)
    assert len(tokens) == 12
    return tokens


def test_gptq_checkpoint_loads_in_blocks_and_runs_like_its_float_copy(tiny_folder, tokenizer, calib, tmp_path):
    out = tmp_path / "gptq"
    config = QuantizeConfig(model=str(tiny_folder), method="gptq", out=out, bits=4, group_size=64, calib=calib,
                            tokenizer=tokenizer, calib_tokens=512, seq_len=128, act_order=True)
    result = quantize_checkpoint(config, show_progress=False)
    description = json.loads((out / QUANTIZATION_FILE).read_text())
    assert description["method"] == "gptq" and description["calibration"]["tokens"] == result.calib_tokens >= 256
    assert {t["format"] for t in description["tensors"].values()} == {"Q4_1", "Q8_0"}
    assert 0.5 < result.bytes_per_parameter < 1.0
    layers = [m for m in load_model(out).model.modules() if isinstance(m, GGMLLinear)]
    assert len(layers) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the untied LM head
    # exact activations: the random tiny model's near-tied logits can flip under int8 activation rounding
    assert _greedy(str(out), "auto", activations="float32") == _greedy(str(out), "float32")


def test_gptq_builds_each_hessian_from_the_already_quantized_layers_before_it(tiny_folder, tokenizer, calib, tmp_path):
    from rich.progress import Progress

    from ember.layers.cpu_prepare import restore_dense_weights
    from ember.quant.methods.gptq import GPTQSettings, gptq_quantize
    from ember.quant.pipeline import calibrate, calibration_chunks

    out, target = tmp_path / "gptq", "model.layers.1.mlp.down_proj"
    config = QuantizeConfig(model=str(tiny_folder), method="gptq", out=out, bits=4, group_size=32, calib=calib,
                            tokenizer=tokenizer, calib_tokens=512, seq_len=128)
    quantize_checkpoint(config, show_progress=False)
    written = load_model(out).model.get_submodule(target).weight_blocks.dequantize()
    float_model = load_model(tiny_folder, dtype="float32").model
    restore_dense_weights(float_model)
    weight = float_model.get_submodule(target).weight.detach()

    def gptq_under_inputs_of(model: str) -> torch.Tensor:
        engine = LLMEngine(EngineConfig(model=model, tokenizer=tokenizer, dtype="float32",
                                        cache=CacheConfig(num_kv_blocks=64, enable_prefix_caching=False)))
        with Progress(disable=True) as progress:
            chunks = calibration_chunks(engine.tokenizer, config)
            hessian = calibrate(EngineCalibration(engine), engine.runner.model, [target], chunks, progress)[target].mean_hessian
        codes, d, m = gptq_quantize(weight, hessian, config.grid, GPTQSettings())
        return config.grid.to_blocks(codes, d, m).dequantize()

    sequential = (gptq_under_inputs_of(str(out)) == written).float().mean()  # the quantized model, read as float
    from_float = (gptq_under_inputs_of(str(tiny_folder)) == written).float().mean()
    assert sequential > 0.99 and from_float < sequential - 0.01


def test_rtn_from_a_gguf_writes_a_gguf_the_gguf_package_reads(tiny_folder, tmp_path):
    from tests.models.test_gguf_loader import write_gguf

    source = tmp_path / "float.gguf"
    write_gguf(tiny_folder, source, GGMLQuantizationType.F32, np.random.default_rng(0))
    out = tmp_path / "rtn8"
    assert main(["quantize", "--model", str(source), "--method", "rtn", "--bits", "8", "--group-size", "32", "--out", str(out)]) == 0
    types = {t.name: t.tensor_type for t in GGUFReader(str(out / "model.gguf")).tensors}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    float_weights = load_model(source, dtype="float32").model.state_dict()
    ours = load_model(out / "model.gguf", dtype="float32").model.state_dict()
    for name in ("model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        step = float_weights[name].abs().amax() / 127  # q/k rows come back in place: errors stay under a step
        assert (ours[name] - float_weights[name]).abs().max() <= step


@pytest.mark.parametrize(("method", "source_kind"), [("nf4", "gguf"), ("fp8", "folder")])
def test_float_code_checkpoints_load_in_their_blocks_and_run_like_their_float_copy(tiny_folder, tmp_path, method, source_kind):
    from tests.models.test_gguf_loader import write_gguf

    source = tiny_folder
    if source_kind == "gguf":
        source = tmp_path / "float.gguf"
        write_gguf(tiny_folder, source, GGMLQuantizationType.F32, np.random.default_rng(0))
    out = tmp_path / method
    assert main(["quantize", "--model", str(source), "--method", method, "--out", str(out)]) == 0
    checkpoint = out  # the --out folder loads as it is (a GGUF inside it stands for the folder)
    if source_kind == "gguf":  # ember's formats travel as raw I8 rows of blocks, listed under ember.block_formats
        reader = GGUFReader(str(out / "model.gguf"))
        assert json.loads(reader.fields["ember.block_formats"].contents())["blk.0.attn_q.weight"] == "NF4"
    layers = [m for m in load_model(checkpoint).model.modules() if isinstance(m, GGMLLinear)]
    assert {m.weight_blocks.format.name for m in layers} == {method.upper(), "Q8_0"}  # the LM head is Q8_0 like the table
    float_weights = load_model(source, dtype="float32").model.state_dict()
    ours = load_model(checkpoint, dtype="float32").model.state_dict()
    name = "model.layers.0.self_attn.qkv_proj.weight"  # q/k rows come back in place: the error stays small
    assert (ours[name] - float_weights[name]).abs().max() <= 0.2 * float_weights[name].abs().max()
    assert _greedy(str(checkpoint), "auto") == _greedy(str(checkpoint), "float32")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--method", "zip"], "unknown --method 'zip'"),
        (["--method", "awq", "--bits", "3"], "cannot make 3-bit weights"),
        (["--method", "rtn", "--group-size", "48"], "multiple of 32"),
        (["--method", "gptq"], "needs --calib FILE"),
        (["--method", "smoothquant"], "needs --calib FILE"),
        (["--method", "smoothquant", "--bits", "4"], "SmoothQuant is W8A8: int8 weights and int8 activations"),
        (["--method", "smoothquant", "--alpha", "1.5"], "--alpha 1.5 must lie in [0, 1]"),
        (["--method", "smoothquant", "--alpha", "best"], "--alpha best must lie in [0, 1]"),
        (["--method", "smoothquant", "--group-size", "128"], "scales whole rows"),
        (["--method", "rtn", "--alpha", "0.5"], "--alpha is SmoothQuant's migration strength"),
        (["--method", "nf4", "--group-size", "128"], "scales blocks of 64 values"),
        (["--method", "fp8", "--bits", "4"], "cannot make 4-bit weights"),
    ],
)
def test_bad_flags_are_named_and_nothing_is_written(tiny_folder, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert main(["quantize", "--model", str(tiny_folder), "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_short_calibration_file_is_refused_and_leaves_no_folder(tiny_folder, tokenizer, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be.")
    config = QuantizeConfig(model=str(tiny_folder), method="awq", out=tmp_path / "out", calib=short, tokenizer=tokenizer, group_size=64)
    with pytest.raises(ValueError, match="needs at least 256"):
        quantize_checkpoint(config, show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.txt"]


def test_an_existing_out_folder_is_never_overwritten(tiny_folder, tmp_path):
    with pytest.raises(ValueError, match="already exists"):
        QuantizeConfig(model=str(tiny_folder), method="rtn", out=tmp_path)


def _prompt_logprobs(engine: LLMEngine, request_id: str, prompt: list[int]) -> torch.Tensor:
    engine.add_request(EngineRequest(request_id, prompt, SamplingParams(max_tokens=1, prompt_logprobs=0)))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    return torch.tensor([outputs[-1].prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])


def _folding_model(family: str, tiny_folder: Path, tmp_path: Path) -> Path:
    """The Llama fixture, or a Gemma 2 (its (1 + weight) norms, the MLP read through the pre-feed-forward norm)."""
    return tiny_folder if family == "llama" else save_tiny_model(family, tmp_path / family, vocab_size=VOCAB)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_awq_scaling_folds_into_the_model_without_changing_its_float_outputs(family, tiny_folder, tokenizer, calib, tmp_path):
    from rich.progress import Progress

    from ember.quant.at_load import decoder_linears
    from ember.quant.pipeline import apply_awq, calibrate, calibration_chunks

    folder = _folding_model(family, tiny_folder, tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), tokenizer=tokenizer, dtype="float32",
                                    cache=CacheConfig(num_kv_blocks=64, enable_prefix_caching=False)))
    model = engine.runner.model
    config = QuantizeConfig(model=str(folder), method="awq", out=tmp_path / "unused", calib=calib, group_size=64, calib_tokens=256, seq_len=128)
    prompt = list(range(3, 60))
    before = _prompt_logprobs(engine, "before", prompt)
    norms = [norm for layer in model.model.layers for norm in layer.input_norms()]
    before_norms = [norm.weight.detach().clone() for norm in norms]
    with Progress(disable=True) as progress:
        names = decoder_linears(model)
        stats = calibrate(EngineCalibration(engine), model, names, calibration_chunks(engine.tokenizer, config), progress)
        apply_awq(model, stats, config.grid, progress)
    assert any(not torch.equal(norm.weight, old) for norm, old in zip(norms, before_norms, strict=True))  # some s != 1 folded
    torch.testing.assert_close(_prompt_logprobs(engine, "after", prompt), before, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("source_kind", ["folder", "gguf"])
def test_smoothquant_checkpoint_loads_w8a8_layers_that_run_like_their_float_copy(tiny_folder, tokenizer, calib, tmp_path, source_kind):
    from tests.models.test_gguf_loader import write_gguf

    source = tiny_folder
    if source_kind == "gguf":
        source = tmp_path / "float.gguf"
        write_gguf(tiny_folder, source, GGMLQuantizationType.F32, np.random.default_rng(0))
    out = tmp_path / "sq"
    assert main(["quantize", "--model", str(source), "--method", "smoothquant", "--alpha", "0.6", "--calib", str(calib),
                 "--tokenizer", tokenizer, "--calib-tokens", "512", "--seq-len", "128", "--out", str(out)]) == 0
    description = json.loads((out / QUANTIZATION_FILE).read_text())
    assert (description["method"], description["bits"], description["alpha"]) == ("smoothquant", 8, 0.6)
    assert {t["format"] for t in description["tensors"].values()} == {"W8A8", "Q8_0"}  # the embedding is Q8_0 like the table
    checkpoint = out / "model.gguf" if source_kind == "gguf" else out
    if source_kind == "gguf":  # W8A8 rows travel as raw I8 rows listed under ember.block_formats
        reader = GGUFReader(str(checkpoint))
        assert json.loads(reader.fields["ember.block_formats"].contents())["blk.0.attn_q.weight"] == "W8A8"
    layers = [m for m in load_model(checkpoint).model.modules() if isinstance(m, W8A8Linear)]
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down per layer
    norm = "model.layers.0.input_layernorm.weight"  # the migration's 1/s lives in the norms
    assert not torch.equal(load_model(checkpoint, dtype="float32").model.state_dict()[norm], load_model(source).model.state_dict()[norm])
    prompt = list(range(3, 60))
    w8a8 = _prompt_logprobs(_engine(checkpoint, "auto"), "w8a8", prompt)
    dequantized = _prompt_logprobs(_engine(checkpoint, "float32"), "float", prompt)
    assert (w8a8 - dequantized).abs().max() < W8A8_LOGPROB_BOUND  # only the per-token activation rounding differs
    engine = _engine(checkpoint, "auto")
    engine.add_request(EngineRequest("generate", prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)))
    generated: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated.extend(output.outputs[0].token_ids)  # each step's new tokens
    assert len(generated) == 12 and all(0 <= t < VOCAB for t in generated)


def test_smoothquant_alpha_auto_scores_every_candidate_and_writes_the_best_ones_checkpoint(tiny_folder, tokenizer, calib, tmp_path):
    from ember.quant.methods.alpha_search import ALPHA_CANDIDATES

    settings = {"model": str(tiny_folder), "method": "smoothquant", "bits": 8, "calib": calib, "tokenizer": tokenizer,
                "calib_tokens": 256, "seq_len": 128}
    quantize_checkpoint(QuantizeConfig(out=tmp_path / "auto", alpha="auto", **settings), show_progress=False)
    description = json.loads((tmp_path / "auto" / QUANTIZATION_FILE).read_text())
    scores = {float(alpha): nll for alpha, nll in description["alpha_search"]["candidates_nll"].items()}
    assert set(scores) == set(ALPHA_CANDIDATES) and len(set(scores.values())) == len(scores)  # each alpha its own W8A8 model
    assert description["alpha"] == description["alpha_search"]["chosen"] == min(scores, key=scores.__getitem__)
    quantize_checkpoint(QuantizeConfig(out=tmp_path / "fixed", alpha=description["alpha"], **settings), show_progress=False)
    auto, fixed = (load_model(tmp_path / kind, dtype="float32").model.state_dict() for kind in ("auto", "fixed"))
    assert auto.keys() == fixed.keys() and all(torch.equal(auto[name], fixed[name]) for name in fixed)  # the search left no trace


def test_the_alpha_search_runs_a_linear_as_its_w8a8_layer_would():
    from ember.quant.int8.channel import quantize_weight
    from ember.quant.methods.alpha_search import _run_as_w8a8

    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    x = torch.randn(7, 96, generator=generator) * torch.linspace(0.1, 8.0, 96)  # loud channels: rounding shows
    w8a8 = W8A8Linear(quantize_weight(linear.weight), torch.nn.Parameter(linear.bias.detach().clone()))
    with torch.no_grad():
        exact = linear(x)
        handle = _run_as_w8a8(linear)
        hooked = linear(x)
        handle.remove()
        torch.testing.assert_close(hooked, w8a8(x), rtol=1e-5, atol=1e-5)
        assert (hooked - exact).abs().max() > 1e-4 and torch.equal(linear(x), exact)  # rounded while hooked, exact after


def _engine(model: Path, dtype: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), dtype=dtype, cache=CacheConfig(num_kv_blocks=64, enable_prefix_caching=False)))


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_smoothquant_migration_folds_into_the_model_without_changing_its_float_outputs(family, tiny_folder, tokenizer, calib, tmp_path):
    from rich.progress import Progress

    from ember.quant.at_load import decoder_linears
    from ember.quant.methods.smoothquant import apply_smoothing
    from ember.quant.pipeline import calibrate, calibration_chunks

    folder = _folding_model(family, tiny_folder, tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), tokenizer=tokenizer, dtype="float32",
                                    cache=CacheConfig(num_kv_blocks=64, enable_prefix_caching=False)))
    model = engine.runner.model
    config = QuantizeConfig(model=str(folder), method="smoothquant", bits=8, out=tmp_path / "unused", calib=calib,
                            calib_tokens=256, seq_len=128)
    prompt = list(range(3, 60))
    before = _prompt_logprobs(engine, "before", prompt)
    mlp_norm = model.model.layers[1].input_norms()[1]
    old = mlp_norm.weight.detach().clone()
    with Progress(disable=True) as progress:
        names = decoder_linears(model)
        stats = calibrate(EngineCalibration(engine), model, names, calibration_chunks(engine.tokenizer, config), progress, with_hessian=False)
        apply_smoothing(model, stats, config.alpha, progress)
    assert stats[names[0]].hessian is None and (stats[names[0]].abs_max > 0).all()
    assert not torch.equal(mlp_norm.weight, old)
    torch.testing.assert_close(_prompt_logprobs(engine, "after", prompt), before, rtol=1e-4, atol=1e-4)


def test_a_qwen3_checkpoint_keeps_its_head_norms_and_runs_like_its_float_copy(tmp_path):
    folder = save_tiny_model("qwen3", tmp_path / "qwen3", vocab_size=VOCAB, head_dim=32)
    out = tmp_path / "rtn"
    quantize_checkpoint(QuantizeConfig(model=str(folder), method="rtn", out=out, bits=4, group_size=64), show_progress=False)
    model = load_model(out).model
    assert len([m for m in model.modules() if isinstance(m, GGMLLinear)]) == 2 * 4 + 1
    assert float((model.model.layers[1].self_attn.k_norm.weight - 1).abs().max()) > 0  # the checkpoint's, not ones
    assert _greedy(str(out), "auto", activations="float32") == _greedy(str(out), "float32")


@pytest.mark.parametrize("source_kind", ["folder", "gguf"])
def test_a_phi3_checkpoint_keeps_its_fused_projections_and_runs_like_its_float_copy(tmp_path, source_kind):
    from tests.models.test_gguf_loader import write_gguf

    source = save_tiny_model("phi3", tmp_path / "phi3", vocab_size=VOCAB)
    if source_kind == "gguf":
        write_gguf(source, tmp_path / "float.gguf", GGMLQuantizationType.F32, np.random.default_rng(0), architecture="phi3")
        source = tmp_path / "float.gguf"
    out = tmp_path / "rtn"
    quantize_checkpoint(QuantizeConfig(model=str(source), method="rtn", out=out, bits=4, group_size=32), show_progress=False)
    if source_kind == "gguf":  # written under the source's own fused names, in blocks
        types = {t.name: t.tensor_type for t in GGUFReader(str(out / "model.gguf")).tensors}
        assert types["blk.0.attn_qkv.weight"] == types["blk.1.ffn_up.weight"] == GGMLQuantizationType.Q4_1
    model = load_model(out).model
    assert len([m for m in model.modules() if isinstance(m, GGMLLinear)]) == 2 * 4 + 1
    float_weights = load_model(source, dtype="float32").model.state_dict()
    ours = load_model(out, dtype="float32").model.state_dict()
    name = "model.layers.1.mlp.gate_up_proj.weight"  # gate rows stay gate rows: the error stays within the grid's steps
    assert (ours[name] - float_weights[name]).abs().max() <= 0.2 * float_weights[name].abs().max()
    assert _greedy(str(out), "auto", activations="float32") == _greedy(str(out), "float32")


@pytest.mark.parametrize("family", ["mixtral", "gemma2", "deepseek_v2"])
def test_families_beyond_llama_quantize_every_decoder_linear_and_run_like_their_float_copy(family, tokenizer, calib, tmp_path):
    """Each expert's linears (Mixtral's w1/w3 split back from w13), Gemma 2's windowed layers, MLA's projections (its
    kv_b_proj, read as a matrix, and the routers stay float): GPTQ rounds them all, the checkpoint loads in blocks,
    runs as its float copy, and stays near the float model."""
    source = save_tiny_model(family, tmp_path / "float", vocab_size=VOCAB)
    out = tmp_path / "gptq"
    config = QuantizeConfig(model=str(source), method="gptq", out=out, bits=8, group_size=32, calib=calib,
                            tokenizer=tokenizer, calib_tokens=512, seq_len=128)
    quantize_checkpoint(config, show_progress=False)
    model = load_model(out).model
    blocks = {name for name, module in model.named_modules() if isinstance(module, GGMLLinear)}
    assert blocks == set(decoder_linears(load_model(source, "float32").model)) | {"lm_head"}
    assert not any(name.endswith(("kv_b_proj", ".gate")) for name in blocks)
    assert _greedy(str(out), "auto", activations="float32") == _greedy(str(out), "float32")
    float_weights = load_model(source, "float32").model.state_dict()
    for name, weight in load_model(out, "float32").model.state_dict().items():  # GPTQ moves 8-bit weights a few steps: a swapped half moves them by their size
        assert (weight - float_weights[name]).abs().max() <= 0.05 * float_weights[name].abs().max(), name


def test_folding_methods_on_experts_and_gguf_writes_of_other_families_are_refused(tmp_path, tokenizer, calib):
    source = save_tiny_model("mixtral", tmp_path / "mixtral", vocab_size=VOCAB)
    config = QuantizeConfig(model=str(source), method="awq", out=tmp_path / "out", calib=calib, tokenizer=tokenizer, group_size=64)
    with pytest.raises(ValueError, match="use --method gptq, rtn, nf4 or fp8"):
        quantize_checkpoint(config, show_progress=False)
    gpt2 = save_tiny_model("gpt2", tmp_path / "gpt2", vocab_size=VOCAB)
    with pytest.raises(ValueError, match="ember quantize runs llama"):
        quantize_checkpoint(QuantizeConfig(model=str(gpt2), method="rtn", out=tmp_path / "out", group_size=32), show_progress=False)
    assert not (tmp_path / "out").exists()
