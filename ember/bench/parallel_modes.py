"""The parallel bench's modes and how its runs' token counts read: shared by the bench, its goals
and the report, with no engine import (the report renders saved results without torch)."""

from __future__ import annotations

# What each parallel mode is called in the report; "sequence" is tensor parallel with sequence parallelism switched on.
PARALLEL_MODES = {"tensor": "tensor parallel", "sequence": "tensor + sequence parallel", "pipeline": "pipeline parallel",
                  "expert": "expert parallel", "tensor-quantized": "tensor parallel on the quantized weights (--dtype auto)",
                  "tensor-quantized-exact": "tensor parallel on the quantized weights, exact row layers (--dtype auto)"}
QUANTIZED_MODES = ("tensor-quantized", "tensor-quantized-exact")  # both engines load at --dtype auto; the others float32


def mode_dtype(mode: str) -> str:
    """The --dtype both engines of a parallel bench mode load at."""
    return "auto" if mode in QUANTIZED_MODES else "float32"


def padding(result: dict) -> tuple[int, int] | None:
    """(tokens computed, tokens counted) of a run whose formula counts padded tokens and whose split padded some;
    else None."""
    counted, tokens = result.get("counted_tokens_per_run"), result["tokens_per_run"]
    return None if counted is None or counted == tokens else (tokens, counted)
