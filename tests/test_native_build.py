"""native_build: kernel sources are compiled from their text with local headers spliced in."""

from __future__ import annotations

from ember.native_build import with_local_includes


def test_local_headers_are_spliced_into_the_text_the_build_cache_keys_on(tmp_path):
    (tmp_path / "helpers.h").write_text("static int one(void) { return 1; }\n")
    source = tmp_path / "kernel.c"
    source.write_text('#include <stdint.h>\n#include "helpers.h"\nint two(void) { return one() + one(); }\n')
    text = with_local_includes(source)
    assert text == "#include <stdint.h>\nstatic int one(void) { return 1; }\n\nint two(void) { return one() + one(); }\n"
    (tmp_path / "helpers.h").write_text("static int one(void) { return 2 - 1; }\n")
    assert with_local_includes(source) != text  # a header edit changes the key: the kernel is rebuilt
