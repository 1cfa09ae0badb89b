"""The quantization choices a user picks by name (`--quantization`, `--quant-activations`): quant owns them,
the engine's config validates its flags against them. Kept free of torch, so parsing flags stays cheap."""

QUANT_ACTIVATIONS = ("int8", "float32")  # what ember.quant.ggml.layers' GGML linear layers round activations to

# --quantization: the block formats a float checkpoint's decoder linears are rounded to as it loads (ember.quant.at_load),
# vLLM's name for one of them, and vLLM's names of checkpoint formats (accepted: the checkpoint's own description decides).
AT_LOAD_QUANTIZATIONS = ("int8", "int4", "fp8", "nf4")
QUANTIZATION_ALIASES = {"bitsandbytes": "nf4"}
CHECKPOINT_QUANTIZATIONS = ("gptq", "awq", "gguf", "compressed-tensors", "gptq_marlin", "awq_marlin", "marlin")
QUANTIZATIONS = (*AT_LOAD_QUANTIZATIONS, *QUANTIZATION_ALIASES, *CHECKPOINT_QUANTIZATIONS)
