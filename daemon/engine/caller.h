#pragma once

#include <string>
#include <utility>

namespace hicache {

// Who makes a request, as the transport proved it (unix peer credentials or
// a TLS client certificate). Operators may act across tenants (evict, set
// free room, dump and inspect the tree, list sessions, watch); every other
// caller is confined to the namespace and session it names.
struct Caller {
  bool is_operator = false;
  std::string name;  // For logs and errors: "uid 1000 pid 4242", "cert CN=x".

  static Caller Operator(std::string name = "in-process operator") {
    return {true, std::move(name)};
  }
  static Caller Client(std::string name = "client") {
    return {false, std::move(name)};
  }
};

}  // namespace hicache
