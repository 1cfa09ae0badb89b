"""GGML block formats kept as they are in the file: the blocks, their compiled kernels (ggml_source.c), ember's
interleaved layouts, IQ4_NL re-coded, zero-point corrections, and the linear and embedding layers over them."""
