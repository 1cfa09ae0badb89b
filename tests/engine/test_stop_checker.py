"""StopChecker on hand-made sequences: EOS, ignore_eos, stop strings held back, max_tokens, context end."""

from __future__ import annotations

from ember.engine.engine_request import EngineRequest
from ember.engine.request import Request, make_sequence
from ember.engine.sampling_params import SamplingParams
from ember.engine.stop_checker import StopChecker
from ember.tokenizers.base import Tokenizer

EOS = 0


class LetterTokenizer(Tokenizer):
    """Token i (i >= 1) is the letter chr(ord('a') + i - 1); token 0 is EOS."""

    vocab_size = 27
    bos_id = None
    eos_id = EOS

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - ord("a") + 1 for c in text]

    def token_bytes(self, token_id: int) -> bytes:
        return b"</s>" if token_id == EOS else bytes([ord("a") + token_id - 1])

    def is_special(self, token_id: int) -> bool:
        return token_id == EOS


def _sequence(params: SamplingParams):
    tokenizer = LetterTokenizer()
    request = Request(EngineRequest("r", [1, 2], params))
    return make_sequence(request, 0, tokenizer, [1, 2]), StopChecker(frozenset({EOS}), max_model_len=12)


def _feed(text: str, params: SamplingParams):
    seq, checker = _sequence(params)
    for token in LetterTokenizer().encode(text):
        if seq.finish_reason is None:
            checker.append_token(seq, token)
    return seq, checker


def test_eos_finishes_with_reason_stop_and_adds_no_text():
    seq, checker = _sequence(SamplingParams(max_tokens=5))
    checker.append_token(seq, 3)
    checker.append_token(seq, EOS)
    assert (seq.finish_reason, seq.stop_reason, seq.text) == ("stop", None, "c")


def test_ignore_eos_keeps_going_until_max_tokens():
    seq, checker = _sequence(SamplingParams(max_tokens=2, ignore_eos=True))
    checker.append_token(seq, EOS)
    assert seq.finish_reason is None
    checker.append_token(seq, 3)
    assert seq.finish_reason == "length"


def test_stop_string_found_across_tokens_is_cut_from_the_text():
    seq, _ = _feed("abcxyzdef", SamplingParams(max_tokens=9, stop=["xyz"]))
    assert (seq.text, seq.finish_reason, seq.stop_reason) == ("abc", "stop", "xyz")


def test_include_stop_str_in_output_keeps_the_stop_string():
    seq, _ = _feed("abcxyzdef", SamplingParams(max_tokens=9, stop=["xyz"], include_stop_str_in_output=True))
    assert seq.text == "abcxyz"


def test_text_that_may_start_a_stop_string_is_held_back():
    seq, checker = _feed("abxy", SamplingParams(max_tokens=9, stop=["xyz"]))
    assert seq.finish_reason is None
    assert checker.emittable_text_end(seq) == 2  # "xy" could still become "xyz"


def test_the_context_window_ends_a_sequence_with_reason_length():
    seq, _ = _feed("abcdefghijklmn", SamplingParams(max_tokens=None))
    assert seq.finish_reason == "length"
    assert len(seq.token_ids) == 12
