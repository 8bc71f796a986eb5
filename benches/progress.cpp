#include "progress.h"

#include <iomanip>
#include <ostream>
#include <sstream>

#include "runtime/stats.h"

namespace tb {

std::string human_duration(double s) {
  std::ostringstream out;
  if (s >= 3600)
    out << static_cast<int>(s / 3600) << "h" << std::setw(2) << std::setfill('0') << static_cast<int>(s / 60) % 60 << "m";
  else if (s >= 60)
    out << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(s) % 60 << "s";
  else out << std::fixed << std::setprecision(1) << s << "s";
  return out.str();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

RunProgress::RunProgress(std::ostream& out, std::size_t rows, double noise_target)
    : out_(out), rows_(rows), noise_target_(noise_target) {}

void RunProgress::start() { run_started_ = row_started_ = std::chrono::steady_clock::now(); }

// The time a row is expected to take from what the rows so far took, for the ETA.
std::string RunProgress::eta_text(const Row& row) {
  const auto now = std::chrono::steady_clock::now();
  if (row.disposition != Disposition::unsupported || !row.cut_short.empty()) {
    ++rows_done_;
    seconds_done_ += std::chrono::duration<double>(now - row_started_).count();
  }
  row_started_ = now;
  const std::size_t left = timed_rows_ > rows_done_ ? timed_rows_ - rows_done_ : 0;
  if (rows_done_ == 0) return "";
  const double per_row = seconds_done_ / static_cast<double>(rows_done_);
  std::ostringstream out;
  out << "  [" << human_duration(std::chrono::duration<double>(now - run_started_).count()) << " elapsed";
  if (left) out << ", ETA " << human_duration(per_row * static_cast<double>(left));
  out << "]";
  return out.str();
}

void RunProgress::announce(const Row& r) {
  const std::string eta = r.disposition == Disposition::unsupported && r.cut_short.empty() ? std::string() : eta_text(r);
  out_ << "[" << std::setw(3) << ++announced_ << "/" << rows_ << "] " << r.name << "  ";
  if (r.timed()) {
    const Summary s = summarize(r.samples_ns, noise_target_);
    out_ << std::fixed << std::setprecision(3) << s.median / 1e6 << " ms +-" << std::setprecision(1)
         << 100 * s.rel_half_width << "%";
    if (r.bound == "memory" && r.bytes > 0) out_ << "  " << std::setprecision(2) << r.bytes / s.median << " GB/s";
    if (r.bound == "compute" && r.flops > 0) out_ << "  " << std::setprecision(3) << r.flops / s.median * 1e-3 << " TFLOP/s";
    if (s.noisy) out_ << "  (noisy)";
    if (r.disturbed)
      out_ << "  (disturbed: " << disturbance_text(r)
           << (!r.interrupted.empty() && r.retaken == 0 ? ", not taken again: interrupted)"
                                                        : " after " + std::to_string(r.retaken) + " retakes)");
    else if (r.retaken)
      out_ << "  (" << r.retaken
           << " samples taken again: " << (r.throttled_share >= 0 ? "the GPU throttled" : "other processes held the CPUs")
           << ")";
    if (!r.interrupted.empty()) out_ << "  (interrupted: " << r.interrupted << ")";
    for (const auto& [key, value] : r.counters) out_ << "  " << key << "=" << counter_text(value);
    if (!r.cut_short.empty()) out_ << "  (cut short: " << r.cut_short << ")";
  } else {
    out_ << r.disposition << (r.reason.empty() ? "" : ": " + r.reason);
  }
  out_ << eta << std::endl;
}

void RowProgress::say(const std::string& what) {
  if (seconds_since(said_at_) < every_s_) return;
  said_at_ = std::chrono::steady_clock::now();
  out_ << "      " << row_ << "  " << what << " (" << std::fixed << std::setprecision(1) << seconds_since(started_)
       << " s in this row)" << std::endl;
}

}  // namespace tb
