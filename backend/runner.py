"""Model runner: turns the scheduler's choice into one ForwardBatch, runs the model, samples.

Owns the cache tensors. Index tensors are built once per step on the host and copied over in one go;
the only device-to-host copy per step is the sampled rows' logits.
"""
from __future__ import annotations

import torch

from .block_pool import BlockPool
from .config import ModelConfig
from .model import ForwardBatch, InklingTextModel, KVCache, SeqKeys, SeqRows
from .sampling import sample_token
from .scheduler import ScheduledSeq, Scheduler


class ModelRunner:
    def __init__(self, cfg: ModelConfig, model: InklingTextModel, pool: BlockPool, scheduler: Scheduler,
                 max_num_seqs: int, dtype: torch.dtype, device: torch.device):
        self.cfg, self.model, self.pool, self.scheduler = cfg, model, pool, scheduler
        self.device = device
        self.block_size = pool.block_size
        self.kernel = cfg.conv_kernel_size
        self.cache = KVCache(cfg, pool.num_blocks, pool.block_size, max_num_seqs, dtype, device)

    def execute(self, scheduled: list[ScheduledSeq]) -> dict[str, torch.Tensor]:
        """Run one step; returns {request_id: fp32 logits row on the CPU} for sequences that sample."""
        self._init_conv_states(scheduled)
        batch = self.prepare(scheduled)
        hidden = self.model.forward(batch, self.cache)
        rows, ids = [], []
        for seq_rows, item in zip(batch.seqs, scheduled):
            if item.samples:
                rows.append(seq_rows.row_start + seq_rows.num_rows - 1)
                ids.append(item.seq.request_id)
        if not rows:
            return {}
        logits = self.model.logits(hidden[rows]).float().cpu()
        return dict(zip(ids, logits))

    def _init_conv_states(self, scheduled: list[ScheduledSeq]) -> None:
        for item in scheduled:
            if item.conv_init is False:
                continue
            for layer in self.cache.conv:
                for state in layer:
                    if item.conv_init is None:
                        state.running[item.seq.conv_slot].zero_()
                    else:
                        state.running[item.seq.conv_slot] = state.snapshots[item.conv_init]

    def prepare(self, scheduled: list[ScheduledSeq]) -> ForwardBatch:
        bs, K = self.block_size, self.kernel
        groups = self.scheduler.groups
        num_seqs = len(scheduled)
        token_ids, positions, seqs = [], [], []
        write_slots = {g: [] for g in groups}
        conv_window, conv_final, snapshot_rows, snapshot_slots = [], [], [], []
        row = 0
        for b, item in enumerate(scheduled):
            seq, n = item.seq, item.num_tokens
            start, end = seq.num_computed, seq.num_computed + n
            token_ids += seq.token_ids[start:end]
            positions += range(start, end)
            keys = {}
            for group in groups:
                table = seq.block_tables[group]
                write_slots[group] += [table[p // bs] * bs + p % bs for p in range(start, end)]
                first = self.scheduler._first_needed_block(group, start) * bs
                key_pos = torch.arange(first, end)
                block_ids = torch.tensor([t if t is not None else -1 for t in table], dtype=torch.long)
                key_slots = block_ids[key_pos // bs] * bs + key_pos % bs
                assert bool((key_slots >= 0).all()), "a visible key lies in a freed block"
                keys[group] = SeqKeys(key_slots.to(self.device), key_pos.to(self.device))
            seqs.append(SeqRows(row, n, keys))

            # conv stream of this sequence: K-1 state rows, then its n token rows
            def stream_row(u: int) -> int:
                return b * (K - 1) + u if u < K - 1 else num_seqs * (K - 1) + row + u - (K - 1)
            conv_window += [[stream_row(j + t) for t in range(K)] for j in range(n)]
            conv_final.append([stream_row(n + t) for t in range(K - 1)])
            anchor = seq.block_tables[groups[0]]
            for boundary in range((start // bs + 1) * bs, end + 1, bs):   # block ends crossed this step
                j = boundary - start                                       # tokens of this step before it
                snapshot_rows.append([stream_row(j + t) for t in range(K - 1)])
                snapshot_slots.append(anchor[boundary // bs - 1])
            row += n

        def as_tensor(values, shape=None):
            t = torch.tensor(values, dtype=torch.long)
            return (t.view(shape) if shape else t).to(self.device)
        return ForwardBatch(
            token_ids=as_tensor(token_ids), positions=as_tensor(positions), seqs=tuple(seqs),
            write_slots={g: as_tensor(v) for g, v in write_slots.items()},
            conv_slots=as_tensor([item.seq.conv_slot for item in scheduled]),
            conv_window=as_tensor(conv_window, (-1, K)), conv_final=as_tensor(conv_final, (-1, K - 1)),
            snapshot_rows=as_tensor(snapshot_rows, (-1, K - 1)), snapshot_slots=as_tensor(snapshot_slots))
