// CUDA launch: an (almost) empty kernel launched alone or waited for, and the window of small
// kernels run eagerly, replayed from a graph captured once, captured and instantiated every time,
// and replayed after an in-place update of the nodes whose by-value learning rate changed.
#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "launch.h"
#include "runtime/cuda_raii.h"
#include "runtime/defaults.h"

namespace tb::launch {

namespace {

using cuda::Graph;
using cuda::GraphExec;

constexpr int block_size = 256;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// As close to empty as a kernel can be and still prove it ran: one thread counts the launch.
__global__ void count_kernel(unsigned long long* launches) { *launches += 1; }

// One kernel of the window: dst = a * dst + b * src + c over a small tensor.
__global__ void window_kernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n, float a, float b, float c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = update_element(a, dst[i], b, src[i], c);
}

class EmptyLaunch final : public Instance {
 public:
  EmptyLaunch(const RunContext& ctx, bool wait) : wait_(wait), stream_(cuda::as_stream(ctx.cuda_stream)), counter_(1) {
    CUDA_CHECK(cudaMemsetAsync(counter_.data(), 0, counter_.bytes(), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    const auto t0 = Clock::now();
    count_kernel<<<1, 1, 0, stream_>>>(counter_.data());
    if (wait_) CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_s_ += seconds_since(t0);
    ++launches_;
  }
  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    unsigned long long ran = 0;
    CUDA_CHECK(cudaMemcpy(&ran, counter_.data(), sizeof ran, cudaMemcpyDeviceToHost));
    if (ran != launches_)
      return Verdict{false, static_cast<double>(launches_) - static_cast<double>(ran),
                     std::to_string(ran) + " of " + std::to_string(launches_) + " launches ran"};
    return Verdict{true, 0, ""};
  }
  // The host's side: what the launch call costs (and, with the wait, the whole round trip).
  std::vector<std::pair<std::string, double>> observed() const override {
    if (launches_ == 0) return {};
    return {{wait_ ? "host_round_trip_us" : "host_enqueue_us", 1e6 * host_s_ / static_cast<double>(launches_)}};
  }

 private:
  bool wait_;
  cudaStream_t stream_;
  cuda::DeviceBuffer<unsigned long long> counter_;
  unsigned long long launches_ = 0;
  double host_s_ = 0;
};

// The node just captured into `stream`: the one the next captured work would depend on.
cudaGraphNode_t last_captured_node(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t count = 0;
#if CUDART_VERSION >= 13000
  CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, nullptr, &count));
#else
  CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, &count));
#endif
  TB_REQUIRE(status == cudaStreamCaptureStatusActive && count == 1 && deps != nullptr,
             "expected one captured node at the end of the stream");
  return deps[0];
}

