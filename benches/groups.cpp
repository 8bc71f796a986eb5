#include "groups.h"

#include <algorithm>

#include "runtime/comm.h"
#include "runtime/stats.h"

namespace tb {

std::string pair_baseline_name(const Stage& stage, const Pair& pair, const Row& improved,
                               const std::function<bool(const std::string&)>& exists) {
  const std::string prefix = improved.stage + "/" + improved.backend + "/";
  const std::string same_problem = prefix + pair.baseline + improved.name.substr(prefix.size() + improved.variant.size());
  const Variant* baseline = stage.find_variant(pair.baseline, backend_from_string(improved.backend));
  if (exists(same_problem) || !baseline) return same_problem;
  std::vector<std::pair<std::string, std::string>> shared;
  for (const auto& kv : improved.problem)
    if (std::find(baseline->axes.begin(), baseline->axes.end(), kv.first) != baseline->axes.end()) shared.push_back(kv);
  return benchmark_name(stage, *baseline, Problem(shared));
}

namespace {

// Rows joined into sets by the pairs between them (union-find over row indices).
class Joined {
 public:
  explicit Joined(std::size_t rows) : parent_(rows) {
    for (std::size_t i = 0; i < rows; ++i) parent_[i] = i;
  }
  std::size_t root(std::size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void join(std::size_t a, std::size_t b) { parent_[root(a)] = root(b); }

 private:
  std::vector<std::size_t> parent_;
};

// Joins each runnable row with the rows its pairs compare it with and those it names.
void join_pairs(const std::vector<Entry>& entries, const std::vector<Row>& rows,
                const std::map<std::string, std::size_t>& runnable, Joined& joined) {
  const bool ranks = comm::launched_ranks() > 1;
  for (const auto& [name, i] : runnable) {
    const Entry& e = entries[i];
    if (ranks && e.variant->collective) continue;
    for (const auto& pair : e.stage->pairs) {
      if (pair.improved != e.variant->id) continue;
      const auto baseline = runnable.find(
          pair_baseline_name(*e.stage, pair, rows[i], [&](const std::string& other) { return runnable.count(other) > 0; }));
      if (baseline == runnable.end() || (ranks && entries[baseline->second].variant->collective)) continue;
      joined.join(baseline->second, i);
    }
    for (const auto& other : e.measured_with)
      if (const auto with = runnable.find(other); with != runnable.end()) joined.join(with->second, i);
  }
}

}  // namespace

std::vector<std::vector<std::size_t>> measuring_groups(const std::vector<Entry>& entries, const std::vector<Row>& rows,
                                                       bool interleave) {
  std::map<std::string, std::size_t> runnable;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].disposition == Disposition::pending) runnable[rows[i].name] = i;
  Joined joined(rows.size());
  if (interleave) join_pairs(entries, rows, runnable, joined);
  std::map<std::size_t, std::vector<std::size_t>> by_root;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].disposition == Disposition::pending) by_root[joined.root(i)].push_back(i);  // entry order
  std::vector<std::vector<std::size_t>> groups;
  for (auto& [root, members] : by_root) groups.push_back(std::move(members));
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return groups;
}

bool RoundObservations::wanted(const Entry& entry) {
  return std::any_of(entry.stage->pairs.begin(), entry.stage->pairs.end(),
                     [&](const Pair& pair) { return pair.improved == entry.variant->id && !pair.predicted_ns.empty(); });
}

void RoundObservations::after_sample(const Instance& instance) {
  if (!each_round_) return;
  for (const auto& [key, value] : instance.observed()) {
    auto& values = rounds_[key];
    if (values.empty()) order_.push_back(key);
    values.push_back(value);
  }
}

std::vector<std::pair<std::string, double>> RoundObservations::counters(const Instance& instance) const {
  if (order_.empty()) return instance.observed();
  std::vector<std::pair<std::string, double>> medians;
  for (const auto& key : order_) medians.emplace_back(key, median_of(rounds_.at(key)));
  return medians;
}

}  // namespace tb
