"""ember.layers: what model files are built from (attention, linear, norms, rotary, MoE, samplers): tensors in, tensors out.

Parallel layers and the compiled CPU paths are chosen here, by config. See README.md beside this file.
"""
