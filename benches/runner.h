// The run: every selected row measured once, alone or in rounds with the rows of its pairs (groups.h),
// each sampled by its own RowSampler and watched for a disturbed machine, --max-time and stop requests;
// a progress line per row as it finishes.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "harness.h"
#include "results.h"

namespace tb {

// The rows of `entries`, in their order, with their samples (summaries not filled yet). Never throws for
// a failing variant: it becomes a failed row. Throws UsageError for a --benchmark_filter that is no regex.
std::vector<Row> measure_entries(const std::vector<Entry>& entries, const Settings& settings, std::ostream& progress);

// "SIGINT", "SIGTERM", "signal 10".
std::string signal_name(int signal);

}  // namespace tb
