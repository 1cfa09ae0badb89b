"""`ember bench ...`: one subcommand per workload, `roofline`, `tokenizers`, and `all` (the report)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
from pathlib import Path

from ember.bench.quant_methods import DEFAULT_METHODS as DEFAULT_QUANT_METHODS
from ember.bench.quant_methods import METHOD_SPECS as QUANT_METHOD_SPECS
from ember.cli.quantize_cmd import parse_alpha
from ember.engine.config import DTYPES, KV_CACHE_DTYPES
from ember.engine.device import DEVICES

WORKLOAD_COMMANDS = ("mixed", "batch1", "shared-prefix", "long-prefill", "serve")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="benchmarks: ember vs HF transformers and llama.cpp, roofline, report")
    commands = parser.add_subparsers(dest="bench_command", required=True)
    for name, help_text in (
        ("mixed", "throughput on 64 mixed-length requests: ember vs its peers"),
        ("batch1", "single-stream decode tok/s vs peers and the memory roofline"),
        ("shared-prefix", "TTFT with prefix caching on vs off"),
        ("long-prefill", "decoders' inter-token latency with chunked prefill on vs off"),
    ):
        sub = commands.add_parser(name, help=help_text)
        _common(sub)
        if name in ("mixed", "shared-prefix"):
            sub.add_argument("--num-requests", type=int, default=None, help="request count (default 64 x --scale)")
        if name == "long-prefill":
            sub.add_argument("--chunk-tokens", type=int, default=256, help="step token budget with chunked prefill on")
        if name == "batch1":
            sub.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                             help="also run ember with this KV cache dtype, same workload and run (ratio to the default cache); "
                                  "a long-prompt --workload shows what the cache's bytes cost")
        sub.add_argument("--workload", type=Path, default=None, help="replay this JSONL workload instead of generating one")
        sub.add_argument("--save-workload", type=Path, default=None, help="write the generated workload to this JSONL file")
        sub.set_defaults(func=_run_workload)
    serve = commands.add_parser("serve", help="HTTP load against an OpenAI-compatible server (default: start ember serve)")
    _common(serve, peers=False)
    serve.add_argument("--peers", default="none", help="vllm: also start `vllm serve` of the same weights and send it the same requests, same run")
    _vllm_python_argument(serve)
    serve.add_argument("--url", default=None, help="base URL of a running server (default: start `ember serve` on a free port)")
    serve.add_argument("--served-model", default=None, help="the 'model' field to send (default: none)")
    serve.add_argument("--num-requests", type=int, default=None, help="requests per run (default 64 x --scale)")
    serve.add_argument("--concurrency", type=int, default=16, help="most requests in flight (0: no cap)")
    serve.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second (default: all at once)")
    serve.add_argument("--max-prompt-tokens", type=int, default=512, help="longest prompt of the mixed-like requests (and of the batch-1 request, up to 128)")
    serve.add_argument("--max-output-tokens", type=int, default=256, help="longest output of the requests (and of the batch-1 request, up to 128)")
    serve.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    serve.add_argument("--slo-tpot-ms", type=float, default=200.0)
    serve.add_argument("--data-parallel-size", type=int, default=1, metavar="D",
                       help="D > 1: the same workloads against D replicas (`ember serve -dp D`) and one engine, each on "
                            "its own share of the cores; reports served output tok/s and the ratio (ideal D)")
    serve.add_argument("--workload", type=Path, default=None, help="replay this JSONL serve workload")
    serve.add_argument("--save-workload", type=Path, default=None)
    serve.set_defaults(func=_run_workload)
    gateway = commands.add_parser("gateway", help="prefix-aware vs round-robin routing over 2 ember replicas, and gateway overhead")
    gateway.add_argument("--model", default="smollm2-135m-instruct", help="what each `ember serve` replica loads")
    gateway.add_argument("--documents", type=int, default=8, help="distinct shared prefixes")
    gateway.add_argument("--doc-chars", type=int, default=2400, help="characters per document (the shared prefix)")
    gateway.add_argument("--questions", type=int, default=4, help="requests per document")
    gateway.add_argument("--concurrency", type=int, default=4)
    gateway.add_argument("--max-tokens", type=int, default=8)
    gateway.add_argument("--overhead-pairs", type=int, default=200, help="paired direct / gateway requests for the overhead")
    gateway.add_argument("--seed", type=int, default=0)
    gateway.add_argument("--plot", type=Path, default=None, help="write a PNG of hit rate and TTFT here")
    gateway.add_argument("--json", type=Path, default=None)
    gateway.set_defaults(func=_run_gateway)
    spec = commands.add_parser("spec", help="speculative decoding: ember with vs without, batch 1 and batch sweep, same run")
    _common(spec, peers=False)
    spec.add_argument("--methods", default="ngram", help="comma-separated proposers to compare: ngram, draft, medusa, eagle")
    spec.add_argument("--num-speculative-tokens", type=int, default=None,
                      help="draft length cap of every proposer (default: the engine's per proposer, 8 for ngram, 4 for the others)")
    spec.add_argument("--draft-model", default=None, help="draft model for the 'draft' proposer (default: the target itself)")
    spec.add_argument("--draft-dtype", default=None, choices=("float32", "bfloat16", "auto"),
                      help="draft dtype (default: auto for a self-draft, as `ember bench all` runs it: a quantized GGUF in its blocks)")
    spec.add_argument("--medusa-heads", default=None,
                      help="Medusa heads folder for the 'medusa' proposer (default: trained here on the shared corpus, cached)")
    spec.add_argument("--medusa-train-steps", type=int, default=160,
                      help="training steps (4 per batch of target hidden states) of heads this bench trains itself")
    spec.add_argument("--eagle-head", default=None,
                      help="EAGLE-style head folder for the 'eagle' proposer (default: trained here on the shared corpus, cached)")
    spec.add_argument("--eagle-train-steps", type=int, default=320,
                      help="training steps (4 per batch of target hidden states) of a head this bench trains itself")
    spec.add_argument("--train-replies", type=int, default=96,
                      help="heads trained here learn from this many of the model's own replies to corpus prompts (0: the corpus)")
    spec.add_argument("--num-prompts", type=int, default=3, help="prompts per batch-1 workload")
    spec.add_argument("--output-len", type=int, default=128)
    spec.add_argument("--batch-sizes", default="1,4,8,16", help="batch sweep on code-edit ('' to skip)")
    spec.add_argument("--mixed-requests", type=int, default=16, help="requests of the mixed workload (0 to skip)")
    spec.add_argument("--mixed-max-output", type=int, default=128, help="longest output of the mixed workload")
    spec.add_argument("--sibling", default=None, metavar="TARGET,DRAFT",
                      help="also run batch 1 with TARGET (dtype auto) plain, with n-gram and with DRAFT, a smaller model of its family, as draft model")
    spec.add_argument("--plot", type=Path, default=Path("benchmarks/plots/spec_acceptance.png"), help="acceptance histogram PNG")
    spec.set_defaults(func=_run_spec)
    structured = commands.add_parser("structured", help="structured outputs: free text vs JSON and grammars through each backend, "
                                                        "batch 1 and 16, same run")
    _common(structured, peers=False)
    structured.add_argument("--num-prompts", type=int, default=3, help="chat prompts asking for an item as JSON")
    structured.add_argument("--output-len", type=int, default=128, help="most tokens per reply")
    structured.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes (as many prompts as the batch)")
    structured.add_argument("--variants", default=None,
                            help="semicolon-separated variant names to run beside free text (default: all), e.g. "
                                 "'json_schema, xgrammar;grammar, llguidance'")
    structured.set_defaults(func=_run_structured)
    prefix = commands.add_parser("prefix", help="prefix cache: prompt tokens served and TTFT, radix tree vs block hashes, same run")
    _common(prefix, peers=False)
    prefix.set_defaults(func=_run_prefix)
    lora = commands.add_parser("lora", help="LoRA: mixed output tok/s with 0, 1, 4, 16 adapters of rank 8 and 64 vs the base model")
    _common(lora, peers=False, default_dtype="auto")
    lora.add_argument("--num-requests", type=int, default=64, help="requests of the mixed workload")
    lora.add_argument("--max-prompt", type=int, default=512, help="longest prompt of the mixed workload")
    lora.add_argument("--max-output", type=int, default=256, help="longest output of the mixed workload")
    lora.add_argument("--adapter-dir", type=Path, default=Path("benchmarks/lora_adapters"), help="where the random adapters are written (git ignores the default)")
    lora.set_defaults(func=_run_lora)
    contention = commands.add_parser("contention", help="batch-1 decode and mixed tok/s alone and beside a busy neighbour, same run")
    _common(contention, peers=False, default_dtype="auto")
    contention.add_argument("--num-requests", type=int, default=16, help="requests of the mixed workload")
    contention.set_defaults(func=_run_contention)
    soak = commands.add_parser("soak", help="many mixed requests against a real server: nothing lost, no 5xx, bounded memory")
    _common(soak, peers=False)
    soak.add_argument("--url", default=None, help="base URL of a running server (default: start `ember serve` with a small KV pool)")
    soak.add_argument("--served-model", default=None, help="the 'model' field to send (default: none)")
    soak.add_argument("--num-requests", type=int, default=None, help="requests in the soak (default 10,000 x --scale)")
    soak.add_argument("--concurrency", type=int, default=32, help="most requests in flight")
    soak.add_argument("--cancel-fraction", type=float, default=0.1, help="share of requests whose client hangs up mid-answer")
    soak.add_argument("--max-tokens", type=int, default=16, help="largest max_tokens of a request")
    soak.add_argument("--server-args", default=None,
                      help="flags for the started `ember serve` (default: a 48-block KV pool, 512-token context), e.g. '--tokenizer DIR'")
    soak.set_defaults(func=_run_soak)
    roofline = commands.add_parser("roofline", help="memory read bandwidth (C probe) and matmul throughput of this machine")
    roofline.add_argument("--model", default="smollm2-135m-instruct", help="model whose bytes/token sets the decode roofline")
    roofline.add_argument("--repeats", type=int, default=3)
    roofline.add_argument("--json", type=Path, default=None)
    roofline.set_defaults(func=_run_roofline)
    everything = commands.add_parser("all", help="run every benchmark available and write results, plots and the report")
    _common(everything, default_dtype="both")
    everything.add_argument("--report", type=Path, default=None, help="write the Markdown report here (BENCHMARKS.md)")
    everything.add_argument("--out-dir", type=Path, default=Path("benchmarks"), help="results/ and plots/ go under this folder")
    everything.add_argument("--only", default=None, help="comma-separated subset of: roofline,mixed,batch1,shared-prefix,long-prefill,serve,soak,tokenizers,gateway,"
                            "spec,quant,parallel,structured,prefix,lora (the last six are sized by --scale; see the report)")
    everything.add_argument("--chunk-tokens", type=int, default=256)
    everything.add_argument("--spec-sibling", default=None, metavar="TARGET,DRAFT",
                            help="spec section: also run batch 1 with TARGET (dtype auto) plain, with n-gram and with DRAFT, "
                                 "a smaller model of its family, as draft model (e.g. qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct)")
    everything.add_argument("--quant-also", default="", metavar="MODEL,...",
                            help="quant section: also quantize and evaluate these models (e.g. a larger one, "
                                 "qwen2.5-coder-0.5b-instruct), each in a table of its own")
    everything.add_argument("--requests", default=None, metavar="NAME=N,...",
                            help="request counts per workload overriding --scale, e.g. mixed=24,serve=8,soak=2000 (mixed, shared-prefix, serve, soak)")
    everything.add_argument("--static-dtype", default=None, choices=("float32", "bfloat16"),
                            help="run the static-batches lever of `mixed` at this dtype only (default: every dtype)")
    everything.add_argument("--tokenizer-text-mb", type=float, default=2.0, help="text size of the tokenizer benchmark in `all`")
    everything.add_argument("--no-profile", action="store_true", help="skip profiling ember when a goal is missed")
    everything.add_argument("--from-results", type=Path, default=None, metavar="RESULTS_JSON",
                            help="measure nothing: redraw the plots, summary.json and --report from a saved results file")
    everything.add_argument("--update-results", type=Path, default=None, metavar="RESULTS_JSON",
                            help="re-measure only the --only sections and keep every other section of this saved results "
                                 "file; the report names the command behind each")
    everything.set_defaults(func=_run_all)
    quant = commands.add_parser("quant", help="quantization methods: perplexity, bytes/parameter, batch-1 decode tok/s, PNG")
    quant.add_argument("--model", default="smollm2-135m-instruct", help="float checkpoint, or a GGUF read as float")
    quant.add_argument("--calib", type=Path, required=True, help="calibration corpus (plain text)")
    quant.add_argument("--eval", type=Path, required=True, help="evaluation corpus (plain text, another one)")
    quant.add_argument("--methods", default=",".join(DEFAULT_QUANT_METHODS),
                       help=f"comma-separated: {','.join(QUANT_METHOD_SPECS)} (sq8: SmoothQuant W8A8)")
    quant.add_argument("--group-size", type=int, default=128)
    quant.add_argument("--eval-windows", type=int, default=8, help="consecutive 512-token windows of --eval scored (pooled)")
    quant.add_argument("--calib-tokens", type=int, default=4096, help="calibration tokens (GPTQ's Hessian needs a few times the layer width)")
    quant.add_argument("--sq-alpha", type=parse_alpha, default="auto",
                       help="SmoothQuant's migration strength for the sq8 row: a number in [0, 1], or auto (chosen on --calib)")
    quant.add_argument("--plot", type=Path, default=Path("benchmarks/plots/quant.png"))
    quant.add_argument("--json", type=Path, default=None)
    quant.set_defaults(func=_run_quant)
    parallel = commands.add_parser("parallel", help="TP / PP / EP vs one process: scaling, bytes per token per rank, comm share")
    parallel.add_argument("--model", default="smollm2-135m-instruct")
    parallel.add_argument("--tensor-parallel-size", type=int, default=1)
    parallel.add_argument("--pipeline-parallel-size", type=int, default=1)
    parallel.add_argument("--enable-expert-parallel", action="store_true", help="MoE models: experts split over the TP ranks")
    parallel.add_argument("--enable-sequence-parallel", action="store_true", help="TP with reduce-scatter + all-gather")
    parallel.add_argument("--exact-row-parallel", action="store_true", help="TP row layers by all-gathers (bit-exact)")
    parallel.add_argument("--dtype", default="float32", choices=DTYPES,
                          help="both engines' --dtype; auto: a quantized checkpoint's ranks hold its blocks, sliced")
    parallel.add_argument("--num-prompts", type=int, default=4)
    parallel.add_argument("--prompt-len", type=int, default=64)
    parallel.add_argument("--max-tokens", type=int, default=32)
    parallel.add_argument("--repeats", type=int, default=3)
    parallel.add_argument("--seed", type=int, default=0)
    parallel.add_argument("--json", type=Path, default=None)
    parallel.set_defaults(func=_run_parallel)
    tokenizers = commands.add_parser("tokenizers", help="tokenizer encode throughput: ember vs tiktoken vs HF tokenizers")
    tokenizers.add_argument("--text-mb", type=float, default=10.0)
    tokenizers.add_argument("--repeats", type=int, default=3)
    tokenizers.add_argument("--seed", type=int, default=0)
    tokenizers.add_argument("--json", type=Path, default=None)
    tokenizers.add_argument("--plot", type=Path, default=Path("benchmarks/plots/tokenizer_languages.png"),
                            help="PNG of the tokens-by-language table (drawn when its text and vocabularies are present)")
    tokenizers.set_defaults(func=_run_tokenizers)
    seed = commands.add_parser("seed", help="the seed's numeric claims, each measured here with a verdict: SEED_CLAIMS.md and its JSON")
    seed.add_argument("--model", default="smollm2-135m-instruct", help="the model the measured rows run")
    seed.add_argument("--scale", type=float, default=0.25,
                      help="multiply request counts and sweeps (1.0: the benches' own sizes; below 0.5 the sweeps are shorter)")
    seed.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (medians are reported)")
    seed.add_argument("--seed", type=int, default=0)
    seed.add_argument("--only", default=None, help="comma-separated claim ids (the report's section names); the other rows are kept")
    seed.add_argument("--report", type=Path, default=Path("SEED_CLAIMS.md"), help="the Markdown report (its JSON is written beside it)")
    seed.add_argument("--plots-dir", type=Path, default=Path("benchmarks/plots"))
    seed.add_argument("--threads", type=int, default=None,
                      help="CPU threads of this bench process's engines and torch (default: torch's, one per core)")
    seed.set_defaults(func=_run_seed)
    return parser


def _common(parser: argparse.ArgumentParser, peers: bool = True, default_dtype: str = "float32") -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct", help="registered name, GGUF file or HF folder")
    parser.add_argument("--dtype", default=default_dtype,
                        help="comma-separated: float32, bfloat16, both (= float32,bfloat16), auto (a quantized GGUF in its blocks)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median and min-max are reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts (1.0: issue 5's sizes)")
    if peers:
        parser.add_argument("--peers", default=None,
                            help="comma-separated peers: hf, llamacpp, vllm, or none (default: all; one that cannot run here is skipped, saying why)")
        _vllm_python_argument(parser)
    parser.add_argument("--json", type=Path, default=None, help="also write the section as JSON here")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of this bench process's engines and torch peers (default: torch's, one per core)")
    parser.add_argument("--device", default="cpu", choices=DEVICES,
                        help="where mixed's and batch1's ember engines run (default cpu, as the peers; scripts/gpu_check.py "
                             "compares with transformers on a GPU)")


def _vllm_python_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-python", type=Path, default=None,
                        help="Python of the vLLM environment (default: $EMBER_VLLM_PYTHON, else .venv-vllm/bin/python; `make vllm-env` makes it)")


def _options(args: argparse.Namespace):
    from ember.bench.suite import PEERS, BenchOptions
    from ember.engine.threads import apply_num_threads

    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be at least 1")
    apply_num_threads(args.threads)
    if args.scale <= 0:
        raise ValueError("--scale must be positive")
    peer_list = getattr(args, "peers", "none")
    peers = PEERS if peer_list is None else tuple(p for p in peer_list.split(",") if p and p != "none")
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)} or none")
    dtypes = _bench_dtypes(args.dtype)
    options = BenchOptions(model=args.model, dtypes=dtypes, repeats=args.repeats, seed=args.seed, scale=args.scale, peers=peers,
                           num_requests=getattr(args, "num_requests", None), workload_file=getattr(args, "workload", None),
                           save_workload=getattr(args, "save_workload", None), chunk_tokens=getattr(args, "chunk_tokens", 256),
                           kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"), device=getattr(args, "device", "cpu"),
                           vllm_python=getattr(args, "vllm_python", None))
    options.tick = lambda description: print(f"[bench] {description}", file=sys.stderr, flush=True)
    return options


def _bench_dtypes(text: str) -> tuple[str, ...]:
    """'auto,float32' -> ('auto', 'float32'); 'both' stands for float32,bfloat16."""
    dtypes: list[str] = []
    for token in text.split(","):
        for dtype in ("float32", "bfloat16") if token == "both" else (token,):
            if dtype not in ("auto", "float32", "bfloat16"):
                raise ValueError(f"--dtype {token!r} is not a bench dtype; use float32, bfloat16, both or auto (comma-separated)")
            if dtype not in dtypes:
                dtypes.append(dtype)
    return tuple(dtypes)


def _run_workload(args: argparse.Namespace) -> int:
    from ember.bench import printing, suite

    options = _options(args)
    name = args.bench_command
    if name == "serve" and options.peers and (args.url is not None or args.data_parallel_size > 1 or set(options.peers) != {"vllm"}):
        raise ValueError("bench serve --peers takes vllm only, beside the ember server it starts itself: drop --url and --data-parallel-size")
    if name == "mixed":
        section = suite.bench_mixed(options)
    elif name == "batch1":
        section = suite.bench_batch1(options)
    elif name == "shared-prefix":
        section = suite.bench_shared_prefix(options, options.dtypes[0])
    elif name == "long-prefill":
        section = suite.bench_long_prefill(options, options.dtypes[0])
    elif args.data_parallel_size > 1:
        from ember.bench.data_parallel import bench_data_parallel
        from ember.bench.serve import SLO

        if args.url is not None:
            raise ValueError("--data-parallel-size starts its own two servers: drop --url")
        section = bench_data_parallel(options, args.data_parallel_size, args.concurrency or None, options.dtypes[0],
                                      args.max_prompt_tokens, args.max_output_tokens, SLO(args.slo_ttft_ms, args.slo_tpot_ms))
        name = "serve-data-parallel"
    else:
        from ember.bench.serve import SLO

        section = suite.bench_serve(options, url=args.url, concurrency=args.concurrency or None, request_rate=args.request_rate,
                                    slo=SLO(args.slo_ttft_ms, args.slo_tpot_ms), dtype=options.dtypes[0], served_model=args.served_model,
                                    max_prompt=args.max_prompt_tokens, max_output=args.max_output_tokens)
    printing.print_section(name, section, options.skipped)
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0


def _run_gateway(args: argparse.Namespace) -> int:
    from ember.bench.gateway import GatewayBenchSettings, dump, markdown, run_with_progress

    settings = GatewayBenchSettings(model=args.model, documents=args.documents, doc_chars=args.doc_chars, questions=args.questions,
                                    concurrency=args.concurrency, max_tokens=args.max_tokens, overhead_pairs=args.overhead_pairs,
                                    seed=args.seed)  # fmt: skip
    results = run_with_progress(settings, args.plot)
    print(markdown(results))
    print(f"reproduce: {_command_line()}")
    dump(results, args.json)
    return 0


def _run_spec(args: argparse.Namespace) -> int:
    from ember.bench.spec import SpecBenchOptions, bench_spec, format_spec_section
    from ember.engine.config import SPECULATIVE_METHODS

    options = _options(args)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = [m for m in methods if m not in SPECULATIVE_METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown proposer(s) {', '.join(unknown)}; choose from {', '.join(SPECULATIVE_METHODS)}")
    draft_model = args.draft_model
    draft_dtype = args.draft_dtype
    if "draft" in methods and draft_model is None:
        draft_model = args.model  # self-draft: the target at a cheaper precision
        draft_dtype = draft_dtype or "auto"
    try:
        batch_sizes = tuple(int(b) for b in args.batch_sizes.split(",") if b.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes {args.batch_sizes!r} should read like 1,4,8,16") from None
    spec = SpecBenchOptions(methods=methods, num_speculative_tokens=args.num_speculative_tokens, draft_model=draft_model,
                            draft_dtype=draft_dtype, medusa_heads=args.medusa_heads,
                            medusa_train_steps=args.medusa_train_steps, eagle_head=args.eagle_head,
                            eagle_train_steps=args.eagle_train_steps, train_replies=args.train_replies, num_prompts=args.num_prompts, output_len=args.output_len,
                            batch_sizes=batch_sizes, mixed_requests=args.mixed_requests,
                            mixed_max_output=args.mixed_max_output, plot_path=args.plot,
                            sibling=_sibling(args.sibling))
    _check_pulled([] if spec.sibling is None else list(spec.sibling.models))
    section = bench_spec(options, spec)
    print(format_spec_section(section))
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0
def _run_structured(args: argparse.Namespace) -> int:
    from ember.bench.structured import bench_structured, format_structured_section

    if args.num_prompts < 1 or args.output_len < 2:
        raise ValueError("--num-prompts must be at least 1 and --output-len at least 2")
    batch_sizes = tuple(int(size) for size in args.batch_sizes.split(","))
    if min(batch_sizes) < 1:
        raise ValueError("--batch-sizes are whole numbers of at least 1, e.g. 1,16")
    only = None if args.variants is None else tuple(name.strip() for name in args.variants.split(";"))
    section = bench_structured(_options(args), args.num_prompts, args.output_len, batch_sizes, only)
    print(format_structured_section(section))
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0


def _run_prefix(args: argparse.Namespace) -> int:
    from ember.bench.prefix import bench_prefix, format_prefix_section

    section = bench_prefix(_options(args))
    print(format_prefix_section(section))
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0


def _run_lora(args: argparse.Namespace) -> int:
    from ember.bench.lora import bench_lora, format_lora_section

    if args.num_requests < 1 or args.max_prompt < 32 or args.max_output < 16:
        raise ValueError("--num-requests must be at least 1, --max-prompt at least 32 and --max-output at least 16")
    section = bench_lora(_options(args), args.adapter_dir, args.num_requests, args.max_prompt, args.max_output)
    print(format_lora_section(section))
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0


def _run_contention(args: argparse.Namespace) -> int:
    from ember.bench.contention import bench_contention, format_contention_section

    options = _options(args)
    if args.num_requests < 1:
        raise ValueError("--num-requests must be at least 1")
    section = bench_contention(args.model, options.dtypes[0], options.repeats, args.num_requests, options.seed, options.tick)
    print(format_contention_section(section))
    print("machine: the ratios are to the quiet figure of the same run; on a machine shared with other work, 'quiet' is "
          "only as quiet as that work lets it be")
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0


def _run_soak(args: argparse.Namespace) -> int:
    from ember.bench import printing, suite

    options = _options(args)
    server_args = suite.SOAK_SERVER_ARGS if args.server_args is None else tuple(shlex.split(args.server_args))
    section = suite.bench_soak(options, url=args.url, concurrency=args.concurrency, cancel_fraction=args.cancel_fraction,
                               max_tokens=args.max_tokens, server_args=server_args, served_model=args.served_model)
    printing.print_section("soak", section, options.skipped)
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0 if section["lost"] == 0 and section["server_errors"] == 0 else 1


def _run_parallel(args: argparse.Namespace) -> int:
    from ember.bench.parallel import markdown, run_parallel_bench
    from ember.parallel.config import ParallelConfig

    for name in ("num_prompts", "prompt_len", "max_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    parallel = ParallelConfig.split_from_args(args)
    if not parallel.is_parallel:
        raise ValueError("give --tensor-parallel-size or --pipeline-parallel-size of 2 or more")
    result = run_parallel_bench(args.model, parallel, args.num_prompts, args.prompt_len, args.max_tokens, args.repeats, args.seed,
                                args.dtype)
    print(markdown(result))
    print(f"machine: {torch_threads()} torch threads per rank, a shared CPU box: ranks on one socket add work, they cannot speed up")
    print(f"reproduce: {_command_line()}")
    _dump(args.json, result)
    return 0


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _run_roofline(args: argparse.Namespace) -> int:
    from ember.bench import printing, suite

    options = suite.BenchOptions(model=args.model, repeats=args.repeats)
    section = suite.bench_roofline(options)
    printing.print_section("roofline", section, {})
    _dump(args.json, section)
    return 0


def _run_all(args: argparse.Namespace) -> int:
    from ember.bench import printing
    from ember.bench.run_all import SECTIONS, run_all

    if args.from_results is not None:
        from ember.bench.run_all import rerender

        rerender(args.from_results, args.report, args.out_dir)
        print(f"redrew {args.report or 'nothing (no --report)'}, summary.json and plots from {args.from_results}")
        return 0
    options = _options(args)
    only = SECTIONS if args.only is None else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        raise ValueError(f"--only: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    options.requests_by_workload = _parse_requests(args.requests)
    options.static_dtypes = None if args.static_dtype is None else (args.static_dtype,)
    options.quant_also = tuple(m.strip() for m in args.quant_also.split(",") if m.strip())
    options.spec_sibling = _sibling(args.spec_sibling)
    _check_pulled([*options.quant_also, *(() if options.spec_sibling is None else options.spec_sibling.models)])
    base = None
    if args.update_results is not None:
        if args.only is None:
            raise ValueError("--update-results re-measures only some sections: name them with --only")
        base = json.loads(args.update_results.read_text())
    results = run_all(options, _command_line(), args.report, args.out_dir, only, profile=not args.no_profile,
                      tokenizer_text_mb=args.tokenizer_text_mb, base_results=base)
    printing.print_summary(results)
    if args.report:
        print(f"wrote {args.report}, {args.out_dir}/results/summary.json and plots under {args.out_dir}/plots")
    return 0


def _sibling(text: str | None):
    """The --sibling / --spec-sibling pair, parsed before anything runs (None when not given)."""
    from ember.bench.suite import SiblingPair

    return None if text is None else SiblingPair.parse(text)


def _check_pulled(models: list[str]) -> None:
    """Fail now, not an hour into the run, when a further model of the bench is neither a path nor pulled."""
    from ember.models.registry import resolve_model

    for model in models:
        resolve_model(model)


def _parse_requests(text: str | None) -> dict[str, int]:
    """'mixed=24,serve=8' -> {'mixed': 24, 'serve': 8}."""
    counts: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in ("mixed", "shared-prefix", "serve", "soak") or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--requests: {part!r} should read NAME=N with NAME one of mixed, shared-prefix, serve, soak and N >= 1")
        counts[name] = int(value)
    return counts


def _run_tokenizers(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("ember.bench.tokenizers") is None:
        print("ember bench tokenizers: ember/bench/tokenizers.py is not present in this checkout", file=sys.stderr)
        return 2
    from ember.bench.run_all import run_tokenizer_bench_if_present
    from ember.bench.suite import BenchOptions

    outcome = run_tokenizer_bench_if_present(BenchOptions(repeats=args.repeats, seed=args.seed), text_mb=args.text_mb)
    if outcome is None:
        print("ember bench tokenizers: ember/bench/tokenizers.py has no run_tokenizer_bench", file=sys.stderr)
        return 2
    print(outcome.get("markdown") or json.dumps(outcome, indent=2, default=str))
    if (outcome.get("language_costs") or {}).get("rows") and args.plot is not None:
        from ember.bench.tokenizer_languages import plot_language_costs

        print(f"plot: {plot_language_costs(outcome['language_costs'], args.plot)}")
    _dump(args.json, outcome)
    return 0


def _run_seed(args: argparse.Namespace) -> int:
    from ember.bench.seed_claims import CLAIMS, claims_of
    from ember.bench.seed_experiments import SeedContext
    from ember.bench.seed_report import run_seed
    from ember.engine.threads import apply_num_threads

    if args.scale <= 0 or args.repeats < 1 or (args.threads is not None and args.threads < 1):
        raise ValueError("--scale must be positive, --repeats and --threads at least 1")
    apply_num_threads(args.threads)
    ids = tuple(c.id for c in CLAIMS) if args.only is None else tuple(part.strip() for part in args.only.split(",") if part.strip())
    claims = claims_of(ids)
    context = SeedContext(model=args.model, scale=args.scale, repeats=args.repeats, seed=args.seed, plots_dir=args.plots_dir,
                          tick=lambda description: print(f"[bench seed] {description}", file=sys.stderr, flush=True))
    defaults = _seed_defaults()
    flags = "".join(f" --{name.replace('_', '-')} {shlex.quote(str(getattr(args, name)))}" for name in ("model", "scale", "repeats", "seed", "threads")
                    if getattr(args, name) != defaults[name])
    results = run_seed(tuple(c.id for c in claims), context, args.report, _command_line(), flags)
    for row in results["rows"]:
        if row["id"] in ids:
            figure = "-" if row["figure"] is None else f"{row['figure']:.3g} {row['unit']}"
            print(f"{row['id']:<20} claimed {row['claimed']:<24} here {figure:<28} {row['verdict']}")
    print(f"wrote {args.report} and {args.report.with_name('seed_claims.json')}")
    return 0


def _seed_defaults() -> dict:
    """`ember bench seed`'s option defaults (a row's command names only the options its run changed)."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return vars(parser.parse_args(["bench", "seed"]))


def _run_quant(args: argparse.Namespace) -> int:
    from ember.bench import printing
    from ember.bench.quant import QuantBenchOptions, bench_quant, plot_quant

    options = QuantBenchOptions(model=args.model, calib=args.calib, eval_file=args.eval, methods=tuple(args.methods.split(",")),
                                group_size=args.group_size, eval_windows=args.eval_windows, calib_tokens=args.calib_tokens,
                                sq_alpha=args.sq_alpha)
    section = bench_quant(options, tick=lambda description: print(f"[bench] {description}", file=sys.stderr, flush=True))
    printing.print_section("quant", section, {})
    print(f"plot: {plot_quant(section, args.plot)}")
    print(f"reproduce: {_command_line()}")
    _dump(args.json, section)
    return 0


def _dump(path: Path | None, data: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def _command_line() -> str:
    """The command as typed (`ember bench ...`), for the report's 'reproduce' line."""
    argv = sys.argv[1:]
    if argv and argv[0] != "bench" and "bench" in argv:
        argv = argv[argv.index("bench") :]
    return "ember " + " ".join(shlex.quote(a) for a in argv)
