#include "tuner/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <cmath>
#include <cstring>
#include <sstream>

#include "runtime/error.h"
#include "runtime/json_fields.h"
#include "tuner/trial.h"

namespace tb::tune {

using json = nlohmann::json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string last_nonempty_line(const std::string& text) {
  std::stringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// torchrun's summary of a failed group names the first rank that failed ("Root Cause (first observed failure):",
// its rank, exitcode and traceback lines; PyTorch 2.x's torch.distributed.elastic): that rank's ending, and where it
// exited with an error, the last error line a rank printed before the summary (an exception's, or the worker's own
// "torch-step --serve: ..."). "" when `text` holds no summary.
std::string torchrun_failure(const std::string& text) {
  const std::size_t cause = text.find("Root Cause (first observed failure):");
  if (cause == std::string::npos) return "";
  const auto field = [&](const std::string& name) {
    const std::size_t at = text.find("\n  " + name, cause);
    if (at == std::string::npos) return std::string();
    const std::size_t colon = text.find(':', at + 1), end = text.find('\n', at + 1);
    if (colon == std::string::npos || colon > end) return std::string();
    std::string value = text.substr(colon + 1, end == std::string::npos ? std::string::npos : end - colon - 1);
    value.erase(0, value.find_first_not_of(' '));
    return value;
  };
  const std::string rank = field("rank").substr(0, field("rank").find(' '));
  const int code = std::atoi(field("exitcode").c_str());  // negative: the signal that ended it
  std::string said;
  std::stringstream before(text.substr(0, cause));
  for (std::string line; std::getline(before, line);)
    if ((line.find("Error: ") != std::string::npos || line.rfind("torch-step --serve: ", 0) == 0) &&
        line.find("ChildFailedError") == std::string::npos && line.find("torch.distributed.elastic") == std::string::npos)
      said = line.substr(line.find_first_not_of(' '));
  return "rank " + (rank.empty() ? std::string("?") : rank) + " of the torchrun group " +
         ending_text(code < 0 ? -code : 0, code < 0 ? -1 : code, code < 0 ? "" : said);
}

TrialClass class_of_disposition(const std::string& d) {
  if (d == "incorrect") return TrialClass::incorrect;
  if (d == "oom") return TrialClass::oom;
  return TrialClass::error;
}

std::string describe_switches(const Candidate& c) {
  std::string s = "micro-batch " + std::to_string(c.micro_batch);
  for (const auto& [k, v] : c.switches) s += " " + k + "=" + v;
  return s;
}

// A field of the worker's answer to `op`, read strictly (runtime/json_fields.h): one of another type is the worker's
// fault, as an answer that is not JSON is.
template <class Read>
auto answer_field(const std::string& op, Read&& read) {
  try {
    return read();
  } catch (const json_field::FieldError& e) {
    throw WorkerLost(WorkerLost::Why::died, "the worker's " + op + " answer is not what autotune expects: " + e.what());
  }
}

}  // namespace

// ---- the answers --------------------------------------------------------------------------------------------------

json parse_worker_line(const std::string& line) {
  json said;
  try {
    said = json::parse(line);
  } catch (const json::exception& e) {
    // nlohmann quotes what it last read: any bytes.
    throw WorkerLost(WorkerLost::Why::died,
                     "the worker answered something that is not JSON (" + json_field::utf8_or_replaced(e.what()) + ")");
  }
  if (!said.is_object())
    throw WorkerLost(WorkerLost::Why::died, "the worker answered " + std::string(said.type_name()) + ", not an object");
  return said;
}

WorkerHello read_hello(const json& said) {
  return answer_field("hello", [&] {
    WorkerHello h;
    h.protocol = json_field::text(said, "protocol").value_or("");
    h.torch_version = json_field::text(said, "torch").value_or("");
    h.python_version = json_field::text(said, "python").value_or("");
    h.cuda = json_field::flag(said, "cuda").value_or(false);
    h.start_seconds = json_field::number(said, "start_seconds").value_or(0.0);
    return h;
  });
}

OpenAnswer read_open_answer(const json& said) {
  return answer_field("open", [&] {
    OpenAnswer a;
    a.disposition = json_field::text(said, "disposition").value_or("error");
    // An answer of another op's shape ({"error": ...}) says why in "error".
    a.reason = json_field::text(said, "reason")
                   .value_or(json_field::text(said, "error").value_or("the worker gave no reason"));
    a.warning = json_field::text(said, "warning").value_or("");
    a.step_seconds = json_field::number(said, "step_seconds").value_or(0.0);
    a.compile_seconds = json_field::number(said, "compile_seconds").value_or(0.0);
    a.pipelined = json_field::flag(said, "pipelined").value_or(false);
    return a;
  });
}

TimeAnswer read_time_answer(const json& said) {
  return answer_field("time", [&] {
    TimeAnswer a;
    if (const auto error = json_field::text(said, "error")) {
      a.failed = true;
      a.error = error->empty() ? "the worker's steps failed and it gave no reason" : *error;
      a.failed_class = json_field::text(said, "class").value_or("error");
      return a;
    }
    const auto seconds = json_field::number(said, "seconds");
    if (!seconds || *seconds < 0) throw json_field::FieldError("it gives no 'seconds' the steps took");
    a.seconds = *seconds;
    return a;
  });
}

int64_t read_counters_answer(const json& said) {
  return answer_field("counters", [&] { return json_field::integer(said, "peak_bytes").value_or(0); });
}

bool read_close_answer(const json& said) {
  return answer_field("close", [&] { return json_field::flag(said, "restart").value_or(false); });
}

namespace {

// An answer read for the output only (split, profile): its error, or what is wrong with its shape, as `error`.
template <class Answer, class Read>
Answer output_answer(const std::string& op, const json& said, Read read) {
  Answer a;
  try {
    if (const auto error = json_field::text(said, "error")) {
      a.error = error->empty() ? "the worker gave no reason" : *error;
      return a;
    }
    read(a);
  } catch (const json_field::FieldError& e) {
    a = Answer{};
    a.error = "the worker's " + op + " answer is not what autotune expects: " + e.what();
  }
  return a;
}

double seconds_field(const json& said, const std::string& key) {
  const double s = json_field::number(said, key).value_or(0.0);
  if (s < 0) throw json_field::FieldError("'" + key + "' is negative");
  return s;
}

// The candidate's loader settings as the worker said them (data.loader_settings), each of its kind, or null.
json loader_settings_field(const json& said) {
  const json* d = json_field::present(said, "dataloader");
  if (!d) return nullptr;
  if (!d->is_object()) throw json_field::FieldError("'dataloader' is not an object");
  json out = json::object();
  const auto count = [&](const std::string& key, bool nullable) -> json {
    const auto n = json_field::integer(*d, key);
    if (!n) {
      if (nullable) return nullptr;
      throw json_field::FieldError("'dataloader' has no '" + key + "'");
    }
    if (*n < 0 || *n > 1 << 20) throw json_field::FieldError("'dataloader." + key + "' is out of range");
    return *n;
  };
  out["num_workers"] = count("num_workers", false);
  out["prefetch_factor"] = count("prefetch_factor", true);
  out["persistent_workers"] = json_field::flag(*d, "persistent_workers").value_or(false);
  out["pin_memory"] = json_field::flag(*d, "pin_memory").value_or(false);
  out["cpu_threads"] = count("cpu_threads", true);
  return out;
}

}  // namespace

SplitAnswer read_split_answer(const json& said) {
  return output_answer<SplitAnswer>("split", said, [&](SplitAnswer& a) {
    const json* parts = json_field::present(said, "parts");
    if (!parts || !parts->is_object()) throw json_field::FieldError("it has no 'parts' object");
    for (const char* name : {"data", "forward_backward", "optimizer", "communication", "sync"})
      a.parts[name] = seconds_field(*parts, name);
    a.step_seconds = seconds_field(said, "step_seconds");
    a.whole_step_seconds = seconds_field(said, "whole_step_seconds");
    a.steps = std::max<int64_t>(json_field::integer(said, "steps").value_or(0), 0);
    a.dataloader = loader_settings_field(said);
  });
}

ProfileAnswer read_profile_answer(const json& said) {
  return output_answer<ProfileAnswer>("profile", said, [&](ProfileAnswer& a) {
    const auto share = json_field::number(said, "share");
    if (!share) throw json_field::FieldError("it has no 'share'");
    if (*share < 0 || *share > 1) throw json_field::FieldError("'share' is not between 0 and 1");
    a.share = *share;
    a.wall_seconds = seconds_field(said, "wall_seconds");
    a.exposed_seconds = seconds_field(said, "exposed_seconds");
    a.communication_seconds = seconds_field(said, "communication_seconds");
    a.steps = std::max<int64_t>(json_field::integer(said, "steps").value_or(0), 0);
    if (const json* shares = json_field::present(said, "rank_shares")) {
      if (!shares->is_array()) throw json_field::FieldError("'rank_shares' is not a list");
      for (const json& s : *shares) {
        if (!s.is_number() || !std::isfinite(s.get<double>())) throw json_field::FieldError("'rank_shares' holds a non-number");
        a.rank_shares.push_back(s.get<double>());
      }
    }
  });
}

// ---- the process ------------------------------------------------------------------------------------------------

WorkerProcess::WorkerProcess(const std::vector<std::string>& argv, double timeout_s, const std::atomic<bool>* stop)
    : stop_(stop) {
  int ends[2], err[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    throw CallError(__FILE__, __LINE__, "socketpair", std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(ends[0]);
    ::close(ends[1]);
    throw CallError(__FILE__, __LINE__, "pipe2", std::strerror(errno));
  }
  socket_ = ends[0];
  stderr_ = err[0];
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // fork and exec rather than posix_spawn: the child asks the kernel, before it runs the worker, to end it when
  // autotune ends (PR_SET_PDEATHSIG), kill -9 included, so that no worker outlives its tune holding a GPU's memory.
  // Between fork and exec only async-signal-safe calls.
  int exec_failed[2];  // close-on-exec: closes unread when exec succeeds, carries errno when it does not
  if (::pipe2(exec_failed, O_CLOEXEC) != 0) {
    for (const int fd : {ends[0], ends[1], err[0], err[1]}) ::close(fd);
    throw CallError(__FILE__, __LINE__, "pipe2", std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(exec_failed[0]);
    ::setpgid(0, 0);  // its own group: killed whole, with what it started
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // autotune ended before the line above
    ::dup2(ends[1], STDIN_FILENO);            // dup2 clears close-on-exec
    ::dup2(ends[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execvp(args[0], args.data());
    const int why = errno;
    [[maybe_unused]] const ssize_t said = ::write(exec_failed[1], &why, sizeof why);
    ::_exit(127);
  }
  int spawned = pid < 0 ? errno : 0;
  ::close(exec_failed[1]);
  if (pid > 0) {
    ::setpgid(pid, pid);  // as the child does: whichever runs first
    int why = 0;
    ssize_t n = 0;
    while ((n = ::read(exec_failed[0], &why, sizeof why)) < 0 && errno == EINTR) {
    }
    if (n == static_cast<ssize_t>(sizeof why)) {
      spawned = why;
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
  ::close(exec_failed[0]);
  ::close(ends[1]);
  ::close(err[1]);
  if (spawned != 0) {
    ::close(socket_);
    ::close(stderr_);
    throw std::runtime_error("cannot start " + argv.at(0) + ": " + std::strerror(spawned));
  }
  pid_ = pid;
  try {
    hello_ = read_line(timeout_s);
  } catch (const WorkerLost& e) {
    if (e.why == WorkerLost::Why::died && err_.find("torch-step --serve: ") != std::string::npos)
      throw UsageError(last_nonempty_line(err_));
    throw;
  }
  std::string refused;
  try {
    if (read_hello(hello_).protocol != torch_worker_protocol)
      refused = (argv.size() > 1 ? argv[1] : std::string("the worker")) + " does not speak " + torch_worker_protocol +
                " (it is not the script this autotune was built with)";
  } catch (const WorkerLost& e) {
    refused = e.what();
  }
  if (!refused.empty()) {
    // Not constructed: no destructor ends the worker.
    kill_group();
    ::close(socket_);
    ::close(stderr_);
    throw WorkerLost(WorkerLost::Why::died, refused);
  }
}

WorkerProcess::~WorkerProcess() {
  if (socket_ >= 0) ::close(socket_);  // the end of the conversation: the worker's loop ends
  if (pid_ > 0) {
    // A worker between requests exits at once; one in a call (a hang) is killed.
    for (int waited_ms = 0; waited_ms < 2000; waited_ms += 20) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_ || (done < 0 && errno != EINTR)) {
        pid_ = 0;
        break;
      }
      usleep(20000);
    }
    if (pid_ > 0) kill_group();
  }
  if (stderr_ >= 0) ::close(stderr_);
}

void WorkerProcess::kill_group() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = 0;
}

// Any bytes the worker wrote: a trial's message (journaled as JSON) takes UTF-8 only.
std::string WorkerProcess::stderr_tail() const { return json_field::utf8_or_replaced(last_nonempty_line(err_)); }

void WorkerProcess::pump(int wait_ms) {
  pollfd fds[2] = {{socket_closed_ ? -1 : socket_, POLLIN, 0}, {stderr_, POLLIN, 0}};
  if (::poll(fds, 2, wait_ms) <= 0) return;
  char chunk[8192];
  if (fds[0].fd >= 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
    const ssize_t n = ::recv(socket_, chunk, sizeof chunk, 0);
    if (n > 0) in_.append(chunk, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) socket_closed_ = true;
  }
  if (stderr_ >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
    const ssize_t n = ::read(stderr_, chunk, sizeof chunk);
    if (n > 0) {
      err_.append(chunk, static_cast<std::size_t>(n));
      if (err_.size() > 16384) err_.erase(0, err_.size() - 8192);
    } else if (n == 0) {
      ::close(stderr_);
      stderr_ = -1;
    }
  }
}

void WorkerProcess::lost(WorkerLost::Why why, const std::string& what) {
  int signal = 0;
  std::string text = what;
  if (why == WorkerLost::Why::died && pid_ > 0) {
    int status = 0;
    bool ended = false;
    // The socket closed: the process is ending; its status says how.
    for (int waited_ms = 0; waited_ms < 5000; waited_ms += 10) {
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        pid_ = 0;
        ended = true;
        if (WIFSIGNALED(status)) signal = WTERMSIG(status);
        break;
      }
      if (done < 0 && errno != EINTR) break;
      usleep(10000);
    }
    while (stderr_ >= 0) pump(50);  // what it said last
    const std::string tail = stderr_tail();
    if (const std::string rank = json_field::utf8_or_replaced(torchrun_failure(err_)); ended && !rank.empty()) text = rank;
    else if (ended) text = ending_text(signal, WIFEXITED(status) ? WEXITSTATUS(status) : -1, tail);
    else if (!tail.empty()) text += ": " + tail;
  }
  kill_group();
  if (socket_ >= 0) ::close(socket_);
  socket_ = -1;
  throw WorkerLost(why, text, signal);
}

json WorkerProcess::read_line(double timeout_s) {
  const auto started = std::chrono::steady_clock::now();
  for (;;) {
    if (const auto end = in_.find('\n'); end != std::string::npos) {
      const std::string line = in_.substr(0, end);
      in_.erase(0, end + 1);
      try {
        return parse_worker_line(line);
      } catch (const WorkerLost& e) {
        lost(WorkerLost::Why::died, e.what());
      }
    }
    if (socket_closed_) lost(WorkerLost::Why::died, "the worker ended");
    if (stop_ && stop_->load()) lost(WorkerLost::Why::interrupted, "interrupted");
    if (seconds_since(started) > timeout_s) {
      std::ostringstream why;
      why << "no answer within " << std::lround(timeout_s) << " s: the worker hung or is far too slow (killed)";
      lost(WorkerLost::Why::hung, why.str());
    }
    pump(50);
  }
}

json WorkerProcess::request(const json& message, double timeout_s) {
  if (socket_ < 0) throw WorkerLost(WorkerLost::Why::died, "the worker has ended");
  const std::string line = message.dump() + "\n";
  for (std::size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(socket_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) lost(WorkerLost::Why::died, "the worker ended");
    sent += static_cast<std::size_t>(n);
  }
  return read_line(timeout_s);
}

json WorkerStats::to_json() const {
  return json{{"starts", starts}, {"restarts", restarts}, {"restart_reasons", reasons}, {"start_seconds", start_seconds}};
}

// ---- the executor -----------------------------------------------------------------------------------------------

WorkerExecutor::WorkerExecutor(std::vector<std::string> argv, OpenRequest open_request, int64_t capacity,
                               const std::atomic<bool>* stop, int64_t ranks)
    : argv_(std::move(argv)),
      open_request_(std::move(open_request)),
      capacity_(capacity),
      ranks_(ranks),
      stop_(stop),
      hang_floor_(kHangFloorSeconds) {}

WorkerExecutor::~WorkerExecutor() = default;

const json& WorkerExecutor::start(double timeout_s) {
  if (!process_) {
    const auto started = std::chrono::steady_clock::now();
    process_ = std::make_unique<WorkerProcess>(argv_, timeout_s, stop_);
    stats_.start_seconds += seconds_since(started);
    if (stats_.starts++ > 0) {
      ++stats_.restarts;
      stats_.reasons.push_back(pending_reason_);
    }
    pending_reason_.clear();
  }
  return process_->hello();
}

json WorkerExecutor::request(const json& message, double timeout_s) {
  start(timeout_s);
  try {
    return process_->request(message, timeout_s);
  } catch (const WorkerLost& e) {
    process_.reset();
    pending_reason_ = std::string(message.value("op", "a request")) + ": " + e.what();
    throw;
  }
}

// A trial's clock, and how long each of its requests may go unanswered: a hang is told from slow work by what the
// work is expected to take; with a budget, the request also ends by the budget's end (and that is the budget's,
// not the candidate's: budget_cut()).
class WorkerExecutor::TrialClock {
 public:
  TrialClock(const MeasurePolicy& policy, double hang_floor)
      : started_(std::chrono::steady_clock::now()),
        policy_(policy),
        hang_floor_(hang_floor),
        hang_limit_(3 * policy.max_seconds + 120) {}
  double elapsed() const { return seconds_since(started_); }
  // The limit of a request expected to take `expected` seconds (0: nothing to go by).
  double limit(double expected) {
    double l = expected > 0 ? std::max(hang_floor_, kHangFactor * expected) : hang_limit_;
    budget_cut_ = false;
    if (policy_.wall_seconds > 0) {
      const double left = policy_.wall_seconds + kill_grace_seconds - elapsed();
      if (left < l) l = std::max(left, 0.1), budget_cut_ = true;
    }
    return l;
  }
  bool budget_cut() const { return budget_cut_; }  // the last limit given was the budget's end

 private:
  std::chrono::steady_clock::time_point started_;
  const MeasurePolicy& policy_;
  double hang_floor_, hang_limit_;
  bool budget_cut_ = false;
};

TrialResult WorkerExecutor::run(const Candidate& candidate, const MeasurePolicy& policy) {
  TrialClock clock(policy, hang_floor_);
  TrialResult r;
  try {
    // The worker's start (importing torch and the entry) is the tune's, not this candidate's: not in its set-up.
    if (!process_) start(clock.limit(0));
    const json said = open_candidate(candidate, clock, r);
    if (r.ok() && measure_candidate(candidate, said, policy, clock, r)) close_measured(candidate, said, clock, r);
    r.seconds = clock.elapsed();
    return r;
  } catch (const WorkerLost& e) {
    return lost_candidate(candidate, e, clock, r);
  }
}

json WorkerExecutor::open_candidate(const Candidate& candidate, TrialClock& clock, TrialResult& r) {
  const auto opening = std::chrono::steady_clock::now();
  const bool compiles = candidate.switches.count("compile") && candidate.switches.at("compile") == "on";
  json open = open_request_(candidate);
  open["op"] = "open";
  // A candidate that compiles, or the first one (the reference step, PyTorch's first use): no history to go by.
  const json said = process_->request(open, clock.limit(compiles || slowest_open_ <= 0 ? 0 : slowest_open_));
  const double open_seconds = seconds_since(opening);
  r.setup_seconds = open_seconds;
  const OpenAnswer answer = read_open_answer(said);
  // What the user should know of the entry whatever the candidate (its batches the same on every rank), once
  if (!answer.warning.empty() && warned_.insert(answer.warning).second)
    std::cerr << "autotune: warning: " << answer.warning << std::endl;
  if (answer.disposition != "passed") {
    close_candidate(candidate, true, clock.limit(slowest_open_ > 0 ? slowest_open_ : 0),
                    answer.disposition + ", memory held after it");
    r.cls = class_of_disposition(answer.disposition);
    r.message = answer.reason;
    return said;
  }
  if (!compiles) slowest_open_ = std::max(slowest_open_, open_seconds);
  return said;
}

bool WorkerExecutor::measure_candidate(const Candidate& candidate, const json& said, const MeasurePolicy& policy,
                                       TrialClock& clock, TrialResult& r) {
  const OpenAnswer opened = read_open_answer(said);
  const double opened_step_seconds = opened.step_seconds;
  double step_seconds = std::max(opened_step_seconds, 1e-6);
  // The steps' failure as the worker said it: thrown out of the sampler to end the measuring.
  struct StepsFailed {
    TimeAnswer answer;
  };
  StepSampler sampler;
  sampler.elapsed = [&] { return clock.elapsed(); };
  sampler.pipelined = r.pipelined = opened.pipelined;
  sampler.time_steps = [&](int64_t steps) {
    const TimeAnswer t = read_time_answer(
        process_->request({{"op", "time"}, {"calls", steps}}, clock.limit(step_seconds * static_cast<double>(steps))));
    if (t.failed) throw StepsFailed{t};
    step_seconds = std::max(step_seconds, t.seconds / static_cast<double>(std::max<int64_t>(steps, 1)));
    return t.seconds;
  };
  try {
    measure_steps(sampler, opened_step_seconds, policy, static_cast<double>(candidate.global_batch * ranks_), r);
    return true;
  } catch (const StepsFailed& failed) {
    close_candidate(candidate, true, clock.limit(slowest_open_), failed.answer.failed_class + " while stepping");
    r.cls = class_of_disposition(failed.answer.failed_class);  // oom, incorrect (a NaN loss), or an error
    r.message = failed.answer.error;
    return false;
  }
}

void WorkerExecutor::close_measured(const Candidate& candidate, const json& said, TrialClock& clock, TrialResult& r) {
  r.peak_bytes = read_counters_answer(process_->request({{"op", "counters"}}, clock.limit(1)));
  close_candidate(candidate, false, clock.limit(slowest_open_), "memory held after it");
  if (const double compiled = read_open_answer(said).compile_seconds; compiled > 0) {
    std::ostringstream note;
    note.precision(1);
    note << std::fixed << "torch.compile: " << compiled << " s of compilation in its first step (not in the step time)";
    r.message = r.message.empty() ? note.str() : r.message + "; " + note.str();
  }
}

json WorkerExecutor::profile(const Candidate& candidate, int64_t steps, double timeout_s) {
  return opened_request(candidate, {{"op", "profile"}, {"steps", steps}}, timeout_s);
}

json WorkerExecutor::split(const Candidate& candidate, int64_t steps, double timeout_s) {
  return opened_request(candidate, {{"op", "split"}, {"steps", steps}}, timeout_s);
}

json WorkerExecutor::opened_request(const Candidate& candidate, const json& request, double timeout_s) {
  // Opened and closed as a trial's candidate is, each request under the same hang limits; the whole within timeout_s.
  MeasurePolicy policy;
  policy.max_seconds = policy.wall_seconds = timeout_s;
  TrialClock clock(policy, hang_floor_);
  TrialResult r;
  try {
    if (!process_) start(clock.limit(0));
    open_candidate(candidate, clock, r);
    if (!r.ok()) return {{"error", r.message}};
    // A request's first use in the worker (torch.profiler's) has no history to go by: the request's own limit.
    json answered = process_->request(request, clock.limit(0));
    close_candidate(candidate, false, clock.limit(slowest_open_), "memory held after it");
    return answered;
  } catch (const WorkerLost& e) {
    process_.reset();
    pending_reason_ = describe_switches(candidate) + ", " + request.value("op", "") + ": " + e.what();
    return {{"error", e.what()}};
  }
}

void WorkerExecutor::close_candidate(const Candidate& candidate, bool failed, double timeout_s,
                                     const std::string& held_after) {
  json close{{"op", "close"}};
  if (failed) close["failed"] = true;
  if (read_close_answer(process_->request(close, timeout_s))) {
    pending_reason_ = describe_switches(candidate) + ": " + held_after;
    process_.reset();
  }
}

TrialResult WorkerExecutor::lost_candidate(const Candidate& candidate, const WorkerLost& e, const TrialClock& clock,
                                           TrialResult r) {
  process_.reset();
  if (e.why == WorkerLost::Why::hung && clock.budget_cut()) {
    pending_reason_ = describe_switches(candidate) + ": stopped at the budget's end";
    throw OutOfBudget("the budget ended before the trial had a result (the worker was stopped)");
  }
  pending_reason_ = describe_switches(candidate) + ": " + e.what();
  if (e.why == WorkerLost::Why::interrupted) {
    r.cls = TrialClass::error;
    r.message = "interrupted";
  } else if (e.why == WorkerLost::Why::hung) {
    r.cls = TrialClass::timeout;
    r.message = e.what();
  } else {
    r.cls = e.signal == SIGKILL ? TrialClass::oom : TrialClass::error;
    r.message = e.what();
  }
  r.seconds = clock.elapsed();
  return r;
}

}  // namespace tb::tune
