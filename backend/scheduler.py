"""Continuous batching: who runs this step and with how many tokens.

Every sequence is fed the tokens it has not computed yet: a whole or chunked prompt, a recompute
after preemption, or the one token sampled last step. A token budget per step caps prefill chunks so
long prompts do not stall everyone's decoding. When the pool runs dry the newest running sequence is
preempted (its blocks freed, recomputed later).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_pool import FULL, SLIDING, BlockPool, chain_hash
from .mtp import MTP_GROUP
from .request import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_tokens: int                 # tokens fed this step, from seq.num_computed
    conv_init: int | None | bool    # False: state carries on; None: start from zeros; int: snapshot block id
    samples: bool                   # this step reaches the last committed token, so the next one is sampled
    num_drafts: int = 0             # of the fed tokens, how many are drafts to verify (the last ones)


class Scheduler:
    def __init__(self, pool: BlockPool, groups: tuple[str, ...], sliding_window: int, max_num_seqs: int,
                 max_batched_tokens: int, has_mtp: bool = False):
        self.has_mtp = has_mtp
        self.pool = pool
        self.block_size = pool.block_size
        self.groups = groups
        self.window = sliding_window
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_conv_slots = list(range(max_num_seqs))
        self.num_preemptions = 0

    # -- capacity -------------------------------------------------------------------------------
    def max_tokens_per_sequence(self) -> int:
        """The longest sequence the pool can ever hold alone."""
        window_blocks = -(-self.window // self.block_size) + 1 + -(-self.max_batched_tokens // self.block_size)
        growing_groups = (FULL in self.groups) + self.has_mtp   # groups whose tables grow with the sequence
        if not growing_groups:
            return 1 << 62
        spare = self.pool.num_blocks - (window_blocks if SLIDING in self.groups else 0)
        return max(spare, 0) // growing_groups * self.block_size

    def groups_of(self, seq: Sequence) -> tuple[str, ...]:
        return self.groups + ((MTP_GROUP,) if seq.uses_mtp else ())

    def first_needed_block(self, seq: Sequence, group: str, first_pos: int) -> int:
        """Lowest block index the queries from `first_pos` on still read in this group."""
        if group == SLIDING:
            return max(0, first_pos - self.window + 1) // self.block_size
        if group == MTP_GROUP:   # MTP entries before a reused prefix's end were never computed
            return seq.mtp_first_entry // self.block_size
        return 0

    # -- queues -----------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq not in self.running:   # preempted below as a victim
                continue
            pending = seq.num_pending
            n = pending + len(seq.draft_ids)
            if n > budget:   # no room to verify drafts this step: drop them
                seq.draft_ids, seq.draft_probs = [], None
                n = min(pending, budget)
            while not self._grow(seq, n):
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, n, False, n >= pending, max(0, n - pending)))
                budget -= n
        while (self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs):
            seq = self.waiting[0]
            snapshot = self._reuse_prefix(seq)
            n = min(seq.num_pending, budget)
            if not self._grow(seq, n):
                self._release(seq)
                break
            self.waiting.popleft()
            seq.conv_slot = self.free_conv_slots.pop()
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, n, snapshot, n == seq.num_pending, 0))
            budget -= n
        return scheduled

    # -- blocks -----------------------------------------------------------------------------------
    def _grow(self, seq: Sequence, n: int) -> bool:
        """Free window blocks the next queries no longer see, then make room for n more tokens."""
        end_block = -(-(seq.num_computed + n) // self.block_size)
        need = {}
        for group in self.groups_of(seq):
            table = seq.block_tables.setdefault(group, [])
            first = self.first_needed_block(seq, group, seq.num_computed)
            for i in range(min(first, len(table))):
                if table[i] is not None:
                    self.pool.free([table[i]])
                    table[i] = None
            need[group] = max(0, end_block - len(table))
        if not self.pool.can_allocate(sum(need.values())):
            return False
        for group, count in need.items():
            table = seq.block_tables[group]
            first = self.first_needed_block(seq, group, seq.num_computed)
            while len(table) < first and count:   # blocks wholly outside the window are never filled
                table.append(None)
                count -= 1
            table.extend(self.pool.allocate(group, count))
        return True

    def _block_hashes(self, seq: Sequence) -> list[bytes]:
        full = len(seq.token_ids) // self.block_size
        bs = self.block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(chain_hash(parent, seq.token_ids[i * bs:(i + 1) * bs], seq.media_key(i, bs)))
        return seq.block_hashes

    def _reuse_prefix(self, seq: Sequence) -> int | None:
        """Point the sequence at cached blocks of its longest cached prefix; the snapshot block id of
        the conv state at that prefix's end, or None when nothing is reused."""
        hashes = self._block_hashes(seq)
        bs = self.block_size
        max_blocks = (len(seq.token_ids) - 1) // bs   # at least one token must run to give logits
        self.pool.num_prefix_queried_blocks += max_blocks
        for n in range(max_blocks, 0, -1):
            tables = {}
            for group in self.groups:
                first = self.first_needed_block(seq, group, n * bs)
                found = [self.pool.lookup(group, h) for h in hashes[first:n]]
                if any(b is None for b in found):
                    break
                tables[group] = [None] * first + found
            else:
                for group, table in tables.items():
                    for block_id in table[self.first_needed_block(seq, group, n * bs):]:
                        self.pool.touch(group, block_id)
                if seq.uses_mtp:   # MTP drafts start afresh after the reused prefix (not cached)
                    tables[MTP_GROUP] = [None] * n
                    seq.mtp_first_entry = seq.mtp_frontier = n * bs
                seq.block_tables = tables
                seq.num_computed = n * bs
                seq.num_cached_prompt = max(seq.num_cached_prompt, min(n * bs, seq.prompt_len))
                self.pool.num_prefix_hit_blocks += n
                return tables[self.groups[0]][n - 1]
        return None

    def register_full_blocks(self, seq: Sequence) -> None:
        """Make the sequence's newly completed blocks findable for prefix reuse."""
        hashes = self._block_hashes(seq)
        for i in range(min(seq.num_computed // self.block_size, len(hashes))):
            for group in self.groups:
                table = seq.block_tables.get(group, [])
                if i < len(table) and table[i] is not None:
                    self.pool.register(group, table[i], hashes[i])

    def _release(self, seq: Sequence) -> None:
        for table in seq.block_tables.values():
            self.pool.free([b for b in table if b is not None])
        seq.block_tables = {}
        seq.num_computed = 0
        seq.draft_ids, seq.draft_probs = [], None
        seq.mtp_frontier = seq.mtp_first_entry = 0

    # -- leaving ----------------------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        self.free_conv_slots.append(seq.conv_slot)
        seq.conv_slot = None
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.free_conv_slots.append(seq.conv_slot)
            seq.conv_slot = None
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
