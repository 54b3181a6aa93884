"""The request items and results of Session calls: MatchResult, AdmitItem,
AdmitResult, CompleteItem and LoadBackResult, and the names Session accepts
for an AdmitItem's `mode` and `backup`."""

from dataclasses import dataclass
from typing import List, Sequence, Union

from hicache.pages import Pages, Tokens, _parts
from hicache.rpc import pb

__all__ = ["AdmitItem", "AdmitResult", "CompleteItem", "LoadBackResult", "MatchResult"]


_MODES = {"any": pb.COMPUTE_OWNER_MODE_UNSPECIFIED,
          "zigzag": pb.COMPUTE_OWNER_MODE_ZIGZAG,
          "round_robin": pb.COMPUTE_OWNER_MODE_ROUND_ROBIN}
_BACKUPS = {"auto": pb.BACKUP_CHOICE_AUTO,
            "never": pb.BACKUP_CHOICE_NEVER,
            "always": pb.BACKUP_CHOICE_ALWAYS}


def _enum(table, value, what):
    if isinstance(value, int):
        return value
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}") from None


@dataclass
class MatchResult:
    device_pages: List[int]
    device_tokens: int
    last_device_node: int
    last_host_node: int
    host_hit_tokens: int
    lock_handle: int = 0  # With lock=True: this hit's lock (0: no hit).
    # The query runs past a cached sub-page tail locked by another request
    # or still being backed up: do not prepare a backup past the hit.
    tail_blocked: bool = False


@dataclass
class AdmitItem:
    """One request for Session.admit: its input `tokens` (ints or packed
    bytes), `reserve_tokens` of output to allocate pages for now, the lanes
    of the new pages (`mode`: 'any', 'zigzag', 'round_robin') and whether to
    prepare a per-layer backup of the new input pages (`backup`: 'auto' --
    per the daemon's write policy --, 'never', 'always'). `unfinished`: a
    middle chunk of a chunked prefill (complete it with unfinished=True):
    its backup covers only its whole pages."""
    tokens: Tokens
    reserve_tokens: int = 0
    mode: Union[str, int] = "any"
    backup: Union[str, int] = "auto"
    unfinished: bool = False


@dataclass
class AdmitResult:
    """What Admit did for one item. The request's pages are
    ``device_pages + pages`` (``request_pages``). Both page lists are
    Pages views of the response's own repeated fields, not copies, tagged
    with the session generation: read-only sequences (len, index, iterate,
    ``==`` with a list; a slice is a tagged PageList; ``list()`` copies
    them), and complete() takes them -- or a Pages of them -- without
    converting."""
    admitted: bool  # False: nothing held (no room); retry later.
    device_pages: Sequence[int]  # The page-aligned device hit, locked.
    device_tokens: int
    lock_handle: int  # The hit's lock (0: nothing hit).
    last_device_node: int
    host_hit_tokens: int
    last_host_node: int
    load: bool  # Load the host hit (LoadBack, then Allocate): nothing allocated.
    pages: Sequence[int]  # The new pages, after device_pages.
    backup_id: int  # 0: no backup prepared (choice, host full, tail_blocked).
    tail_blocked: bool
    generation: int = -1  # The session generation that issued it (Session).

    @property
    def request_pages(self) -> Pages:
        """The whole request's pages: the locked device hit, then the new ones."""
        return Pages(*_parts(self.device_pages), *_parts(self.pages),
                     generation=self.generation)


@dataclass
class CompleteItem:
    """One finished request for Session.complete: insert `tokens` (whose KV
    is in `pages`, ceil(len(tokens) / P) of them) attaching `backup_id`, then
    release `lock_handles`, and with `free_uncached` free the pages the tree
    did not take plus `free_pages` (e.g. an unused output reserve)."""
    tokens: Tokens
    pages: Sequence[int]  # A list, a Pages, AdmitResult's repeated fields.
    backup_id: int = 0
    lock_handles: Sequence[int] = ()
    free_uncached: bool = True
    free_pages: Sequence[int] = ()
    unfinished: bool = False


@dataclass
class LoadBackResult:
    load_id: int
    pages: List[int]
    device_tokens: int
    loaded_tokens: int
    node: int
    miss_reason: str
    layers_loaded: int = 0
    ok: bool = True
    lock_handle: int = 0  # The session's lock on `node` (release with unlock).
