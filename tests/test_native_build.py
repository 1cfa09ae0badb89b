"""native_build: kernel sources are compiled from their text with local headers spliced in, and every one builds here."""

from __future__ import annotations

import os
import shutil

import pytest

from ember.native_build import PURE_TORCH_ENV, with_local_includes


def test_local_headers_are_spliced_into_the_text_the_build_cache_keys_on(tmp_path):
    (tmp_path / "helpers.h").write_text("static int one(void) { return 1; }\n")
    source = tmp_path / "kernel.c"
    source.write_text('#include <stdint.h>\n#include "helpers.h"\nint two(void) { return one() + one(); }\n')
    text = with_local_includes(source)
    assert text == "#include <stdint.h>\nstatic int one(void) { return 1; }\n\nint two(void) { return one() + one(); }\n"
    (tmp_path / "helpers.h").write_text("static int one(void) { return 2 - 1; }\n")
    assert with_local_includes(source) != text  # a header edit changes the key: the kernel is rebuilt


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler here: torch does the work")
@pytest.mark.skipif(bool(os.environ.get(PURE_TORCH_ENV)), reason=f"{PURE_TORCH_ENV} turns the kernels off")
def test_every_kernel_library_builds_where_a_compiler_exists():
    """A source that stops compiling must fail the suite: the loaders return None and the kernels' own tests skip."""
    from ember.layers.cpu_attention import load_attention
    from ember.layers.cpu_decoder_layer import load_decoder_layer_kernel
    from ember.layers.cpu_elementwise import load_elementwise
    from ember.layers.cpu_gemm import load_gemm
    from ember.quant.ggml.kernels import load_kernels
    from ember.quant.int8.w8a8_kernels import load_w8a8_kernels

    loaders = (load_attention, load_decoder_layer_kernel, load_elementwise, load_gemm, load_kernels, load_w8a8_kernels)
    assert [loader.__name__ for loader in loaders if loader() is None] == []
