// The order of interleaved rounds: every process that measures entries against each other in rounds (the
// tuner's race, the harness's pair groups, attention_tiles) takes its order from here, so that they agree.
#pragma once

#include <cstddef>
#include <vector>

namespace tb {

// `rounds` rounds over `entries` entries: entries * rounds indices, round by round, each round a
// permutation of 0 .. entries-1. Rounds come in mirrored pairs: round 2j is the entries rotated left by
// 2j (position p runs entry (p + 2j) mod entries), round 2j + 1 is round 2j reversed. Why balanced:
// - over each pair of rounds every entry's two positions add up to entries - 1, so a drift linear in
//   time across the pair slows every entry alike (for two entries this is ABBA: 0,1 | 1,0 | 0,1 | 1,0);
// - the rotation moves each entry through the positions of one parity and the reversal through those of
//   the other, so over a full cycle of lcm(2, entries) rounds (entries rounds when even, 2 x entries when
//   odd) every entry runs in every position equally often (once, or twice) and leads a round off;
//   no mirrored schedule balances in fewer rounds.
// Pure: the same arguments give the same order. Zero entries or zero rounds give no indices.
std::vector<std::size_t> schedule(std::size_t entries, std::size_t rounds);

}  // namespace tb
