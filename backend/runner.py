"""Model runner: turns the scheduler's choice into ForwardBatches, runs the backbone and the MTP
heads, and keeps the cache consistent with what was accepted.

Index tensors are built once per step on the host and copied over in one go; the device-to-host
copies per step are the logits rows that are sampled or verified.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .block_pool import BlockPool
from .config import ModelConfig
from .model import MAX_CANDIDATES, ForwardBatch, InklingTextModel, KVCache, SeqKeys, SeqRows
from .mtp import MTP_GROUP, MTP_SLIDING_GROUP, MtpHeads
from .request import Sequence
from .sampling import filtered_probs
from .scheduler import ScheduledSeq, Scheduler

HIDDEN_HISTORY = 8   # backbone hidden states kept per sequence: the MTP window reaches k-1 <= 7 back


@dataclass(frozen=True)
class RowPlan:
    """One sequence's rows in a ForwardBatch."""
    seq: Sequence
    token_ids: list[int]
    start: int                          # cache position of the first row
    key_groups: dict[str, str]          # attention group -> block-table group it reads
    key_floors: dict[str, int]          # attention group -> first visible key position
    first_candidate: int                # conv-state candidates: after j rows, first_candidate <= j <= rows
    snapshot_table: list | None         # where block-boundary conv snapshots go (None: no snapshots)


@dataclass(frozen=True)
class StepRows:
    """Where a sequence's rows sit in this step's backbone output, and what was verified."""
    seq: Sequence
    row: int                            # its first row in the step's hidden states
    start: int                          # cache position of that row
    verified_end: int                   # positions below this are now computed and verified
    drafting: bool                      # it sampled this step, so drafts for the next step are wanted


@dataclass
class MtpDrafts:
    draft_ids: list[int]
    logits: torch.Tensor                # [k, V] fp32, CPU: each draft position's logits
    probs: torch.Tensor | None          # [k, V] the distribution drafts were sampled from (None: greedy)


