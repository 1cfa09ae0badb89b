"""The model runner: turns a scheduler plan into one flat forward pass, then samples."""

from __future__ import annotations

import contextlib
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from ember.config.model import ModelConfig
from ember.engine.bad_words import banned_by_bad_words
from ember.engine.cuda_graphs import DecodeGraphs, GraphSettings
from ember.engine.lora import AdapterPool
from ember.engine.request import Sequence
from ember.engine.scheduler import ScheduledSequence, SchedulerOutput
from ember.kv.cache_manager import KVCacheManager
from ember.kv.specs import FullAttentionSpec, KVCacheLayout
from ember.kv.tensors import KVCacheTensors
from ember.layers.attention import AttentionMetadata, DecodeRows, PrefillSegment
from ember.layers.cpu_attention import PagedBatch
from ember.layers.rejection_sampler import DraftRow, RejectionSampler, greedy_tree_path
from ember.layers.sampler import SampledToken, Sampler, SamplingRow, row_argmax
from ember.models.causal_lm import CausalLM

if TYPE_CHECKING:
    from ember.parallel.driver import WorkerGroup


@dataclass
class StepResult:
    """What one forward pass produced: the new tokens of each sampling sequence, prompt logprobs.

    A sequence without drafted tokens gets one token; one with drafts gets its kept drafts and
    the token drawn after them.
    """

    sampled: dict[str, list[SampledToken]]
    prompt_logprobs: dict[str, list[SampledToken]]
    last_hidden: dict[str, LastHidden] = field(default_factory=dict)  # only from a runner that keeps them
    embeddings: dict[str, list[float]] = field(default_factory=dict)  # `embed` sequences whose prompt is computed


@dataclass
class LastHidden:
    """The target's final hidden state at `position`: the one whose logits gave the sequence's newest token.

    It is current while the sequence's KV covers exactly the tokens up to `position`
    (`num_computed_tokens == position + 1`); a Medusa proposer drafts from it.
    """

    position: int
    hidden: torch.Tensor


def kv_cache_bytes_per_block(
    config: ModelConfig, block_size: int, dtype: torch.dtype, layout: KVCacheLayout | None = None
) -> int:
    """Bytes one block takes in every layer's caches (from `layout` when the model has one)."""
    element = torch.empty((), dtype=dtype).element_size()
    if layout is not None:
        return layout.bytes_per_block(block_size, element)
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def verifies_trees(layout: KVCacheLayout, workers: WorkerGroup | None) -> bool:
    """Whether a runner may score a tree of drafts: one group of full-attention layers in this process (a tree's
    nodes are masked by ancestry and its kept path is moved into place, which only that layout does here)."""
    return (
        workers is None
        and layout.group_windows == (None,)
        and all(isinstance(spec, FullAttentionSpec) for spec in layout.specs)
    )


