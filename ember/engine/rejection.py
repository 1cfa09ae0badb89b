"""RequestRejected: the one error a request a user can get wrong raises, naming the field to change."""

from __future__ import annotations


class RequestRejected(ValueError):
    """A request this engine will never run as asked.

    `param` names the field to change (SamplingParams' or EngineRequest's name: "max_tokens", "prompt", ...),
    `code` says why in a word a client can branch on ("invalid_value", "context_length_exceeded").
    The server maps it to an OpenAI error once (ember.server.common.errors.rejection_error); offline it is raised as is.
    """

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def __reduce__(self):  # keep `param` and `code` when the rejection crosses a process boundary
        return (RequestRejected, (str(self), self.param, self.code))


def check(condition: bool, param: str, expected: str) -> None:
    """Raise RequestRejected saying `param` must be `expected`, unless `condition` holds."""
    if not condition:
        raise RequestRejected(f"{param!r} must be {expected}", param)
