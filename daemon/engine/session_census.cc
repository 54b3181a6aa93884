// SessionManager::TakeCensus: what metrics read at scrape time.
#include "daemon/engine/session_manager.h"

namespace hicache {

SessionManager::Census SessionManager::TakeCensus() const {
  MutexLock lock(&mu_);
  Census census;
  for (const auto& [id, session] : sessions_) {
    const bool worker = session.info.role == SessionRole::kWorker;
    (worker ? census.worker_sessions : census.scheduler_sessions) += 1;
    (worker ? census.worker_streams : census.scheduler_streams) +=
        session.streams;
    for (const auto& [node, count] : session.locks) census.locks += count;
    NamespaceSessions& ns = census.namespaces[session.info.ns];
    ++ns.sessions;
    ns.pages += engine_->RequestPages(session.holder);
  }
  return census;
}

}  // namespace hicache
