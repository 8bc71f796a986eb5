// autotune's stop signals: SIGINT, SIGTERM and SIGHUP stop a tune in any phase; the first one names the exit
// code (128 + it) and what autotune says on stopping.
#include <signal.h>

#include <atomic>
#include <csignal>
#include <string>

#include "tuner/autotune_parts.h"

namespace tb::tune {

std::atomic<bool> stop_requested{false};

namespace {

volatile std::sig_atomic_t stop_signal = 0;  // the first signal that asked, 0: none

}  // namespace

// SIGINT (Ctrl-C), SIGTERM (a job scheduler's stop, `timeout`, CI's limit) and SIGHUP (the terminal gone) stop a
// tune alike, in every phase: the trial or slice in flight is stopped (its process group killed and waited for,
// the worker's too), and the best so far and the journal are written before autotune exits 128 + the signal.
// Without SA_RESTART, a blocking wait returns at once and its loop sees the stop; a second signal changes nothing.
void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = [](int signal) {
    if (!stop_signal) stop_signal = signal;
    stop_requested = true;
  };
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
}

int interrupted_exit_code() { return 128 + (stop_signal ? static_cast<int>(stop_signal) : SIGINT); }

std::string stop_signal_name() {
  switch (stop_signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "SIGINT";
  }
}

}  // namespace tb::tune
