#pragma once

#include <cstdio>
#include <cstdlib>

// HICACHE_CHECK(cond, message): for states that cannot happen unless the
// daemon itself is broken (never for anything a client can cause). Prints
// the condition, the message and the place, then aborts.
#define HICACHE_CHECK(cond, message)                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: %s\n", __FILE__,      \
                   __LINE__, #cond, (message));                             \
      std::abort();                                                         \
    }                                                                       \
  } while (false)