class ModelRunner:
    def __init__(self, cfg: ModelConfig, model: InklingTextModel, mtp: MtpHeads | None, pool: BlockPool,
                 scheduler: Scheduler, max_num_seqs: int, dtype: torch.dtype, device: torch.device,
                 num_mtp_positions: int = 0):
        self.cfg, self.model, self.mtp, self.pool, self.scheduler = cfg, model, mtp, pool, scheduler
        self.device = device
        self.block_size = pool.block_size
        self.kernel = cfg.conv_kernel_size
        self.cache = KVCache(cfg, pool.num_blocks, pool.block_size, max_num_seqs, dtype, device, num_mtp_positions)
        self.hidden_history = torch.zeros(max_num_seqs, HIDDEN_HISTORY, cfg.hidden_size, dtype=dtype, device=device)

    # -- the backbone ------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward the scheduled tokens. Returns (hidden [T, H], {request_id: fp32 CPU logits of the
        rows to sample or verify, [num_drafts + 1, V]})."""
        self._init_conv_states(scheduled)
        plans = []
        for item in scheduled:
            seq = item.seq
            start = seq.num_computed
            fed = seq.token_ids[start:] [:item.num_tokens - item.num_drafts] + seq.draft_ids[:item.num_drafts]
            groups = self.scheduler.groups
            plans.append(RowPlan(seq, fed, start, {g: g for g in groups},
                                 {g: self.scheduler.first_needed_block(seq, g, start) * self.block_size
                                  for g in groups},
                                 item.num_tokens - item.num_drafts, seq.block_tables[groups[0]]))
        batch = self.build_batch(plans)
        hidden = self.model.forward(batch, self.cache, self._inputs_embeds(batch, plans))
        rows, ids, row = [], [], 0
        for item in scheduled:
            if item.samples:
                last = row + item.num_tokens
                rows.append(torch.arange(last - item.num_drafts - 1, last))
                ids.append((item.seq.request_id, item.num_drafts + 1))
            row += item.num_tokens
        if not rows:
            return hidden, {}
        logits = self.model.logits(hidden[torch.cat(rows).to(self.device)]).float().cpu()
        return hidden, dict(zip((i for i, _ in ids), logits.split([n for _, n in ids])))

    def _inputs_embeds(self, batch: ForwardBatch, plans: list[RowPlan]) -> torch.Tensor | None:
        """Token embeddings with image/audio rows put in place of their placeholders (None: no media)."""
        rows, sources, embeds = [], [], []
        for plan, seq_rows in zip(plans, batch.seqs):
            media = plan.seq.media_rows(plan.start, plan.start + len(plan.token_ids))
            if media:
                base = sum(len(e) for e in embeds)
                rows += [seq_rows.row_start + p - plan.start for p, _ in media]
                sources += [base + r for _, r in media]
                embeds.append(plan.seq.media_embeds)
        if not rows:
            return None
        x = self.model.embed(batch.token_ids)
        x[torch.tensor(rows, device=self.device)] = torch.cat(embeds)[torch.tensor(sources, device=self.device)]
        return x

    def commit_conv(self, scheduled: list[ScheduledSeq], kept: list[int]) -> None:
        """Each sequence keeps its first `kept` fed tokens: conv states roll back to there."""
        slots = torch.tensor([item.seq.conv_slot for item in scheduled], dtype=torch.long)
        chosen = torch.tensor([item.seq.conv_slot * MAX_CANDIDATES + n - (item.num_tokens - item.num_drafts)
                               for item, n in zip(scheduled, kept)], dtype=torch.long)
        KVCache.commit_conv(self.cache.layers, slots.to(self.device), chosen.to(self.device))

    def record_hidden(self, steps: list[StepRows], hidden: torch.Tensor) -> None:
        """Keep the last HIDDEN_HISTORY verified backbone hidden states of each sequence (MTP input)."""
        slots, index, rows = [], [], []
        for step in steps:
            for p in range(max(step.start, step.verified_end - HIDDEN_HISTORY), step.verified_end):
                slots.append(step.seq.conv_slot)
                index.append(p % HIDDEN_HISTORY)
                rows.append(step.row + p - step.start)
        if rows:
            as_t = lambda v: torch.tensor(v, dtype=torch.long, device=self.device)  # noqa: E731
            self.hidden_history[as_t(slots), as_t(index)] = hidden[as_t(rows)]

    def _init_conv_states(self, scheduled: list[ScheduledSeq]) -> None:
        for item in scheduled:
            if item.conv_init is False:
                continue
            slot = item.seq.conv_slot
            for layer in self.cache.layers:
                for state in layer.conv:
                    if item.conv_init is None:
                        state.running[slot].zero_()
                    else:
                        state.running[slot] = state.snapshots[item.conv_init]
            for layer in self.cache.mtp_layers:   # MTP caches start empty, also after a reused prefix
                for state in layer.conv:
                    state.running[slot].zero_()

    # -- MTP drafts -------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose_mtp(self, steps: list[StepRows], hidden: torch.Tensor) -> dict[str, MtpDrafts]:
        """Advance each MTP sequence's draft caches to its verified frontier and, for sequences that
        just sampled, chain k draft positions from the new token. `hidden` is this step's backbone
        output; `steps` says where each sequence's rows are in it."""
        bs = self.block_size
        work = []   # (step, start, end, frontier)
        for step in steps:
            seq = step.seq
            k, committed = seq.spec.num_tokens, len(seq.token_ids)
            # entry i at draft position j reads token i+j+1: without a fresh sample, stop where that
            # is still a committed token for every j < k
            end = step.verified_end if step.drafting else min(step.verified_end, committed - k)
            start = seq.mtp_frontier
            if end > start:
                work.append((step, start, end, max(start, min(end, committed - k))))
        if not work:
            return {}
        plans = []
        for step, start, end, frontier in work:
            floors = {MTP_GROUP: step.seq.mtp_first_entry,
                      MTP_SLIDING_GROUP: max(step.seq.mtp_first_entry,
                                             max(0, start - self.cfg.sliding_window + 1) // bs * bs)}
            plans.append(RowPlan(step.seq, [0] * (end - start), start,
                                 {MTP_GROUP: MTP_GROUP, MTP_SLIDING_GROUP: MTP_GROUP}, floors, frontier - start, None))
        batch = self.build_batch(plans, single_candidate=True)
        # backbone states of entries [start, end): this step's rows, or the history for earlier positions
        stacked = torch.cat([self.hidden_history.flatten(0, 1), hidden])
        gather = []
        for step, start, end, _ in work:
            for p in range(start, end):
                if p >= step.start:
                    gather.append(self.hidden_history.shape[0] * HIDDEN_HISTORY + step.row + p - step.start)
                else:
                    assert p >= step.start - HIDDEN_HISTORY, "MTP input older than the kept history"
                    gather.append(step.seq.conv_slot * HIDDEN_HISTORY + p % HIDDEN_HISTORY)
        h = stacked[torch.tensor(gather, device=self.device)]
        last_rows = (torch.tensor([end - start for _, start, end, _ in work]).cumsum(0) - 1).tolist()
        raw_rows = torch.tensor([step.seq.spec.mtp_embedding == "transformers"
                                 for step, start, end, _ in work for _ in range(start, end)], device=self.device)
        slots = torch.tensor([step.seq.conv_slot for step, *_ in work], device=self.device)
        drafts = {step.seq.request_id: [] for step, *_ in work}
        logits_out = {step.seq.request_id: [] for step, *_ in work}
        probs_out = {step.seq.request_id: [] for step, *_ in work}
        for j in range(max(step.seq.spec.num_tokens for step, *_ in work)):
            token_ids = []
            for step, start, end, _ in work:
                seq = step.seq
                committed = len(seq.token_ids)
                own = drafts[seq.request_id]
                for i in range(start, end):
                    t = i + j + 1
                    # past this request's k the position runs only because others in the batch need it:
                    # its output is never read, so any token will do
                    token_ids.append(seq.token_ids[t] if t < committed else own[t - committed]
                                     if t - committed < len(own) else 0)
            ids = torch.tensor(token_ids, device=self.device)
            embeds = torch.where(raw_rows[:, None], self.model.embed_table[ids], self.model.embed(ids))
            h = self.mtp.forward_position(j, h, embeds, replace(batch, token_ids=ids, position_offset=j + 1),
                                          self.cache.mtp_layers[j])
            KVCache.commit_conv([self.cache.mtp_layers[j]], slots, slots * MAX_CANDIDATES)
            drafting = [(step.seq, row) for (step, *_), row in zip(work, last_rows)
                        if step.drafting and j < step.seq.spec.num_tokens]
            if not drafting:
                continue
            logits = self.model.logits(h[torch.tensor([row for _, row in drafting], device=self.device)])
            for (seq, _), row_logits in zip(drafting, logits.float().cpu()):
                if seq.sampling.temperature == 0.0:
                    token = int(row_logits.argmax())
                else:
                    q = filtered_probs(row_logits, seq.sampling)
                    token = int(torch.multinomial(q, 1, generator=seq.generator))
                    probs_out[seq.request_id].append(q)
                drafts[seq.request_id].append(token)
                logits_out[seq.request_id].append(row_logits)
        for step, start, end, frontier in work:
            step.seq.mtp_frontier = frontier
        return {step.seq.request_id: MtpDrafts(drafts[step.seq.request_id], torch.stack(logits_out[step.seq.request_id]),
                                               torch.stack(probs_out[step.seq.request_id])
                                               if probs_out[step.seq.request_id] else None)
                for step, *_ in work if step.drafting}

    # -- batches ----------------------------------------------------------------------------------
    def build_batch(self, plans: list[RowPlan], single_candidate: bool = False) -> ForwardBatch:
        bs, K = self.block_size, self.kernel
        num_seqs = len(plans)
        token_ids, positions, seqs = [], [], []
        write_slots = {g: [] for g in plans[0].key_groups}
        conv_window, cand_rows, cand_slots, snapshot_rows, snapshot_slots = [], [], [], [], []
        row = 0
        for b, plan in enumerate(plans):
            n, start, end = len(plan.token_ids), plan.start, plan.start + len(plan.token_ids)
            token_ids += plan.token_ids
            positions += range(start, end)
            keys = {}
            for group, table_group in plan.key_groups.items():
                table = plan.seq.block_tables[table_group]
                write_slots[group] += [table[p // bs] * bs + p % bs for p in range(start, end)]
                key_pos = torch.arange(plan.key_floors[group], end)
                block_ids = torch.tensor([t if t is not None else -1 for t in table], dtype=torch.long)
                key_slots = block_ids[key_pos // bs] * bs + key_pos % bs
                assert bool((key_slots >= 0).all()), "a visible key lies in a freed block"
                keys[group] = SeqKeys(key_slots.to(self.device), key_pos.to(self.device))
            seqs.append(SeqRows(row, n, keys))

            # conv stream of this sequence: K-1 state rows, then its n token rows
            def stream_row(u: int) -> int:
                return b * (K - 1) + u if u < K - 1 else num_seqs * (K - 1) + row + u - (K - 1)
            conv_window += [[stream_row(j + t) for t in range(K)] for j in range(n)]
            last = plan.first_candidate if single_candidate else n
            for c, j in enumerate(range(plan.first_candidate, last + 1)):
                cand_rows.append([stream_row(j + t) for t in range(K - 1)])
                cand_slots.append(plan.seq.conv_slot * MAX_CANDIDATES + c)
            if plan.snapshot_table is not None:
                for boundary in range((start // bs + 1) * bs, end + 1, bs):   # block ends crossed this step
                    j = boundary - start
                    snapshot_rows.append([stream_row(j + t) for t in range(K - 1)])
                    snapshot_slots.append(plan.snapshot_table[boundary // bs - 1])
            row += n

        def as_tensor(values, shape=None):
            t = torch.tensor(values, dtype=torch.long)
            return (t.view(shape) if shape else t).to(self.device)
        return ForwardBatch(
            token_ids=as_tensor(token_ids), positions=as_tensor(positions), seqs=tuple(seqs),
            write_slots={g: as_tensor(v) for g, v in write_slots.items()},
            conv_slots=as_tensor([plan.seq.conv_slot for plan in plans]),
            conv_window=as_tensor(conv_window, (-1, K)),
            candidate_rows=as_tensor(cand_rows, (-1, K - 1)), candidate_slots=as_tensor(cand_slots),
            snapshot_rows=as_tensor(snapshot_rows, (-1, K - 1)), snapshot_slots=as_tensor(snapshot_slots))
