"""One pool of KV-cache blocks shared by all cache groups, with prefix reuse by chained hashes.

Plain Python bookkeeping; the tensors live in `cache.py`. A block whose last user lets go keeps its
hash and stays findable until the pool hands it out again (least recently freed first).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

FULL = "full_attention"
SLIDING = "sliding_window"


def chain_hash(parent: bytes | None, token_ids: list[int], extra: bytes = b"") -> bytes:
    """Hash of a full block: its parent's hash, its tokens, and any media content behind them."""
    h = hashlib.sha256(parent or b"root")
    h.update(b",".join(str(t).encode() for t in token_ids))
    h.update(extra)
    return h.digest()


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    group: str | None = None        # the cache group holding it while in use
    key: tuple[str, bytes] | None = None   # (group, chain hash) once it holds a full, verified block


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, groups: tuple[str, ...]):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.groups = groups
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[tuple[str, bytes], int] = {}
        self.num_prefix_hit_blocks = 0
        self.num_prefix_queried_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, group: str, n: int) -> list[int] | None:
        """n fresh blocks for `group`, or None when the pool cannot supply them."""
        if n > len(self._free):
            return None
        ids = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.key is not None:  # evict the oldest cached content
                del self._cached[block.key]
                block.key = None
            block.ref_count, block.group = 1, group
            ids.append(block_id)
        return ids

    def free(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} freed twice"
            block.ref_count -= 1
            if block.ref_count == 0:
                block.group = None
                self._free[block_id] = None

    def lookup(self, group: str, block_hash: bytes) -> int | None:
        return self._cached.get((group, block_hash))

    def touch(self, group: str, block_id: int) -> None:
        """Take a reference on a cached block found by `lookup`."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1
        block.group = group

    def register(self, group: str, block_id: int, block_hash: bytes) -> None:
        """Make a full, verified block findable by its hash (the first holder of a hash wins)."""
        key = (group, block_hash)
        block = self.blocks[block_id]
        if key in self._cached or block.key is not None:
            return
        block.key = key
        self._cached[key] = block_id

    def usage(self) -> dict:
        used = {g: 0 for g in self.groups}
        for block in self.blocks:
            if block.ref_count > 0:
                used[block.group] += 1
        total_used = sum(used.values())
        return {"used": used, "total": self.num_blocks, "cached_free": sum(
            1 for i in self._free if self.blocks[i].key is not None),
            "use_fraction": total_used / self.num_blocks}
