"""A real `ember serve` with n-gram speculation: the official client gets plain greedy text, /metrics counts drafts."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from ember.cli.main import main
from ember.engine.sampling_params import SamplingParams
from tests.engine.stories import stories_llm
from tests.server.harness import ServeProcess

PROMPT = "Once upon a time, there was a little girl named Lily. She"


def _serve(stories_dir, log_path, *extra: str) -> ServeProcess:
    model = ["--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin")]
    return ServeProcess([*model, "--served-model-name", "stories", *extra], log_path)


def _metric(base_url: str, name: str) -> float:
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics")


def test_speculative_serve_returns_the_plain_greedy_text_and_reports_acceptance(stories_dir, tmp_path):
    plain_text = stories_llm(stories_dir).generate(PROMPT, SamplingParams(max_tokens=120, temperature=0))[0].outputs[0].text
    # A fixed draft length: adaptive K may back off on a busy machine's timings, and this test counts drafts.
    with _serve(stories_dir, tmp_path / "serve.log", "--speculative-method", "ngram", "--no-adaptive-speculation") as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        answer = client.completions.create(model="stories", prompt=PROMPT, max_tokens=120, temperature=0)
        assert answer.choices[0].text == plain_text
        drafted = _metric(server.base_url, "ember:spec_decode_num_draft_tokens_total")
        accepted = _metric(server.base_url, "ember:spec_decode_num_accepted_tokens_total")
        assert drafted >= accepted > 0
        assert _metric(server.base_url, "ember:spec_decode_acceptance_rate") == pytest.approx(accepted / drafted)
        assert _metric(server.base_url, "ember:spec_decode_mean_accepted_length") > 1.0


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_serve_with_trained_draft_heads_streams_the_plain_greedy_text(stories_dir, shared_dir, tmp_path, method):
    """The engine process loads heads trained here (`ember medusa train` / `ember eagle train`, a few steps: what counts
    is that drafting runs behind the API) and a streamed completion is still plain greedy decoding's text."""
    model = ["--model", str(stories_dir / "stories260K.bin"), "--tokenizer", str(stories_dir / "tok512.bin")]
    shape = ["--steps", "4", "--steps-per-batch", "2", "--batch-size", "2", "--sequence-length", "32"]
    heads = tmp_path / "heads"
    assert main([method, "train", *model, "--corpus", str(shared_dir / "corpus" / "tinyshakespeare.txt"), *shape,
                 "--out", str(heads)]) == 0
    plain_text = stories_llm(stories_dir).generate(PROMPT, SamplingParams(max_tokens=80, temperature=0))[0].outputs[0].text
    flag = "--medusa-heads" if method == "medusa" else "--eagle-head"
    spec = ["--speculative-method", method, flag, str(heads), "--num-speculative-tokens", "2", "--no-adaptive-speculation"]
    with _serve(stories_dir, tmp_path / "serve.log", *spec) as server:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        stream = client.completions.create(model="stories", prompt=PROMPT, max_tokens=80, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == plain_text
        assert _metric(server.base_url, "ember:spec_decode_num_draft_tokens_total") > 0
