#pragma once

// Which ZMQ topic carries a namespace's KV events (docs/kv-events.md,
// "Topics"). Routers score per engine instance, so each namespace publishes
// on its own topic, rendered from a template:
//
//   {instance}  the instance a scheduler session declared for the namespace
//               (OpenSession's event_instance), else the daemon's default
//               (--kv_events_instance: the host name);
//   {model}     the model it declared, else the daemon's default
//               (--kv_events_model), else the namespace ("default" for "");
//   {namespace} the namespace itself.
//
// The default template, "kv@{instance}@{model}", is llm-d's convention. Two
// namespaces never share a topic: a declaration whose topic another
// namespace already uses is refused, so a hit in one namespace is never
// announced for another.
//
// Thread-compatible: the publisher guards it.

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache::events {

struct TopicOptions {
  std::string topic_template = "kv@{instance}@{model}";
  std::string instance;  // Default {instance}.
  std::string model;     // Default {model}; "" = the namespace.
};

class KvEventTopics {
 public:
  // INVALID_ARGUMENT for a template that names neither {namespace} nor
  // {model} (namespaces would share a topic), or bad defaults.
  static absl::StatusOr<KvEventTopics> Create(TopicOptions options);

  // An instance id or model name a client may declare: 1 to 256 printable
  // ASCII characters, none of them '@', '{', '}' or white space
  // (INVALID_ARGUMENT naming `field` otherwise).
  static absl::Status ValidateName(absl::string_view field,
                                   absl::string_view value);

  // The namespace's topic (its default one until a declaration).
  const std::string& TopicOf(absl::string_view ns);
  // The topic `ns` would have with this declaration (empty fields: the
  // defaults); FAILED_PRECONDITION if another namespace uses it.
  absl::StatusOr<std::string> Declared(absl::string_view ns,
                                       absl::string_view instance,
                                       absl::string_view model) const;
  // Moves `ns` to `topic` (from Declared).
  void Assign(absl::string_view ns, const std::string& topic);

 private:
  explicit KvEventTopics(TopicOptions options) : options_(std::move(options)) {}
  std::string Render(absl::string_view ns, absl::string_view instance,
                     absl::string_view model) const;

  TopicOptions options_;
  absl::flat_hash_map<std::string, std::string> topic_of_;  // ns -> topic.
  absl::flat_hash_map<std::string, std::string> owner_of_;  // topic -> ns.
};

}  // namespace hicache::events
