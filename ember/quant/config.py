"""`ember quantize` settings: one validated dataclass, every user error named with its fix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ember.quant.codes.grid import BlockGrid
from ember.quant.int8.channel import FORMAT_NAME as INT8_ROWS_FORMAT

# Bits each method can produce.
METHOD_BITS: dict[str, tuple[int, ...]] = {"rtn": (4, 8), "gptq": (4, 8), "awq": (4, 8), "nf4": (4,), "fp8": (8,), "smoothquant": (8,)}
# Methods whose block format fixes the group: NF4 scales 64 values, FP8 32 (ember.quant.codes.float_codes).
FIXED_GROUP_SIZE = {"nf4": 64, "fp8": 32}
# Methods with one scale per output channel (a whole row), not per group of columns.
PER_CHANNEL_METHODS = ("smoothquant",)
DEFAULT_GROUP_SIZE = 128
CALIBRATED_METHODS = ("gptq", "awq", "smoothquant")
MIN_CALIB_TOKENS = 256
DEFAULT_ALPHA = 0.5  # SmoothQuant's migration strength (the paper's choice for most models)
ALPHA_AUTO = "auto"  # --alpha auto: chosen on the calibration text (ember.quant.methods.alpha_search)


@dataclass(frozen=True)
class QuantizeConfig:
    """What to quantize, how, with which calibration text, and where to write it."""

    model: str
    method: str
    out: Path
    bits: int = 4
    group_size: int | None = None  # None: the method's (FIXED_GROUP_SIZE, else DEFAULT_GROUP_SIZE; stays None per channel)
    calib: Path | None = None
    tokenizer: str | None = None
    symmetric: bool = False
    act_order: bool = False
    damp: float = 0.01
    calib_tokens: int = 4096
    seq_len: int = 512
    alpha: float | str | None = None  # SmoothQuant's migration strength in [0, 1] or ALPHA_AUTO; None: DEFAULT_ALPHA (smoothquant only)

    def __post_init__(self) -> None:
        if self.method not in METHOD_BITS:
            raise ValueError(f"unknown --method {self.method!r}; choose one of {', '.join(METHOD_BITS)}")
        if self.bits not in METHOD_BITS[self.method]:
            raise ValueError(f"--method {self.method} cannot make {self.bits}-bit weights; use --bits {' or '.join(map(str, METHOD_BITS[self.method]))}"
                             + self._other_bits_hint())
        self._check_alpha()
        self._check_group_size()
        if self.method in CALIBRATED_METHODS and self.calib is None:
            raise ValueError(f"--method {self.method} needs --calib FILE: a plain-text file of at least {MIN_CALIB_TOKENS} tokens")
        if self.calib is not None and not self.calib.is_file():
            raise ValueError(f"--calib {self.calib} is not a file; give a plain-text calibration file")
        if self.out.exists():
            raise ValueError(f"--out {self.out} already exists; remove it or choose another folder (nothing is overwritten)")
        if self.calib_tokens < MIN_CALIB_TOKENS or self.seq_len < 16:
            raise ValueError(f"--calib-tokens must be at least {MIN_CALIB_TOKENS} and --seq-len at least 16")

    def _other_bits_hint(self) -> str:
        if self.method == "smoothquant":
            return " (SmoothQuant is W8A8: int8 weights and int8 activations; for 4-bit weights use --method awq or gptq)"
        return ""

    def _check_alpha(self) -> None:
        if self.method != "smoothquant":
            if self.alpha is not None:
                raise ValueError(f"--alpha is SmoothQuant's migration strength; drop it or use --method smoothquant (not {self.method})")
            return
        if self.alpha is None:
            object.__setattr__(self, "alpha", DEFAULT_ALPHA)
        elif self.alpha == ALPHA_AUTO:
            return
        elif isinstance(self.alpha, str) or not 0.0 <= self.alpha <= 1.0:  # also refuses NaN
            raise ValueError(f"--alpha {self.alpha} must lie in [0, 1] (0: all of the outliers stay in the activations, "
                             f"1: all move into the weights) or be {ALPHA_AUTO!r} (chosen on the calibration text); "
                             f"SmoothQuant's default is {DEFAULT_ALPHA}")

    def _check_group_size(self) -> None:
        if self.method in PER_CHANNEL_METHODS:
            if self.group_size is not None:
                raise ValueError(f"--method {self.method} scales whole rows (one scale per output channel); drop --group-size")
            return
        fixed = FIXED_GROUP_SIZE.get(self.method)
        if self.group_size is None:
            object.__setattr__(self, "group_size", fixed or DEFAULT_GROUP_SIZE)
        elif fixed is not None and self.group_size != fixed:
            raise ValueError(f"--method {self.method} scales blocks of {fixed} values; drop --group-size or give {fixed}")
        if fixed is None:
            self.grid  # noqa: B018 - validates bits and group size

    @property
    def grid(self) -> BlockGrid:
        """The integer grid of rtn, gptq and awq (nf4 and fp8 have float codes of their own)."""
        return BlockGrid(self.bits, self.group_size, self.symmetric)

    @property
    def format_name(self) -> str:
        """The block format the quantized linears get."""
        return {"nf4": "NF4", "fp8": "FP8", "smoothquant": INT8_ROWS_FORMAT}.get(self.method) or self.grid.format.name
