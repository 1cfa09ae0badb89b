"""Readers of HF checkpoints quantized elsewhere: AutoGPTQ / GPTQModel / AutoAWQ, bitsandbytes 4-bit, and 8- or 4-bit codes
with float scales, as vLLM users find them on the Hub."""
