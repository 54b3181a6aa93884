#include "daemon/core/clock.h"

namespace hicache {

Clock* Clock::Real() {
  static RealClock* const kClock = new RealClock();
  return kClock;
}

}  // namespace hicache
