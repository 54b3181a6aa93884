#include "daemon/events/kv_event_topics.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace hicache::events {

absl::StatusOr<KvEventTopics> KvEventTopics::Create(TopicOptions options) {
  if (!absl::StrContains(options.topic_template, "{namespace}") &&
      !absl::StrContains(options.topic_template, "{model}")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV event topic template '", options.topic_template,
        "' names neither {namespace} nor {model}: namespaces would share a "
        "topic"));
  }
  if (absl::Status s = ValidateName("kv_events_instance", options.instance);
      !s.ok()) {
    return s;
  }
  if (!options.model.empty()) {
    if (absl::Status s = ValidateName("kv_events_model", options.model);
        !s.ok()) {
      return s;
    }
  }
  return KvEventTopics(std::move(options));
}

absl::Status KvEventTopics::ValidateName(absl::string_view field,
                                         absl::string_view value) {
  if (value.empty() || value.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must hold 1 to 256 characters, not ",
                     value.size()));
  }
  for (char c : value) {
    if (c <= ' ' || c > '~' || c == '@' || c == '{' || c == '}') {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " may hold printable ASCII other than '@', '{', '}' and "
                 "spaces; it holds byte ",
          static_cast<int>(static_cast<unsigned char>(c))));
    }
  }
  return absl::OkStatus();
}

std::string KvEventTopics::Render(absl::string_view ns,
                                  absl::string_view instance,
                                  absl::string_view model) const {
  if (instance.empty()) instance = options_.instance;
  if (model.empty()) model = options_.model;
  if (model.empty()) model = ns.empty() ? absl::string_view("default") : ns;
  return absl::StrReplaceAll(options_.topic_template, {{"{instance}", instance},
                                                       {"{model}", model},
                                                       {"{namespace}", ns}});
}

const std::string& KvEventTopics::TopicOf(absl::string_view ns) {
  auto it = topic_of_.find(ns);
  if (it != topic_of_.end()) return it->second;
  std::string topic = Render(ns, "", "");
  if (auto owner = owner_of_.find(topic);
      owner != owner_of_.end() && owner->second != ns) {
    // Declared by another namespace: this one's default is made unique.
    topic = absl::StrCat(topic, "/", ns);
  }
  owner_of_[topic] = std::string(ns);
  return topic_of_.emplace(std::string(ns), std::move(topic)).first->second;
}

absl::StatusOr<std::string> KvEventTopics::Declared(
    absl::string_view ns, absl::string_view instance,
    absl::string_view model) const {
  std::string topic = Render(ns, instance, model);
  if (auto owner = owner_of_.find(topic);
      owner != owner_of_.end() && owner->second != ns) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV event topic '", topic, "' belongs to namespace '",
                     owner->second, "'"));
  }
  return topic;
}

void KvEventTopics::Assign(absl::string_view ns, const std::string& topic) {
  if (auto it = topic_of_.find(ns); it != topic_of_.end()) {
    owner_of_.erase(it->second);
    it->second = topic;
  } else {
    topic_of_.emplace(std::string(ns), topic);
  }
  owner_of_[topic] = std::string(ns);
}

}  // namespace hicache::events
