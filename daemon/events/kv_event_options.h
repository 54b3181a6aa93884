#pragma once

// The one place where the daemon's configuration (DaemonConfig::kv_events)
// becomes the KV-event publisher's options.

#include "daemon/core/daemon_config.h"
#include "daemon/events/kv_event_publisher.h"

namespace hicache::events {

// Every kv_events field carried over; an empty instance becomes the host
// name, block size 0 the page size.
KvEventPublisherOptions KvEventPublisherOptionsFrom(const DaemonConfig& config);

}  // namespace hicache::events
