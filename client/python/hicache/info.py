"""What Client.stats(), Client.daemon_info() and Client.layout() return:
frozen dataclasses mirroring the hicache.v1 messages field for field (the
names and meanings of proto/hicache/v1/hicache.proto and docs/api.md).

Scalars keep their proto types (64-bit integers are Python ints), enums are
their value names (``"BACKEND_CPU"``), repeated fields are lists and nested
messages are these dataclasses. A nested message whose presence means
something is Optional and None when the daemon left it out: a standalone
daemon's ``DaemonInfo.cp_group``, a leader's ``CpGroupStatus.follower``, a
member row's ``transfer`` and ``events``, and the ``device`` and ``host``
segments of a rank the daemon does not serve. Every other nested message is
always there (its defaults when unset).
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, List, Optional, Type, TypeVar


__all__ = [
    "BlockAddress", "BuildInfo", "CacheStats", "CpGroupFollowerStats", "CpGroupMember",
    "CpGroupMemberEvents", "CpGroupMemberTransfer", "CpGroupStatus", "DaemonInfo",
    "EngineSettings", "HostTierPersistence", "KvFamily", "LaneStats", "Layout",
    "PoolGeometry", "PoolSegment", "RankSegments", "StepBlocks", "StorageTierStats",
    "from_message",
]

T = TypeVar("T")


@dataclass(frozen=True)
class LaneStats:
    """hicache.v1.LaneStats."""

    lane: int = 0
    free: int = 0
    release: int = 0
    allocated: int = 0
    host_free: int = 0
    host_used: int = 0


@dataclass(frozen=True)
class HostTierPersistence:
    """hicache.v1.HostTierPersistence."""

    enabled: bool = False
    recovered: bool = False
    cold_reason: str = ""
    nodes_recovered: int = 0
    pages_recovered: int = 0
    dropped_checksum: int = 0
    dropped_orphan: int = 0
    dropped_conflict: int = 0
    verified_bytes: int = 0
    recovery_seconds: float = 0.0
    journal_puts: int = 0
    journal_live: int = 0
    journal_file_bytes: int = 0
    journal_status: str = ""
    load_seconds: float = 0.0
    verify_seconds: float = 0.0
    restore_seconds: float = 0.0
    journal_puts_refused: int = 0
    journal_stopped: bool = False
    journal_backlog_events: int = 0
    journal_not_durable_records: int = 0


@dataclass(frozen=True)
class StorageTierStats:
    """hicache.v1.StorageTierStats."""

    enabled: bool = False
    stores: List[str] = field(default_factory=list)
    capacity_pages: int = 0
    used_pages: int = 0
    pages_queued: int = 0
    pages_dropped: int = 0
    pages_written: int = 0
    write_errors: int = 0
    pages_read: int = 0
    read_failures: int = 0
    checksum_failures: int = 0
    evictions: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    lookups: int = 0
    hit_pages: int = 0
    promoted_pages: int = 0
    promotions_failed: int = 0
    promotions_skipped: int = 0
    refused_cost: int = 0
    read_ns_per_byte: float = 0.0
    prefetches_started: int = 0
    prefetches_dropped: int = 0
    prefetch_waits_timed_out: int = 0


@dataclass(frozen=True)
class CacheStats:
    """hicache.v1.CacheStats."""

    nodes: int = 0
    device_tokens: int = 0
    protected_tokens: int = 0
    evictable_tokens: int = 0
    host_tokens: int = 0
    pending_backups: int = 0
    match_calls: int = 0
    query_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    backups_started: int = 0
    backups_committed: int = 0
    backups_rolled_back: int = 0
    backups_skipped_no_host: int = 0
    loads_started: int = 0
    loads_done: int = 0
    load_misses: int = 0
    device_evicted_pages: int = 0
    host_evicted_pages: int = 0
    device_alloc_failures: int = 0
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    lanes: List[LaneStats] = field(default_factory=list)
    sessions: int = 0
    session_locks: int = 0
    session_pages: int = 0
    host_copies_dropped: int = 0
    write_back_rejected: int = 0
    copy_waits: int = 0
    write_ahead_backups: int = 0
    l1_free_room_pages: int = 0
    l2_free_room_pages: int = 0
    free_room_reported: bool = False
    persistence: HostTierPersistence = field(default_factory=HostTierPersistence)
    backups_failed: int = 0
    quota_refusals: int = 0
    backups_skipped_quota: int = 0
    quota_evicted_pages: int = 0
    storage: StorageTierStats = field(default_factory=StorageTierStats)
    storage_hit_tokens: int = 0


@dataclass(frozen=True)
class BuildInfo:
    """hicache.v1.BuildInfo."""

    version: str = ""
    compiler: str = ""
    build_mode: str = ""
    cuda_support: bool = False
    proto_package: str = ""
    git_revision: str = ""


@dataclass(frozen=True)
class PoolGeometry:
    """hicache.v1.PoolGeometry."""

    page_size_tokens: int = 0
    cp_size: int = 0
    served_ranks: List[int] = field(default_factory=list)
    device_pages_per_rank: int = 0
    host_pages_per_rank: int = 0
    logical_device_pages: int = 0
    host_layout: str = ""


@dataclass(frozen=True)
class EngineSettings:
    """hicache.v1.EngineSettings."""

    write_policy: str = ""
    eviction_policy: str = ""
    write_through_threshold: int = 0
    load_back_threshold_tokens: int = 0
    l1_free_room_pages: int = 0
    l2_free_room_pages: int = 0
    transfer_workers: int = 0
    lock_host_memory: bool = False
    pin_host_memory: bool = False
    copy_max_blocks: int = 0
    gpus: List[int] = field(default_factory=list)
    cuda_runtime: str = ""


@dataclass(frozen=True)
class CpGroupMemberTransfer:
    """hicache.v1.CpGroupMemberTransfer."""

    steps_sent: int = 0
    steps_completed: int = 0
    steps_failed: int = 0
    outstanding: int = 0
    step_timeouts: int = 0
    digests_sent: int = 0
    digests_matched: int = 0
    digest_divergences: int = 0
    last_digest_match_age_ms: int = 0


@dataclass(frozen=True)
class CpGroupMemberEvents:
    """hicache.v1.CpGroupMemberEvents."""

    events_queued: int = 0
    events_sent: int = 0
    frames_sent: int = 0
    events_waiting: int = 0
    failed: bool = False


@dataclass(frozen=True)
class CpGroupMember:
    """hicache.v1.CpGroupMember."""

    index: int = 0
    name: str = ""
    ranks: List[int] = field(default_factory=list)
    epoch: int = 0
    health: str = ""
    last_heard_age_ms: int = 0
    reason: str = ""
    readmissions: int = 0
    heartbeats_sent: int = 0
    heartbeats_received: int = 0
    transfer: Optional[CpGroupMemberTransfer] = None
    events: Optional[CpGroupMemberEvents] = None


@dataclass(frozen=True)
class CpGroupFollowerStats:
    """hicache.v1.CpGroupFollowerStats."""

    tasks_received: int = 0
    steps_executed: int = 0
    steps_refused: int = 0
    steps_rejected: int = 0
    pending: int = 0
    digests_checked: int = 0
    digests_matched: int = 0
    diverged: bool = False
    last_digest_match_age_ms: int = 0
    acks_relayed: int = 0
    acks_failed: int = 0


@dataclass(frozen=True)
class CpGroupStatus:
    """hicache.v1.CpGroupStatus."""

    name: str = ""
    role: str = ""
    state: str = ""
    cp_size: int = 0
    epoch: int = 0
    leader_address: str = ""
    members: List[CpGroupMember] = field(default_factory=list)
    reason: str = ""
    deaths: int = 0
    follower: Optional[CpGroupFollowerStats] = None


@dataclass(frozen=True)
class DaemonInfo:
    """hicache.v1.GetStatsResponse."""

    build: BuildInfo = field(default_factory=BuildInfo)
    backend: str = ""
    geometry: PoolGeometry = field(default_factory=PoolGeometry)
    uptime_seconds: float = 0.0
    start_time_unix: int = 0
    listen_address: str = ""
    pid: int = 0
    settings: EngineSettings = field(default_factory=EngineSettings)
    cp_group: Optional[CpGroupStatus] = None


@dataclass(frozen=True)
class KvFamily:
    """hicache.v1.KvFamily."""

    name: str = ""
    bytes_per_token: int = 0
    num_layers: int = 0
    draft: bool = False


@dataclass(frozen=True)
class PoolSegment:
    """hicache.v1.PoolSegment."""

    name: str = ""
    size_bytes: int = 0
    kind: str = ""
    ipc_handle: bytes = b""
    device: int = 0
    pci_bus_id: str = ""


@dataclass(frozen=True)
class RankSegments:
    """hicache.v1.RankSegments."""

    rank: int = 0
    device: Optional[PoolSegment] = None
    host: Optional[PoolSegment] = None


@dataclass(frozen=True)
class BlockAddress:
    """hicache.v1.BlockAddress."""

    family: int = 0
    layer: int = 0
    offset: int = 0
    page_stride: int = 0
    block_bytes: int = 0


@dataclass(frozen=True)
class StepBlocks:
    """hicache.v1.StepBlocks."""

    step: int = 0
    blocks: List[int] = field(default_factory=list)


@dataclass(frozen=True)
class Layout:
    """hicache.v1.GetLayoutResponse."""

    geometry: PoolGeometry = field(default_factory=PoolGeometry)
    kv_preset: str = ""
    families: List[KvFamily] = field(default_factory=list)
    bytes_per_page: int = 0
    num_steps: int = 0
    target_steps: int = 0
    ranks: List[RankSegments] = field(default_factory=list)
    device_blocks: List[BlockAddress] = field(default_factory=list)
    host_blocks: List[BlockAddress] = field(default_factory=list)
    steps: List[StepBlocks] = field(default_factory=list)
    backend: str = ""
    fences: bool = False


def _is_repeated(proto: Any) -> bool:
    """Whether a field descriptor is repeated (protobuf 5.26+ says so as
    is_repeated; label, which older ones have, is gone from the newest)."""
    repeated = getattr(proto, "is_repeated", None)
    if isinstance(repeated, bool):
        return repeated
    return bool(proto.label == proto.LABEL_REPEATED)


def _element_class(hint: Any) -> Any:
    """The dataclass inside List[X] or Optional[X], or X itself."""
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return hint


def from_message(cls: Type[T], message: Any) -> T:
    """`message` (a hicache.v1 protobuf message) as the dataclass `cls`,
    nested messages included. Fields `cls` does not declare are ignored, so a
    newer daemon's additions do not break an older client."""
    hints = typing.get_type_hints(cls)
    values: typing.Dict[str, Any] = {}
    descriptor = message.DESCRIPTOR
    for f in dataclasses.fields(typing.cast(Any, cls)):
        proto = descriptor.fields_by_name.get(f.name)
        if proto is None:
            continue
        value = getattr(message, f.name)
        repeated = _is_repeated(proto)
        if proto.type == proto.TYPE_MESSAGE:
            sub = _element_class(hints[f.name])
            if repeated:
                values[f.name] = [from_message(sub, v) for v in value]
            elif message.HasField(f.name):
                values[f.name] = from_message(sub, value)
            elif typing.get_origin(hints[f.name]) is not typing.Union:
                values[f.name] = sub()  # Always there: its defaults.
        elif proto.type == proto.TYPE_ENUM:
            def name(number: int) -> str:
                known = proto.enum_type.values_by_number.get(number)
                return str(known.name) if known is not None else str(number)
            values[f.name] = [name(v) for v in value] if repeated else name(value)
        else:
            values[f.name] = list(value) if repeated else value
    return cls(**values)
