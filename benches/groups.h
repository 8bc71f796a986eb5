// The rows measured together: those a stage's declared pairs join at one problem (adamw's per-tensor,
// foreach and fused at one size) are a group, measured in rounds that take one sample of each in the
// order tb::schedule gives (A B, B A, ...), so that whatever slows the machine for a while slows every
// side of the rounds it lasts, and each pair's ratio comes from its rounds. Every other row is a group
// of its own.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"

namespace tb {

// The row a declared pair compares an improved row with: the baseline at the improved row's problem;
// failing that (no row of that name: `exists`), at its values of the axes the baseline has (a bucketed
// all-reduce against one call per tensor: bucket_mb is its own).
std::string pair_baseline_name(const Stage& stage, const Pair& pair, const Row& improved,
                               const std::function<bool(const std::string&)>& exists);

// The rows still to run (disposition pending), grouped and in the order they run: each group where its
// first row would run, its rows in entry order. With `interleave` false, each row alone. Rows join the
// rows their stage's pairs compare them with and those they name (Entry::measured_with), transitively;
// under mpirun a collective row keeps its ranks in step on its own, so it joins none.
std::vector<std::vector<std::size_t>> measuring_groups(const std::vector<Entry>& entries, const std::vector<Row>& rows,
                                                       bool interleave);

// What a row observed while it was timed (Instance::observed), to add to its counters. A row measured in
// rounds whose pair shows a model's prediction (cg's lazy gate) is read after each of its samples, so
// that the model's parts are timed in the same rounds as what they predict: it keeps each counter's
// median. Any other row is read once, after its last sample.
class RoundObservations {
 public:
  // Whether `entry`, measured in rounds with others, is read after each sample.
  static bool wanted(const Entry& entry);
  explicit RoundObservations(bool each_round) : each_round_(each_round) {}
  void after_sample(const Instance& instance);
  std::vector<std::pair<std::string, double>> counters(const Instance& instance) const;

 private:
  bool each_round_;
  std::map<std::string, std::vector<double>> rounds_;
  std::vector<std::string> order_;  // the counters in the order the instance gave them
};

}  // namespace tb
