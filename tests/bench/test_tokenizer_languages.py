"""The tokens-by-language section of `ember bench tokenizers`: real Firefox language packs and
llama.cpp vocab GGUFs where the fetch scripts put them (skipped with the fix otherwise), a
missing folder, and the table and PNG in the report."""

from __future__ import annotations

import pytest

from ember.bench import report
from ember.bench.tokenizer_languages import (
    firefox_l10n_dir,
    format_language_costs,
    llama_cpp_models_dir,
    run_language_costs,
)
from ember.tokenizers.deb_text import LANGUAGE_PACKS, find_language_packs

VOCABULARIES = ["gpt-2", "refact"]


@pytest.fixture(scope="module")
def section():
    packs, models = firefox_l10n_dir(), llama_cpp_models_dir()
    if len(find_language_packs(packs)) < len(LANGUAGE_PACKS):
        pytest.skip(f"no Firefox language packs in {packs}: run .ci/fetch-firefox-l10n")
    if not all((models / f"ggml-vocab-{name}.gguf").is_file() for name in VOCABULARIES):
        pytest.skip(f"no llama.cpp vocab GGUFs in {models}: run .ci/fetch-llama-cpp-models")
    return run_language_costs(vocabularies=VOCABULARIES)


def test_korean_and_hindi_cost_more_than_english_for_the_same_messages(section):
    rows = {row["vocabulary"]: row for row in section["rows"]}
    assert sorted(rows) == VOCABULARIES
    assert section["languages"]["korean"]["messages"] == section["languages"]["english"]["messages"]
    for row in rows.values():
        # GPT-2's and StarCoder's vocabularies were learnt mostly from English.
        assert row["vs_english"]["korean"] > 1.5
        assert row["vs_english"]["hindi"] > 1.5
        assert row["llama_cpp_mismatches"] in (0, None)  # None: llama-cpp-python absent


def test_the_table_and_plot_go_into_the_report(section, tmp_path):
    table = "\n".join(format_language_costs(section))
    assert "| gpt-2 |" in table and "korean / english" in table
    results = {"tokenizers": {"markdown": table, "language_costs": section}}
    plots = report.make_plots(results, tmp_path)
    assert plots["tokenizer_languages"].stat().st_size > 10_000
    assert "![tokenizer_languages](tokenizer_languages.png)" in report.render_markdown(
        results, plots, tmp_path
    )


def test_without_the_language_packs_the_section_says_how_to_get_them(tmp_path):
    outcome = run_language_costs(models_dir=tmp_path, packs_dir=tmp_path)
    assert "run .ci/fetch-firefox-l10n" in outcome["skipped"]
    assert "firefox-esr-l10n-hi-in" in format_language_costs(outcome)[0]
