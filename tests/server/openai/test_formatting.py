"""Logprob formatting of ids the tokenizer has no token for (a model's logits can be wider than its vocabulary)."""

from __future__ import annotations

from ember.engine.outputs import CompletionOutput, Logprob
from ember.server.openai.formatting import LogprobFormatter
from ember.tokenizers import load


def test_an_id_past_the_vocabulary_reads_as_empty_text_with_no_bytes(smollm2_tokenizer_dir) -> None:
    tokenizer = load(smollm2_tokenizer_dir)
    (h,) = tokenizer.encode("h")
    position = {h: Logprob(-0.1, 1, None), tokenizer.vocab_size + 5: Logprob(-3.0, 2, None)}
    part = CompletionOutput(index=0, text="h", token_ids=[h], logprobs=[position])
    chat = LogprobFormatter(tokenizer).chat(part, num_top=2).content[0]
    assert (chat.token, chat.bytes) == ("h", [104])
    assert [(top.token, top.bytes) for top in chat.top_logprobs] == [("h", [104]), ("", [])]
    legacy = LogprobFormatter(tokenizer).completion(part, num_top=2, text_offset=0)
    assert legacy.top_logprobs == [{"h": -0.1, "": -3.0}]
