"""W8A8 (SmoothQuant's format): per-channel int8 weights, per-token int8 activations, the compiled kernel
(w8a8_source.c), its linear layer, and logits made exact at the top."""