class ModelRunner:
    """Owns the model and its per-layer KV caches; executes steps.

    With `workers` (tensor parallel), the model is rank 0's shard: each step's inputs are
    broadcast to the worker ranks before rank 0 runs its own part, and so is every logits call.
    """

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        kv: KVCacheManager,
        sampler: Sampler,
        eos_ids: frozenset[int],
        rejection_sampler: RejectionSampler | None = None,
        workers: WorkerGroup | None = None,
        cache_dtype: torch.dtype | None = None,
        keeps_last_hidden: bool = False,
        adapters: AdapterPool | None = None,
        device: torch.device | None = None,
        graphs: GraphSettings | None = None,
    ) -> None:
        """`kv`: the cache manager whose block ids each plan carries (it must keep a table per layer group of the model).
        `cache_dtype` None: the KV cache takes the model's parameter dtype. `keeps_last_hidden`: each
        step's result carries the hidden state behind every sequence's newest token (a Medusa proposer's input).
        `adapters`: the LoRA adapter pool installed on `model` (None: no adapters). `device` (None: the CPU): where the
        KV cache and each step's inputs live (the model's weights are already there). `graphs`: decode steps run
        through `DecodeGraphs` (one layer group, no workers, no adapters); the cache gets one scratch block more."""
        self.model = model
        self.adapters = adapters
        self.keeps_last_hidden = keeps_last_hidden
        self.block_size = block_size
        self.sampler = sampler
        self.rejection_sampler = rejection_sampler
        self.eos_ids = eos_ids
        self.workers = workers
        self.device = device or torch.device("cpu")
        held_layers = workers.held_layers if workers is not None else None
        scratch_blocks = 0 if graphs is None else 1  # block num_blocks: padding rows of a graph's step write there
        self.caches = KVCacheTensors(model, num_blocks + scratch_blocks, block_size, held_layers, cache_dtype, self.device)
        if workers is not None:
            workers.allocate_kv_cache(num_blocks, block_size, self.caches.dtype, self.caches.num_bytes)
        self.layout = self.caches.layout
        if tuple(kv.group_windows) != tuple(self.layout.group_windows):  # a table per layer group, or blocks go missing
            raise ValueError(f"the KV cache manager keeps tables for windows {kv.group_windows}, the model's layers need "
                             f"{tuple(self.layout.group_windows)}: build it with kv_cache_layout(model).group_windows")
        self.kv_caches = self.caches.layer_caches
        self.graphs = None if graphs is None else self._decode_graphs(graphs, num_blocks)
        self._mask_thread: ThreadPoolExecutor | None = None  # started at the first constrained step

    def _decode_graphs(self, settings: GraphSettings, scratch_block: int) -> DecodeGraphs:
        if self.workers is not None or self.adapters is not None or self.layout.group_windows != (None,):
            raise ValueError("decode graphs run one process's model with one layer group and no adapters")
        graphs = DecodeGraphs(self._model_forward, settings.sizes, settings.max_blocks_per_seq, self.block_size,
                              scratch_block, self.device)
        if settings.capture:
            with torch.inference_mode():
                graphs.capture()
        return graphs

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the engine allocated for KV (this rank's shard when tensor parallel)."""
        return self.caches.num_bytes

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> StepResult:
        with self._collectives():
            masks = self._prepare_masks(plan.scheduled)
            hidden = self._forward(plan)
            if masks is not None:
                masks.result()  # sampling reads the guides: the mask thread is done with them first
            return self._sample(plan.scheduled, hidden)

    def _prepare_masks(self, scheduled: list[ScheduledSequence]) -> Future | None:
        """Start computing the next-token mask of every constrained sequence this step samples, on the mask thread,
        so it overlaps the forward pass (None: no sequence is constrained)."""
        guides = [item.seq.guide for item in scheduled if item.seq.guide is not None and item.samples and item.draft is None]
        if not guides:
            return None
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-masks")
        return self._mask_thread.submit(_prepare_all, guides)

    def close(self) -> None:
        """Stop the mask thread, if one was started."""
        if self._mask_thread is not None:
            self._mask_thread.shutdown()
            self._mask_thread = None

    @torch.inference_mode()
    def last_position_logits(self, plan: SchedulerOutput) -> torch.Tensor:
        """Logits [len(plan.scheduled), vocab] at each scheduled sequence's last new token (a draft model's step)."""
        hidden = self._forward(plan)
        ends = torch.tensor([item.num_new_tokens for item in plan.scheduled]).cumsum(0)
        return self._logits(hidden[ends - 1])

    @torch.inference_mode()
    def hidden_states(self, plan: SchedulerOutput) -> torch.Tensor:
        """Final hidden states [plan.num_batched_tokens, hidden] of every scheduled token (training Medusa heads)."""
        return self._forward(plan)

    @torch.inference_mode()
    def all_logits(self, plan: SchedulerOutput) -> torch.Tensor:
        """Logits [plan.num_batched_tokens, vocab] of every scheduled token, samples none (parity checks)."""
        with self._collectives():
            return self._logits(self._forward(plan))

    def _collectives(self) -> contextlib.AbstractContextManager:
        """Where the ranks talk: a broken group surfaces as WorkerFailedError naming the rank."""
        return self.workers.failures() if self.workers is not None else contextlib.nullcontext()

    def _forward(self, plan: SchedulerOutput) -> torch.Tensor:
        if self.graphs is not None and _decodes_only(plan.scheduled) and self.graphs.holds(
                len(plan.scheduled), [item.block_ids[0] for item in plan.scheduled]):
            return self._graph_forward(plan)
        input_ids, positions, metadata = self._prepare(plan.scheduled)
        if self.workers is not None:
            self.workers.forward(plan.block_copies, input_ids, positions, metadata)
        self.caches.copy_blocks(plan.block_copies)
        if self.adapters is not None:
            self.adapters.prepare_step([item.seq.request.asked.lora_request for item in plan.scheduled
                                        for _ in range(item.num_new_tokens)])
        if self.device.type != "cpu":  # one move per step, not one per layer
            input_ids, positions = input_ids.to(self.device), positions.to(self.device)
            metadata = _metadata_on(metadata, self.device)
        return self._model_forward(input_ids, positions, metadata)

    def _model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, self.kv_caches, metadata)

    def _graph_forward(self, plan: SchedulerOutput) -> torch.Tensor:
        """A decode-only step through the decode graphs (their static buffers are filled from the plan directly)."""
        size = self.block_size
        positions = [item.seq.num_computed_tokens for item in plan.scheduled]
        tables = [item.block_ids[0] for item in plan.scheduled]
        slots = [table[position // size] * size + position % size for table, position in zip(tables, positions, strict=True)]
        self.caches.copy_blocks(plan.block_copies)
        assert self.graphs is not None
        return self.graphs.run([item.new_token_ids[0] for item in plan.scheduled], positions, slots, tables)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.workers is not None:
            self.workers.compute_logits(hidden)
        return self.model.compute_logits(hidden)

    def _prepare(self, scheduled: list[ScheduledSequence]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Token ids, their model positions, and the attention metadata. A tree's nodes sit in consecutive cache slots
        but take the position of their depth (siblings share one)."""
        token_ids: list[int] = []
        model_positions: list[int] = []
        spans: list[range] = []  # each sequence's cache positions this step
        for item in scheduled:
            first = item.seq.num_computed_tokens
            token_ids.extend(item.new_token_ids)
            span = range(first, first + item.num_new_tokens)
            spans.append(span)
            if item.draft is not None and item.draft.is_tree:
                own = item.num_new_tokens - item.num_draft_tokens
                model_positions.extend([*range(first, first + own), *(first + own - 1 + d for d in item.draft.depths())])
            else:
                model_positions.extend(span)
        groups = [
            self._group_metadata(scheduled, spans, group, window)
            for group, window in enumerate(self.layout.group_windows)
        ]
        metadata = groups[0]
        metadata.other_groups = tuple(groups[1:])
        return torch.tensor(token_ids, dtype=torch.long), torch.tensor(model_positions, dtype=torch.long), metadata

    def _group_metadata(
        self, scheduled: list[ScheduledSequence], spans: list[range], group: int, window: int | None
    ) -> AttentionMetadata:
        """Slots, prefill segments and the decode batch over one layer group's block tables (built from Python
        lists, a tensor each at the end: a decode step's metadata is a handful of numbers per sequence)."""
        size = self.block_size
        slots: list[int] = []
        prefills: list[PrefillSegment] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        decode_first_blocks: list[int] = []
        tables: list[list[int]] = []
        start = 0
        for item, span in zip(scheduled, spans, strict=True):
            count, first = item.num_new_tokens, span.start
            block_ids = item.block_ids[group]
            tables.append(block_ids)
            slots.extend(block_ids[position // size] * size + position % size for position in span)
            if count == 1:
                # A window only reaches back to the block holding position first - window + 1.
                first_block = 0 if window is None else max(0, first - window + 1) // size
                decode_rows.append(start)
                decode_tables.append(block_ids[first_block:])
                decode_lens.append(first + 1)
                decode_first_blocks.append(first_block)
            else:
                masks = _span_masks(item)
                prefills.append(PrefillSegment(start, start + count, first + count, torch.tensor(block_ids, dtype=torch.long),
                                               None if masks is None else torch.tensor(masks, dtype=torch.long)))
            start += count
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            prefills=prefills,
            decode_rows=DecodeRows(decode_rows, decode_tables, decode_lens, decode_first_blocks, size, window)
            if decode_rows else None,
            sliding_window=window,
            paged=_paged_batch(scheduled, tables),
        )

    def _sample(self, scheduled: list[ScheduledSequence], hidden: torch.Tensor) -> StepResult:
        ends = list(itertools.accumulate(item.num_new_tokens for item in scheduled))
        finishing = [(i, item.seq) for i, item in enumerate(scheduled) if item.samples and item.draft is None]
        sampling = [(i, seq) for i, seq in finishing if not seq.params.embed]
        result = StepResult(sampled={}, prompt_logprobs={}, embeddings=_pooled(hidden, ends, finishing))
        if sampling:
            rows = [ends[i] - 1 for i, _ in sampling]
            # the rows are distinct and ascending: as many as the batch has is every row, in order (a decode step)
            logits = self._logits(hidden if len(rows) == hidden.shape[0] else hidden[torch.tensor(rows)])
            tokens = self.sampler(logits, [self._sampling_row(seq) for _, seq in sampling])
            result.sampled = {seq.seq_id: [token] for (_, seq), token in zip(sampling, tokens, strict=True)}
            if self.keeps_last_hidden:
                result.last_hidden = {
                    seq.seq_id: LastHidden(seq.num_computed_tokens + scheduled[i].num_new_tokens - 1, hidden[int(row)].clone())
                    for (i, seq), row in zip(sampling, rows, strict=True)
                }
        result.sampled.update(self._verify(scheduled, hidden, ends, result.last_hidden))
        for i, item in enumerate(scheduled):
            if item.seq.params.prompt_logprobs is not None and item.seq.index == 0:
                start = ends[i] - item.num_new_tokens
                result.prompt_logprobs[item.seq.seq_id] = self._prompt_logprobs(item, hidden[start : ends[i]])
        return result

    def _verify(
        self, scheduled: list[ScheduledSequence], hidden: torch.Tensor, ends: list[int], last_hidden: dict[str, LastHidden]
    ) -> dict[str, list[SampledToken]]:
        """Score each drafted sequence's K+1 positions (its last token, then its drafts) and keep what the target agrees to.

        A tree of drafts is first narrowed to the path greedy decoding takes through it, which is then verified
        as a chain; the path's keys and values move to the slots its positions own. With `keeps_last_hidden`,
        `last_hidden` gets the hidden state at the position that drew each final token."""
        verifying = [(ends[i], item) for i, item in enumerate(scheduled) if item.draft is not None]
        if not verifying:
            return {}
        assert self.rejection_sampler is not None, "drafted tokens scheduled on a runner without a rejection sampler"
        rows = torch.cat([torch.arange(end - item.num_draft_tokens - 1, end) for end, item in verifying])
        logits = self._logits(hidden[rows]).split([item.num_draft_tokens + 1 for _, item in verifying])
        chains = [_held_to_guide(item.seq, *_as_chain(item.draft, row_logits)) for (_, item), row_logits in zip(verifying, logits, strict=True)]
        tokens = self.rejection_sampler(
            [chain_logits for _, chain_logits, _ in chains], [self._sampling_row(item.seq) for _, item in verifying],
            [chain for _, _, chain in chains],
        )
        for (end, item), row_tokens, (nodes, _, _) in zip(verifying, tokens, chains, strict=True):
            self._keep(item, end, nodes[: len(row_tokens) - 1], hidden, last_hidden)
        return {item.seq.seq_id: row_tokens for (_, item), row_tokens in zip(verifying, tokens, strict=True)}

    def _keep(self, item: ScheduledSequence, end: int, kept_nodes: list[int], hidden: torch.Tensor,
              last_hidden: dict[str, LastHidden]) -> None:
        """After verification of `item` (rows ending at `end`), which kept drafted nodes `kept_nodes`: a tree's kept
        path moves into place, and the hidden state that drew the final token is kept if the runner keeps them."""
        own = item.num_new_tokens - item.num_draft_tokens  # the sequence's own tokens scored before the drafts
        if item.draft.is_tree:
            self._move_kv(item.block_ids[0], item.seq.num_computed_tokens + own, kept_nodes)
        if self.keeps_last_hidden:
            root = end - item.num_draft_tokens - 1  # the row of the sequence's own last token
            row = root + 1 + kept_nodes[-1] if kept_nodes else root
            position = item.seq.num_computed_tokens + own - 1 + len(kept_nodes)
            last_hidden[item.seq.seq_id] = LastHidden(position, hidden[row].clone())

    def _move_kv(self, block_ids: list[int], first_node: int, kept_nodes: list[int]) -> None:
        """Copy the keys and values of a tree's kept path (node j sits at cache position first_node + j) to the
        positions first_node, first_node + 1, ... that its tokens now hold. Node j's depth is at most j + 1, so a
        destination never overwrites a source still to be read."""
        moves = [(first_node + j, first_node + d) for d, j in enumerate(kept_nodes) if j != d]
        if not moves:
            return
        table = torch.tensor(block_ids, dtype=torch.long)
        positions = torch.tensor(moves, dtype=torch.long)
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        for cache in self.caches.tensors:
            flat = cache.view(2, -1, *cache.shape[3:])
            flat[:, slots[:, 1]] = flat[:, slots[:, 0]]

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        params = seq.params
        banned = banned_by_bad_words(seq.request.bad_word_ids, seq.output_token_ids) if seq.request.bad_word_ids else set()
        if seq.num_output_tokens < params.min_tokens:
            banned |= set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        return SamplingRow(params, seq.token_ids[: seq.num_prompt_tokens], seq.output_token_ids, seq.generator,
                           tuple(sorted(banned)), seq.guide)  # fmt: skip

    def _prompt_logprobs(self, item: ScheduledSequence, hidden: torch.Tensor) -> list[SampledToken]:
        """Logprob, rank and top alternatives of each next prompt token predicted inside this chunk."""
        seq = item.seq
        first = seq.num_computed_tokens
        last = min(first + item.num_new_tokens, seq.num_prompt_tokens - 1)
        if last <= first:
            return []
        logprobs = torch.log_softmax(self._logits(hidden[: last - first]).float(), dim=-1)
        targets = torch.tensor(seq.token_ids[first + 1 : last + 1], device=logprobs.device)
        chosen = logprobs.gather(1, targets.unsqueeze(1))
        ranks = (logprobs > chosen).sum(dim=1) + 1
        num_top = seq.params.prompt_logprobs or 0
        top_values, top_ids = logprobs.topk(num_top, dim=1) if num_top else (None, None)
        return [
            SampledToken(
                token_id=int(targets[j]),
                logprob=float(chosen[j, 0]),
                rank=int(ranks[j]),
                top_token_ids=top_ids[j].tolist() if top_ids is not None else [],
                top_logprobs=top_values[j].tolist() if top_values is not None else [],
            )
            for j in range(last - first)
        ]


def _decodes_only(scheduled: list[ScheduledSequence]) -> bool:
    """Whether every scheduled sequence computes exactly one token, drafting none (a step decode graphs can run)."""
    return all(item.num_new_tokens == 1 and item.draft is None for item in scheduled)


def _metadata_on(metadata: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """The step's metadata with the tensors the kernels read moved to `device` (every layer group's; the prefill
    segments' block tables stay on the host: only the torch fallback reads them, and it indexes from there)."""
    paged = metadata.paged
    if paged is not None:
        paged = replace(paged, block_tables=paged.block_tables.to(device), query_starts=paged.query_starts.to(device),
                        query_counts=paged.query_counts.to(device), context_lens=paged.context_lens.to(device),
                        span_masks=None if paged.span_masks is None else paged.span_masks.to(device))
    return replace(metadata, slot_mapping=metadata.slot_mapping.to(device), paged=paged,
                   other_groups=tuple(_metadata_on(group, device) for group in metadata.other_groups))


def _as_chain(draft: DraftRow, logits: torch.Tensor) -> tuple[list[int], torch.Tensor, DraftRow]:
    """A tree narrowed to the path greedy decoding takes through it: the path's nodes, the logits rows that score
    it (the sequence's newest token's first) and the chain of its tokens. A chain stays as it is."""
    if not draft.is_tree:
        return list(range(len(draft.token_ids))), logits, draft
    path = greedy_tree_path(row_argmax(logits), draft)
    return path, logits[[0, *(j + 1 for j in path)]], DraftRow([draft.token_ids[j] for j in path])


def _prepare_all(guides: list) -> None:
    for guide in guides:
        guide.prepare_mask()


def _held_to_guide(seq: Sequence, nodes: list[int], logits: torch.Tensor, chain: DraftRow) -> tuple[list[int], torch.Tensor, DraftRow]:
    """A chain's scoring logits held, row by row, to the sequence's output constraint (when it has one)."""
    return nodes, logits if seq.guide is None else seq.guide.hold_drafts(logits, chain.token_ids, seq.params.is_greedy), chain


def _pooled(hidden: torch.Tensor, ends: list[int], finishing: list[tuple[int, Sequence]]) -> dict[str, list[float]]:
    """The embedding of each `embed` sequence whose prompt this step finished: its last row of final hidden states,
    L2-normalised (vLLM's last-token pooling of a decoder model)."""
    rows = {seq.seq_id: ends[i] - 1 for i, seq in finishing if seq.params.embed}
    if not rows:
        return {}
    pooled = torch.nn.functional.normalize(hidden[torch.tensor(list(rows.values()))].float(), dim=-1)
    return dict(zip(rows, pooled.tolist(), strict=True))


def _span_masks(item: ScheduledSequence) -> list[int] | None:
    """The attention masks of a tree-drafted sequence's rows (`PagedBatch.span_masks`); None for any other."""
    if item.draft is None or not item.draft.is_tree:
        return None
    # The scheduler drafts only for a sequence with one uncomputed token: the tree's root is bit 0.
    assert item.num_new_tokens == item.num_draft_tokens + 1
    # A row that sees every earlier row of the span (the root, the first chain) is plain causal: -1 lets the
    # kernel read it in one run per block, as a decode step does, so its bits are the decode step's.
    return [-1 if mask == (1 << (i + 1)) - 1 else mask for i, mask in enumerate(item.draft.span_masks())]


def _paged_batch(scheduled: list[ScheduledSequence], tables: list[list[int]]) -> PagedBatch:
    """The step's sequences as the fused attention op reads them (tables padded with -1)."""
    counts = [item.num_new_tokens for item in scheduled]
    starts = [0, *itertools.accumulate(counts)][:-1]
    width = max(len(table) for table in tables)
    masks = [_span_masks(item) for item in scheduled]
    lens = [item.seq.num_computed_tokens + item.num_new_tokens for item in scheduled]
    per_sequence = torch.tensor([starts, counts, lens], dtype=torch.int32)  # one tensor, three contiguous rows
    return PagedBatch(
        block_tables=torch.tensor([[*table, *[-1] * (width - len(table))] for table in tables], dtype=torch.int32),
        query_starts=per_sequence[0],
        query_counts=per_sequence[1],
        context_lens=per_sequence[2],
        max_query_count=max(counts),
        span_masks=None if all(m is None for m in masks) else torch.tensor(
            [bits for item, m in zip(scheduled, masks, strict=True) for bits in (m or [-1] * item.num_new_tokens)],
            dtype=torch.long,
        ),
    )
