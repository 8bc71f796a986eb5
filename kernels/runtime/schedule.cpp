#include "schedule.h"

namespace tb {

std::vector<std::size_t> schedule(std::size_t entries, std::size_t rounds) {
  std::vector<std::size_t> order;
  if (entries == 0) return order;
  order.reserve(entries * rounds);
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t shift = (round - round % 2) % entries;  // 2j for the pair (2j, 2j + 1)
    const bool mirrored = round % 2 == 1;
    for (std::size_t position = 0; position < entries; ++position) {
      const std::size_t p = mirrored ? entries - 1 - position : position;
      order.push_back((p + shift) % entries);
    }
  }
  return order;
}

}  // namespace tb
