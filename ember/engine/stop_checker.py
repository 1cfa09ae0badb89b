"""Detokenizes each new token and decides whether a sequence is done, and why."""

from __future__ import annotations

from ember.engine.request import Sequence


class StopChecker:
    """Applies EOS, stop token ids, stop strings (found across token boundaries), max_tokens and the context limit.

    Stop strings are never emitted (unless `include_stop_str_in_output`): text that could be
    the start of one is held back until the next token settles it.
    """

    def __init__(self, eos_ids: frozenset[int], max_model_len: int) -> None:
        self.eos_ids = eos_ids
        self.max_model_len = max_model_len

    def append_token(self, seq: Sequence, token_id: int) -> None:
        """Add a sampled token to `seq`, update its text, and finish it if a stop condition holds."""
        params = seq.params
        seq.token_ids.append(token_id)
        if token_id in self.eos_ids and not params.ignore_eos:
            self._finish(seq, "stop", None)
        elif token_id in params.stop_token_ids:
            self._finish(seq, "stop", token_id)
        else:
            previous_length = len(seq.text)
            if seq.decoder is not None:
                seq.text += seq.decoder.push(token_id)
            if params.stop and seq.num_output_tokens > params.min_tokens - 1:
                self._check_stop_strings(seq, previous_length)
        if seq.guide is not None and seq.finish_reason is None:
            seq.guide.advance(token_id)
            if seq.guide.is_finished:
                self._finish(seq, "stop", None)  # the output is complete: nothing more may follow it
        if seq.finish_reason is None and (
            (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens)
            or len(seq.token_ids) >= self.max_model_len
        ):
            self._finish(seq, "length", None)

    def emittable_text_end(self, seq: Sequence) -> int:
        """How much of `seq.text` may be shown now: all of it, minus a possible stop-string start."""
        if seq.finish_reason is not None or not seq.params.stop:
            return len(seq.text)
        return len(seq.text) - _longest_stop_prefix_suffix(seq.text, seq.params.stop)

    def _check_stop_strings(self, seq: Sequence, previous_length: int) -> None:
        longest = max(len(s) for s in seq.params.stop)
        search_from = max(0, previous_length - longest + 1)
        found: tuple[int, str] | None = None
        for stop in seq.params.stop:
            index = seq.text.find(stop, search_from)
            if index != -1 and (found is None or index < found[0]):
                found = (index, stop)
        if found is not None:
            index, stop = found
            end = index + len(stop) if seq.params.include_stop_str_in_output else index
            seq.text = seq.text[:end]
            self._finish(seq, "stop", stop)

    def _finish(self, seq: Sequence, reason: str, stop_reason: str | int | None) -> None:
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        if seq.decoder is not None and (reason == "length" or seq.guide is not None):  # a JSON value keeps its last bytes
            seq.text += seq.decoder.flush()


def _longest_stop_prefix_suffix(text: str, stops: list[str]) -> int:
    """Length of the longest end of `text` that is a proper start of some stop string."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best
