#pragma once

// Where each RPC of hicache.v1.HiCache may be served in a CP group
// (docs/api.md, "CP group leader redirect"). The one place that says so:
// tests/service/rpc_scope_test.cc checks that every RPC of the proto is
// here, so a new RPC cannot skip the leader guard by being forgotten.

#include <array>
#include <optional>
#include <string_view>

namespace hicache::service {

enum class RpcScope {
  // Reads or changes the radix tree or the page metadata, which only the
  // CP group leader keeps: a follower refuses it with a redirect.
  kTree,
  // Served by every daemon (worker-facing, or about this daemon itself).
  kLocal,
  // Depends on the request: OpenSession as a scheduler is kTree, as a
  // worker kLocal; on a BackupSession stream, prepare, store_all and
  // rollback (a scheduler's) are kTree, layer_stored (a worker's ack) is
  // kLocal.
  kByRole,
};

struct RpcScopeEntry {
  std::string_view method;  // As in the proto: "MatchPrefix".
  RpcScope scope;
};

// Every RPC of hicache.v1.HiCache.
inline constexpr std::array kHiCacheRpcScopes = {
    // The daemon itself and sessions.
    RpcScopeEntry{"GetStats", RpcScope::kLocal},
    RpcScopeEntry{"OpenSession", RpcScope::kByRole},
    RpcScopeEntry{"KeepAlive", RpcScope::kLocal},
    RpcScopeEntry{"CloseSession", RpcScope::kLocal},
    // Workers: this daemon's pools and fences.
    RpcScopeEntry{"GetLayout", RpcScope::kLocal},
    RpcScopeEntry{"RegisterFence", RpcScope::kLocal},
    RpcScopeEntry{"ReleaseFence", RpcScope::kLocal},
    RpcScopeEntry{"Subscribe", RpcScope::kLocal},
    RpcScopeEntry{"ListSessions", RpcScope::kLocal},  // This daemon's.
    // Pages and the tree.
    RpcScopeEntry{"Allocate", RpcScope::kTree},
    RpcScopeEntry{"Free", RpcScope::kTree},
    RpcScopeEntry{"MatchPrefix", RpcScope::kTree},
    RpcScopeEntry{"Insert", RpcScope::kTree},
    RpcScopeEntry{"Lock", RpcScope::kTree},
    RpcScopeEntry{"Unlock", RpcScope::kTree},
    RpcScopeEntry{"Admit", RpcScope::kTree},
    RpcScopeEntry{"Complete", RpcScope::kTree},
    RpcScopeEntry{"Pin", RpcScope::kTree},
    // Backups and loads.
    RpcScopeEntry{"BackupSession", RpcScope::kByRole},
    RpcScopeEntry{"LoadBack", RpcScope::kTree},
    RpcScopeEntry{"FinishLoad", RpcScope::kTree},
    // Operators: the tree's contents, counters and events.
    RpcScopeEntry{"Evict", RpcScope::kTree},
    RpcScopeEntry{"SetFreeRoom", RpcScope::kTree},
    RpcScopeEntry{"SetQuota", RpcScope::kTree},
    RpcScopeEntry{"ListQuotas", RpcScope::kTree},
    RpcScopeEntry{"Stats", RpcScope::kTree},
    RpcScopeEntry{"DumpTree", RpcScope::kTree},
    RpcScopeEntry{"InspectNode", RpcScope::kTree},
    RpcScopeEntry{"QueryTiers", RpcScope::kTree},
    RpcScopeEntry{"Watch", RpcScope::kTree},
};

// The scope of `method`; nullopt for a name that is not listed.
constexpr std::optional<RpcScope> ScopeOfRpc(std::string_view method) {
  for (const RpcScopeEntry& entry : kHiCacheRpcScopes) {
    if (entry.method == method) return entry.scope;
  }
  return std::nullopt;
}

}  // namespace hicache::service
