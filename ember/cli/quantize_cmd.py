"""`ember quantize`: a float checkpoint -> a quantized checkpoint ember (and, for GGUF, llama.cpp) loads."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("quantize", help="quantize a float checkpoint (RTN, GPTQ, AWQ, NF4, FP8) into 4- or 8-bit blocks, or W8A8 (SmoothQuant)")
    parser.add_argument("--model", required=True, help="registered name, HF folder or GGUF file (read as float)")
    parser.add_argument("--method", required=True, help="rtn, gptq, awq (integer grids), nf4 (NormalFloat-4), fp8 (e4m3) or smoothquant (W8A8)")
    parser.add_argument("--bits", type=int, default=None, help="4 (Q4_1, or Q4_0 with --symmetric) or 8 (Q8_0); nf4: 4, fp8 and smoothquant: 8 (the default)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="columns sharing one scale: a multiple of 32 (default 128); nf4 fixes 64, fp8 32; smoothquant scales whole rows")
    parser.add_argument("--calib", type=Path, default=None, help="plain-text calibration file (gptq, awq, smoothquant)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer file for --calib when the model has none")
    parser.add_argument("--calib-tokens", type=int, default=4096, help="calibration tokens to use")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sequence")
    parser.add_argument("--symmetric", action="store_true", help="4-bit without zero point (Q4_0)")
    parser.add_argument("--act-order", action="store_true", help="GPTQ: round columns by decreasing Hessian diagonal")
    parser.add_argument("--damp", type=float, default=0.01, help="GPTQ: damping as a fraction of the mean Hessian diagonal")
    parser.add_argument("--alpha", type=parse_alpha, default=None,
                        help="smoothquant: migration strength in [0, 1], s = max|X|^alpha / max|W|^(1-alpha) (default 0.5), "
                             "or 'auto': the candidate whose W8A8 model predicts the calibration text best")
    parser.add_argument("--out", type=Path, required=True, help="folder to create (must not exist)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ember.quant.config import QuantizeConfig
    from ember.quantize import quantize_checkpoint

    bits = args.bits if args.bits is not None else {"fp8": 8, "smoothquant": 8}.get(args.method, 4)
    config = QuantizeConfig(model=args.model, method=args.method, out=args.out, bits=bits, group_size=args.group_size,
                            calib=args.calib, tokenizer=args.tokenizer, symmetric=args.symmetric, act_order=args.act_order, damp=args.damp,
                            calib_tokens=args.calib_tokens, seq_len=args.seq_len, alpha=args.alpha)
    result = quantize_checkpoint(config)
    print(f"wrote {result.out}: {result.bytes_per_parameter:.3f} bytes/parameter over {result.num_parameters:,} parameters"
          f" ({result.calib_tokens} calibration tokens); run it with `ember serve --model {result.out}`")
    return 0


def parse_alpha(text: str) -> float | str:
    """SmoothQuant's --alpha: a number, else the text as given ('auto', or what QuantizeConfig refuses with its fix)."""
    try:
        return float(text)
    except ValueError:
        return text
