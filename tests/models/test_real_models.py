"""The real checkpoints from the shared assets: SmolLM2-135M-Instruct (GGUF) and stories260K (llama2.c)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.engine.config import EngineConfig
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.eval.perplexity import perplexity
from ember.llm import LLM
from ember.server.chat_template import load_chat_template
from ember.server.protocol import ChatMessage

# Reference figures from ../shared/README.md (transformers 5.24; llama.cpp gives 40.77).
SMOLLM2_TINYSHAKESPEARE_PPL = 40.8
PPL_RELATIVE_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_gguf: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(smollm2_gguf)))


def test_smollm2_answers_the_capital_of_france_with_paris(smollm2_engine):
    tokenizer = smollm2_engine.tokenizer
    template = load_chat_template(tokenizer)
    prompt = template.render([ChatMessage(role="user", content="What is the capital of France?")])
    smollm2_engine.add_request("paris", tokenizer.encode(prompt), SamplingParams(temperature=0, max_tokens=32))
    text = ""
    while smollm2_engine.has_unfinished_requests():
        for output in smollm2_engine.step():
            text += output.outputs[0].text
    assert "Paris" in text


def test_smollm2_perplexity_on_tinyshakespeare_matches_the_reference(smollm2_engine, shared_dir):
    text = (shared_dir / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    result = perplexity(smollm2_engine, text, max_tokens=1024)
    assert result.num_tokens == 1024
    assert abs(result.perplexity - SMOLLM2_TINYSHAKESPEARE_PPL) <= PPL_RELATIVE_TOLERANCE * SMOLLM2_TINYSHAKESPEARE_PPL


def test_stories260k_greedy_from_bos_equals_the_llama2c_reference(stories_dir):
    llm = LLM(str(stories_dir / "stories260K.bin"), tokenizer=str(stories_dir / "tok512.bin"))
    # llama2.c's run.c with 200 steps prints 200 sampled tokens, then a newline.
    output = llm.generate([[llm.tokenizer.bos_id]], SamplingParams(temperature=0, max_tokens=200))[0].outputs[0]
    expected = (stories_dir / "greedy_200steps_from_BOS.expected.txt").read_text(encoding="utf-8")
    assert output.text + "\n" == expected
    assert len(output.token_ids) == 200


def test_stories260k_v1_checkpoint_loads_the_same_weights(stories_dir):
    tokenizer = str(stories_dir / "tok512.bin")
    legacy = LLM(str(stories_dir / "stories260K.bin"), tokenizer=tokenizer)
    version1 = LLM(str(stories_dir / "stories260K_v1.bin"), tokenizer=tokenizer)
    params = SamplingParams(temperature=0, max_tokens=40)
    prompt = "Once upon a time"
    assert version1.generate(prompt, params)[0].outputs[0].token_ids == legacy.generate(prompt, params)[0].outputs[0].token_ids
