#include "daemon/events/kv_event_options.h"

#include <unistd.h>

#include <climits>

namespace hicache::events {
namespace {

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "hicached";
  }
  return name;
}

}  // namespace

KvEventPublisherOptions KvEventPublisherOptionsFrom(const DaemonConfig& config) {
  const DaemonConfig::KvEvents& e = config.kv_events;
  KvEventPublisherOptions options;
  options.endpoint = e.endpoint;
  options.replay_endpoint = e.replay_endpoint;
  options.buffer_batches = e.buffer_batches;
  options.hwm = e.hwm;
  options.max_queued_events = e.max_queued_events;
  options.format.block_size = e.block_size == 0 ? config.page_size : e.block_size;
  options.format.device_medium = e.device_medium;
  options.format.host_medium = e.host_medium;
  options.format.data_parallel_rank = e.data_parallel_rank;
  options.topics.topic_template = e.topic;
  options.topics.instance = e.instance.empty() ? HostName() : e.instance;
  options.topics.model = e.model;
  return options;
}

}  // namespace hicache::events