class Window final : public Instance {
 public:
  Window(const Problem& p, const RunContext& ctx, Mode mode)
      : mode_(mode),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        n_(p.get_int("elements")),
        window_(build_window(p.get_int("steps"), p.get_int("kernels_per_step"))),
        state_(static_cast<std::size_t>(state_buffers * n_)) {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.cuda_device));
    grid_ = static_cast<int>(std::clamp<int64_t>((n_ + block_size - 1) / block_size, 1, int64_t{sms} * 4));
    const std::vector<float> initial = initial_state(n_);
    CUDA_CHECK(cudaMemcpyAsync(state_.data(), initial.data(), state_.bytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (mode_ == Mode::graph || mode_ == Mode::graph_update) {
      graph_ = capture(lr_for_window(0), mode_ == Mode::graph_update ? &update_nodes_ : nullptr);
      exec_ = GraphExec(graph_);
      exec_lr_ = lr_for_window(0);
    }
  }

  void run() override {
    switch (mode_) {
      case Mode::eager: {
        const auto t0 = Clock::now();
        enqueue_window(fixed_lr, nullptr);
        host_s_ += seconds_since(t0);
        break;
      }
      case Mode::graph:
        CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream_));
        break;
      case Mode::graph_with_capture: {
        const auto t0 = Clock::now();
        const Graph graph = capture(fixed_lr, nullptr);
        const auto t1 = Clock::now();
        const GraphExec exec(graph);
        instantiate_s_ += seconds_since(t1);
        capture_s_ += std::chrono::duration<double>(t1 - t0).count();
        CUDA_CHECK(cudaGraphLaunch(exec.get(), stream_));
        break;
      }
      case Mode::graph_update: {
        const float lr = lr_for_window(windows_);
        if (lr != exec_lr_) {
          const auto t0 = Clock::now();
          set_lr(lr);
          host_s_ += seconds_since(t0);
          ++updates_;
        }
        CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream_));
        break;
      }
    }
    ++windows_;
  }

  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> got(state_.size());
    CUDA_CHECK(cudaMemcpy(got.data(), state_.data(), state_.bytes(), cudaMemcpyDeviceToHost));
    return check_state(got, reference_state(window_, n_, windows_, mode_ == Mode::graph_update), n_);
  }

  std::vector<std::pair<std::string, double>> observed() const override {
    if (windows_ == 0) return {};
    const double windows = static_cast<double>(windows_), kernels = static_cast<double>(window_.size());
    switch (mode_) {
      case Mode::eager:
        return {{"host_enqueue_us_per_kernel", 1e6 * host_s_ / windows / kernels}};
      case Mode::graph_with_capture:
        return {{"capture_us", 1e6 * capture_s_ / windows}, {"instantiate_us", 1e6 * instantiate_s_ / windows}};
      case Mode::graph_update:
        return {{"node_updates_per_window",
                 static_cast<double>(updates_) * static_cast<double>(update_nodes_.size()) / windows},
                {"update_us_per_window", 1e6 * host_s_ / windows}};
      case Mode::graph:
        // Reading a const instance's observations runs more windows on the device; the state is
        // past its check by then, and the count is kept so a later check stays right.
        return const_cast<Window*>(this)->economics();
    }
    return {};
  }

 private:
  void enqueue_window(float lr, std::vector<cudaGraphNode_t>* update_nodes) {
    float* state = state_.data();
    for (const WindowKernel& k : window_) {
      window_kernel<<<grid_, block_size, 0, stream_>>>(state + k.dst * n_, state + k.src * n_, n_, k.a, coefficient_b(k, lr),
                                                       k.c);
      if (update_nodes && k.takes_lr) update_nodes->push_back(last_captured_node(stream_));
    }
  }

  // The window as a graph, captured on the benchmark's own stream (thread-local mode: other
  // threads' CUDA calls are not affected).
  Graph capture(float lr, std::vector<cudaGraphNode_t>* update_nodes) {
    cuda::CaptureScope scope(stream_);
    enqueue_window(lr, update_nodes);
    return scope.end();
  }

  // Rewrites the by-value learning rate of every update node in the executable graph.
  void set_lr(float lr) {
    std::size_t u = 0;
    for (const WindowKernel& k : window_) {
      if (!k.takes_lr) continue;
      float* dst = state_.data() + k.dst * n_;
      const float* src = state_.data() + k.src * n_;
      int64_t n = n_;
      float a = k.a, b = coefficient_b(k, lr), c = k.c;
      void* args[] = {&dst, &src, &n, &a, &b, &c};
      cudaKernelNodeParams params{};
      params.func = reinterpret_cast<void*>(&window_kernel);
      params.gridDim = dim3(static_cast<unsigned>(grid_));
      params.blockDim = dim3(block_size);
      params.sharedMemBytes = 0;
      params.kernelParams = args;
      params.extra = nullptr;
      CUDA_CHECK(cudaGraphExecKernelNodeSetParams(exec_.get(), update_nodes_.at(u++), &params));
    }
    exec_lr_ = lr;
  }

  // The same window eager, replayed, and captured + instantiated, timed here one after another on
  // one stream: the per-kernel saving and the number of replays that pay for the capture.
  std::vector<std::pair<std::string, double>> economics() {
    if (economics_) return *economics_;
    try {
      cuda::Event begin, end;
      const int repeats = defaults::launch_breakeven_windows;
      auto time_windows = [&](auto&& one_window) {
        for (int i = 0; i < 2; ++i) one_window();  // warm
        CUDA_CHECK(cudaEventRecord(begin, stream_));
        for (int i = 0; i < repeats; ++i) one_window();
        CUDA_CHECK(cudaEventRecord(end, stream_));
        CUDA_CHECK(cudaEventSynchronize(end));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
        windows_ += repeats + 2;
        return 1e-3 * static_cast<double>(ms) / repeats;
      };
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      const double eager_s = time_windows([&] { enqueue_window(fixed_lr, nullptr); });
      const double replay_s = time_windows([&] { CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream_)); });
      std::vector<double> build_s;
      for (int i = 0; i < defaults::launch_breakeven_captures; ++i) {
        const auto t0 = Clock::now();
        const Graph graph = capture(fixed_lr, nullptr);
        const GraphExec exec(graph);
        build_s.push_back(seconds_since(t0));
      }
      std::sort(build_s.begin(), build_s.end());
      const double capture_s = build_s[build_s.size() / 2];
      const auto kernels = static_cast<int64_t>(window_.size());
      std::vector<std::pair<std::string, double>> out{{"eager_us_per_kernel", 1e6 * eager_s / static_cast<double>(kernels)},
                                                      {"graph_us_per_kernel", 1e6 * replay_s / static_cast<double>(kernels)},
                                                      {"saving_us_per_kernel",
                                                       1e6 * saving_per_kernel_s(eager_s, replay_s, kernels)},
                                                      {"capture_instantiate_us", 1e6 * capture_s}};
      const double breakeven = breakeven_replays(capture_s, eager_s, replay_s);
      if (std::isfinite(breakeven)) out.emplace_back("breakeven_replays", breakeven);
      economics_ = out;
    } catch (const std::exception&) {
      economics_.emplace();  // observations are extras: a failure here must not fail the row
    }
    return *economics_;
  }

  Mode mode_;
  cudaStream_t stream_;
  int64_t n_;
  std::vector<WindowKernel> window_;
  cuda::DeviceBuffer<float> state_;
  int grid_ = 1;
  Graph graph_;
  GraphExec exec_;
  std::vector<cudaGraphNode_t> update_nodes_;  // graph_update: the update kernels' nodes, in window order
  float exec_lr_ = 0;
  int64_t windows_ = 0;  // windows run so far, over all calls
  int64_t updates_ = 0;
  double host_s_ = 0, capture_s_ = 0, instantiate_s_ = 0;
  std::optional<std::vector<std::pair<std::string, double>>> economics_;
};

}  // namespace

std::unique_ptr<Instance> make_cuda_empty(const Problem&, const RunContext& context, bool wait) {
  return std::make_unique<EmptyLaunch>(context, wait);
}

std::unique_ptr<Instance> make_cuda_window(const Problem& problem, const RunContext& context, Mode mode) {
  return std::make_unique<Window>(problem, context, mode);
}

}  // namespace tb::launch
