// The progress lines a run writes while it measures: one per row when it is done (its time, rate and
// marks, with the run's elapsed time and ETA), and, for a row that takes long, how far it is.
#pragma once

#include <chrono>
#include <cstddef>
#include <iosfwd>
#include <string>
#include <utility>

#include "results.h"

namespace tb {

// "4m10s", "12.3s".
std::string human_duration(double seconds);

double seconds_since(std::chrono::steady_clock::time_point t);

// The run's line per row, "[  3/12] name  0.412 ms +-1.2%  ...  [5.1s elapsed, ETA 20.0s]"; the ETA
// from what the rows so far took.
class RunProgress {
 public:
  RunProgress(std::ostream& out, std::size_t rows, double noise_target);
  // The rows the run will time (those not unsupported before it starts): the ETA's denominator.
  void expect_timed_rows(std::size_t rows) { timed_rows_ = rows; }
  void start();
  void announce(const Row& row);
  std::ostream& out() { return out_; }

 private:
  std::string eta_text(const Row& row);

  std::ostream& out_;
  std::size_t rows_, announced_ = 0;
  double noise_target_;
  std::size_t timed_rows_ = 0, rows_done_ = 0;
  double seconds_done_ = 0;
  std::chrono::steady_clock::time_point run_started_ = std::chrono::steady_clock::now(), row_started_ = run_started_;
};

// A row that takes long says how far it is ("sample 3/10"), at most every Settings::progress_every_s.
class RowProgress {
 public:
  RowProgress(std::ostream& out, std::string row, double every_s) : out_(out), row_(std::move(row)), every_s_(every_s) {}
  void say(const std::string& what);

 private:
  std::ostream& out_;
  std::string row_;
  double every_s_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now(), said_at_ = started_;
};

}  // namespace tb
