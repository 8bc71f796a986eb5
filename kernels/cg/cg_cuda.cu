// CUDA `cg`: three ways to drive the same CG on the device, each started cold, warm or lazily (cg.h).
//   host_checked  one kernel per step of an iteration; the host reads the residual norm back after
//                 every iteration (one sync each), the pattern of `if rs.sqrt() < tol: break`.
//   graph         k iterations captured once in a CUDA graph and replayed; the convergence flag is
//                 tested on the device (kernels after convergence return at once) and read by the
//                 host after every replay: one sync per k iterations.
//   persistent    one cooperative kernel runs the whole solve, grid barriers between its phases;
//                 the host never waits.
// All three run the same phases (csr matvec with a dot, axpys with a dot, direction update) with the
// same grid, and every reduction is summed per block, then over blocks in a fixed order: a window
// takes identical decisions under every strategy and on every replay.
// Also the propagator's form (rows.h): CudaRows, the primitives the training step's solve runs on, and
// the variants rows_cold, rows_warm, rows_lazy over them.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cg/cg.h"
#include "runtime/cuda_raii.h"
#include "runtime/cuda_reduce.cuh"
#include "runtime/defaults.h"
#include "runtime/host_buffer.h"
#include "spmv/csr_device.cuh"

namespace tb::cg {

namespace {

namespace groups = cooperative_groups;
using spmv::device::csr_row;
using spmv::device::CsrView;

constexpr int block_size = 256;
constexpr int warps_per_block = block_size / 32;

// One solve's scalars, on the device.
struct Scalars {
  double rr = 0, bb = 0, alpha = 0, beta = 0;
  int iteration = 0, done = 0, skipped = 0;
};

// What every solve so far did, summed on the device (read by tally()).
struct Totals {
  unsigned long long solves = 0, skips = 0, iterations = 0, matvecs = 0;
  double worst = 0;
};

struct Control {
  double tol2 = 0, lazy_tol2 = 0;  // squared relative tolerances
  int max_iterations = 0;
};

// The solver's device state, by value into every kernel. Partials: pq in a; r.r in b; b.b in c.
struct State {
  int64_t n = 0;
  double *x = nullptr, *r = nullptr, *p = nullptr, *q = nullptr;
  double *partial_a = nullptr, *partial_b = nullptr, *partial_c = nullptr;
  unsigned int* arrivals = nullptr;  // blocks done with the current kernel (last-block reduction)
  Scalars* s = nullptr;
  Totals* totals = nullptr;
};

// How a launch starts a solve: not at all (it finishes one a start-only launch began), from x = 0,
// from the cache with the gate, or from the cache without it.
enum StartMode : int { start_none = 0, start_cold = 1, start_gate = 2, start_warm = 3 };

// ---- reductions: fixed order, so deterministic -----------------------------------------------------

__device__ inline double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The block's sum of v, returned to every thread.
__device__ double block_sum(double v) {
  __shared__ double warp_totals[warps_per_block];
  __shared__ double total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const double w = warp_sum(lane < warps_per_block ? warp_totals[lane] : 0.0);
    if (lane == 0) total = w;
  }
  __syncthreads();
  const double result = total;
  __syncthreads();  // the shared slots are reused by the next call
  return result;
}

// Sum of one partial per block, in block order, returned to every thread. L2 loads: the partials
// were written by other blocks.
__device__ double sum_partials(const double* partials, int count) {
  double v = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) v += __ldcg(partials + i);
  return block_sum(v);
}

// Multi-kernel strategies: store this block's partials; true in every thread of the last block.
__device__ bool arrive_last(const State& st, double* partial, double value, double* partial2 = nullptr, double value2 = 0) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = value;
    if (partial2) partial2[blockIdx.x] = value2;
    __threadfence();
    last = atomicAdd(st.arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  return last;
}

// ---- the phases, shared by every strategy -----------------------------------------------------------

// Rows by groups of G lanes, grid-stride; every lane of a warp makes the same trips (csr_row's
// shuffles are warp-wide), lanes past the last row get a row >= n.
template <int G, class F>
__device__ void for_rows(int64_t n, F&& f) {
  constexpr int64_t rows_per_warp = 32 / G;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int64_t stride = int64_t{gridDim.x} * (blockDim.x / 32) * rows_per_warp;
  const int lane = threadIdx.x % 32;
  for (int64_t base = warp * rows_per_warp; base < n; base += stride) f(base + lane / G, lane % G);
}

template <class F>
__device__ void for_elements(int64_t n, F&& f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) f(i);
}

// The warm start, which the gate decides on: r = b - A x (one matvec), p = r; block sums of r.r
// and b.b.
template <int G>
__device__ double2 phase_residual(const CsrView& a, const double* __restrict__ b, const State& st) {
  double rr = 0, bb = 0;
  for_rows<G>(st.n, [&](int64_t row, int lane) {
    const double ax = csr_row<G>(a, st.x, row, lane);
    if (lane == 0 && row < st.n) {
      const double ri = b[row] - ax;
      st.r[row] = ri;
      st.p[row] = ri;
      rr += ri * ri;
      bb += b[row] * b[row];
    }
  });
  return make_double2(block_sum(rr), block_sum(bb));
}

// Without the gate: x = 0, r = p = b; block sum of b.b.
__device__ double phase_cold(const double* __restrict__ b, const State& st) {
  double bb = 0;
  for_elements(st.n, [&](int64_t i) {
    const double bi = b[i];
    st.x[i] = 0.0;
    st.r[i] = bi;
    st.p[i] = bi;
    bb += bi * bi;
  });
  return block_sum(bb);
}

// q = A p; block sum of p.q.
template <int G>
__device__ double phase_matvec(const CsrView& a, const State& st) {
  double pq = 0;
  for_rows<G>(st.n, [&](int64_t row, int lane) {
    const double q = csr_row<G>(a, st.p, row, lane);
    if (lane == 0 && row < st.n) {
      st.q[row] = q;
      pq += st.p[row] * q;
    }
  });
  return block_sum(pq);
}

// x += alpha p, r -= alpha q; block sum of the new r.r.
__device__ double phase_update(const State& st, double alpha) {
  double rr = 0;
  for_elements(st.n, [&](int64_t i) {
    st.x[i] += alpha * st.p[i];
    const double ri = st.r[i] - alpha * st.q[i];
    st.r[i] = ri;
    rr += ri * ri;
  });
  return block_sum(rr);
}

__device__ void phase_direction(const State& st, double beta) {
  for_elements(st.n, [&](int64_t i) { st.p[i] = st.r[i] + beta * st.p[i]; });
}

// ---- decisions: the same arithmetic wherever they are taken; only `writer` updates the totals --------

__device__ double relative(double rr, double bb) { return bb > 0 ? sqrt(rr / bb) : sqrt(rr); }

__device__ void on_gate(Scalars& s, Totals* t, bool writer, const Control& c, double rr, double bb) {
  s = Scalars{};
  s.rr = rr;
  s.bb = bb;
  s.done = s.skipped = rr <= c.lazy_tol2 * bb;
  if (!writer) return;
  t->matvecs += 1;
  if (s.skipped) {
    t->solves += 1;
    t->skips += 1;
    t->worst = fmax(t->worst, relative(rr, bb));
  }
}

// Without the gate: never skipped; done at once only when the cache already meets tol (a solve of
// no iterations, as the CPU's loop that tests before iterating).
__device__ void on_warm(Scalars& s, Totals* t, bool writer, const Control& c, double rr, double bb) {
  s = Scalars{};
  s.rr = rr;
  s.bb = bb;
  s.done = rr <= c.tol2 * bb;
  if (!writer) return;
  t->matvecs += 1;
  if (s.done) {
    t->solves += 1;
    t->worst = fmax(t->worst, relative(rr, bb));
  }
}

__device__ void on_cold(Scalars& s, Totals* t, bool writer, double bb) {
  s = Scalars{};
  s.rr = s.bb = bb;
  s.done = !(bb > 0);  // b = 0: x = 0 is the solution
  if (writer && s.done) t->solves += 1;
}

__device__ void on_iteration(Scalars& s, Totals* t, bool writer, const Control& c, double rr) {
  s.beta = rr / s.rr;
  s.rr = rr;
  s.iteration += 1;
  s.done = rr <= c.tol2 * s.bb || s.iteration >= c.max_iterations;
  if (!writer || !s.done) return;
  t->solves += 1;
  t->iterations += s.iteration;
  t->matvecs += s.iteration;
  t->worst = fmax(t->worst, relative(rr, s.bb));
}

// ---- multi-kernel strategies (host_checked, graph): one kernel per phase, the last block decides ----

// The warm start's residual, then the gate's verdict (start_gate) or none (start_warm).
template <int G>
__global__ void residual_kernel(CsrView a, const double* b, State st, Control c, int start) {
  const double2 sums = phase_residual<G>(a, b, st);
  if (!arrive_last(st, st.partial_b, sums.x, st.partial_c, sums.y)) return;
  const double rr = sum_partials(st.partial_b, gridDim.x), bb = sum_partials(st.partial_c, gridDim.x);
  if (threadIdx.x == 0) {
    Scalars s;
    if (start == start_gate) on_gate(s, st.totals, true, c, rr, bb);
    else on_warm(s, st.totals, true, c, rr, bb);
    *st.s = s;
    *st.arrivals = 0;
  }
}

__global__ void cold_kernel(const double* b, State st) {
  const double bb_part = phase_cold(b, st);
  if (!arrive_last(st, st.partial_b, bb_part)) return;
  const double bb = sum_partials(st.partial_b, gridDim.x);
  if (threadIdx.x == 0) {
    Scalars s;
    on_cold(s, st.totals, true, bb);
    *st.s = s;
    *st.arrivals = 0;
  }
}

// Kernels after convergence return at once: a replayed graph may run past it.
template <int G>
__global__ void matvec_kernel(CsrView a, State st) {
  if (st.s->done) return;
  const double pq_part = phase_matvec<G>(a, st);
  if (!arrive_last(st, st.partial_a, pq_part)) return;
  const double pq = sum_partials(st.partial_a, gridDim.x);
  if (threadIdx.x == 0) {
    st.s->alpha = st.s->rr / pq;
    *st.arrivals = 0;
  }
}

__global__ void update_kernel(State st, Control c) {
  if (st.s->done) return;
  const double rr_part = phase_update(st, st.s->alpha);
  if (!arrive_last(st, st.partial_b, rr_part)) return;
  const double rr = sum_partials(st.partial_b, gridDim.x);
  if (threadIdx.x == 0) {
    Scalars s = *st.s;
    on_iteration(s, st.totals, true, c, rr);
    *st.s = s;
    *st.arrivals = 0;
  }
}

__global__ void direction_kernel(State st) {
  if (st.s->done) return;
  phase_direction(st, st.s->beta);
}

// ---- persistent: the whole solve in one cooperative launch -----------------------------------------
// Every block sums the partials itself (same order, same result), so every block takes the same
// decisions without another barrier. Partials alternate between arrays so that no block overwrites
// one that a slower block is still summing.
template <int G>
__global__ void __launch_bounds__(block_size, 4)
    persistent_kernel(CsrView a, const double* b, State st, Control c, int start, int iterate) {
  groups::grid_group grid = groups::this_grid();
  const bool writer = blockIdx.x == 0 && threadIdx.x == 0;
  Scalars s;
  if (start == start_gate || start == start_warm) {
    const double2 sums = phase_residual<G>(a, b, st);
    if (threadIdx.x == 0) {
      st.partial_b[blockIdx.x] = sums.x;
      st.partial_c[blockIdx.x] = sums.y;
    }
    grid.sync();
    const double rr = sum_partials(st.partial_b, gridDim.x), bb = sum_partials(st.partial_c, gridDim.x);
    if (start == start_gate) on_gate(s, st.totals, writer, c, rr, bb);
    else on_warm(s, st.totals, writer, c, rr, bb);
  } else if (start == start_cold) {
    const double bb_part = phase_cold(b, st);
    if (threadIdx.x == 0) st.partial_b[blockIdx.x] = bb_part;
    grid.sync();
    on_cold(s, st.totals, writer, sum_partials(st.partial_b, gridDim.x));
  } else {
    s = *st.s;  // finish what a start-only launch began
  }
  if (iterate) {
    while (!s.done) {
      const double pq_part = phase_matvec<G>(a, st);
      if (threadIdx.x == 0) st.partial_a[blockIdx.x] = pq_part;
      grid.sync();
      s.alpha = s.rr / sum_partials(st.partial_a, gridDim.x);
      const double rr_part = phase_update(st, s.alpha);
      if (threadIdx.x == 0) st.partial_b[blockIdx.x] = rr_part;
      grid.sync();
      on_iteration(s, st.totals, writer, c, sum_partials(st.partial_b, gridDim.x));
      if (!s.done) {
        phase_direction(st, s.beta);
        grid.sync();
      }
    }
  }
  if (writer) *st.s = s;
}

// ---- host side --------------------------------------------------------------------------------------

struct GraphOwner {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphOwner() = default;
  GraphOwner(const GraphOwner&) = delete;
  GraphOwner& operator=(const GraphOwner&) = delete;
  ~GraphOwner() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

template <class F>
void with_lanes(int lanes, F&& f) {
  spmv::device::with_lanes(lanes, std::forward<F>(f));
}

class CudaCg final : public WindowSolver {
 public:
  CudaCg(const Problem& p, const RunContext& ctx, Strategy strategy, Start start)
      : WindowSolver(p, start),
        strategy_(strategy),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        a_(spmv::device::upload(laplacian::build_shifted_laplacian(graph_, settings_.alpha))),
        n_(settings_.rows),
        x_(n_),
        cache_(n_),
        r_(n_),
        p_(n_),
        q_(n_),
        rhs_device_(static_cast<std::size_t>(n_) * static_cast<std::size_t>(settings_.window + 1)),
        scalars_(1),
        totals_(1),
        arrivals_(1),
        host_scalars_(1) {
    counts_syncs_ = true;
    control_ = Control{settings_.tol * settings_.tol, settings_.lazy_tol * settings_.lazy_tol, settings_.max_iterations};
    CUDA_CHECK(cudaMemcpy(rhs_device_.data(), rhs_.b(0), rhs_device_.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());  // the pageable copy ran on the legacy stream, which ours does not wait for

    // One grid for every strategy: as many blocks as can be co-resident for the persistent kernel.
    int sms = 0, per_sm = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.cuda_device));
    with_lanes(a_.lanes_per_row, [&](auto lanes) {
      CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel<decltype(lanes)::value>, block_size, 0));
    });
    TB_REQUIRE(per_sm > 0, "the persistent CG kernel does not fit on an SM");
    const int64_t useful = std::max<int64_t>(1, (n_ + block_size - 1) / block_size);
    grid_ = static_cast<int>(std::min<int64_t>(int64_t{sms} * per_sm, useful));
    if (strategy_ == Strategy::persistent) {
      int cooperative = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, ctx.cuda_device));
      TB_REQUIRE(cooperative, "the device cannot launch cooperative kernels");
    }
    partial_a_ = cuda::DeviceBuffer<double>(static_cast<std::size_t>(grid_));
    partial_b_ = cuda::DeviceBuffer<double>(static_cast<std::size_t>(grid_));
    partial_c_ = cuda::DeviceBuffer<double>(static_cast<std::size_t>(grid_));
    for (auto* v : {&x_, &cache_, &r_, &p_, &q_}) CUDA_CHECK(cudaMemsetAsync(v->data(), 0, v->bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(arrivals_.data(), 0, arrivals_.bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(scalars_.data(), 0, scalars_.bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, totals_.bytes(), stream_));
    state_ = State{n_,
                   x_.data(),
                   r_.data(),
                   p_.data(),
                   q_.data(),
                   partial_a_.data(),
                   partial_b_.data(),
                   partial_c_.data(),
                   arrivals_.data(),
                   scalars_.data(),
                   totals_.data()};
    if (strategy_ == Strategy::graph) capture_iterations();
    if (starts_from_cache()) {  // the cache a window starts from: b_0 solved from zero, by this strategy
      if (strategy_ == Strategy::persistent) {
        launch_persistent(b_device(0), start_cold, true);
      } else {
        launch_cold(b_device(0));
        finish(0);
      }
      CUDA_CHECK(cudaMemcpyAsync(cache_.data(), x_.data(), x_.bytes(), cudaMemcpyDeviceToDevice, stream_));
      CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, totals_.bytes(), stream_));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    syncs_ = 0;
  }

  std::vector<double> solution() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> x(static_cast<std::size_t>(n_));
    CUDA_CHECK(cudaMemcpy(x.data(), x_.data(), x_.bytes(), cudaMemcpyDeviceToHost));
    return x;
  }

  Tally tally() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    Totals t;
    CUDA_CHECK(cudaMemcpy(&t, totals_.data(), sizeof t, cudaMemcpyDeviceToHost));
    return Tally{static_cast<int64_t>(t.solves),
                 static_cast<int64_t>(t.skips),
                 static_cast<int64_t>(t.iterations),
                 static_cast<int64_t>(t.matvecs),
                 syncs_,
                 t.worst};
  }

 protected:
  void begin_window() override {
    if (starts_from_cache())
      CUDA_CHECK(cudaMemcpyAsync(x_.data(), cache_.data(), x_.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void step(int t) override {
    if (strategy_ == Strategy::persistent) launch_persistent(b_device(t), start_mode(), true);
    else WindowSolver::step(t);
  }

  void start(int t) override {
    if (strategy_ == Strategy::persistent) {  // the verdict is read by started_done(), outside the part
      launch_persistent(b_device(t), start_mode(), false);
      verdict_pending_ = true;
      return;
    }
    verdict_pending_ = false;
    if (start_ == Start::cold) {  // nothing to decide: the iterations follow without a sync
      launch_cold(b_device(t));
      done_ = false;
      return;
    }
    const int mode = start_mode();
    with_lanes(a_.lanes_per_row, [&](auto lanes) {
      residual_kernel<decltype(lanes)::value>
          <<<grid_, block_size, 0, stream_>>>(a_.view(), b_device(t), state_, control_, mode);
    });
    // Warm: nothing to decide either; the iterations follow without a sync (and return at once when
    // the start already meets tol).
    if (start_ == Start::warm) {
      done_ = false;
      return;
    }
    done_ = read_scalars().done;  // the gate's verdict, read back: the one sync a skipped solve costs
  }

  bool started_done() override {
    if (verdict_pending_) {
      done_ = read_scalars().done;
      verdict_pending_ = false;
    }
    return done_;
  }

  void finish(int) override {
    switch (strategy_) {
      case Strategy::persistent:
        launch_persistent(nullptr, start_none, true);
        return;
      case Strategy::host_checked:
        for (int it = 0; it <= settings_.max_iterations; ++it) {
          with_lanes(a_.lanes_per_row, [&](auto lanes) {
            matvec_kernel<decltype(lanes)::value><<<grid_, block_size, 0, stream_>>>(a_.view(), state_);
          });
          update_kernel<<<grid_, block_size, 0, stream_>>>(state_, control_);
          if (read_scalars().done) return;
          direction_kernel<<<grid_, block_size, 0, stream_>>>(state_);
        }
        break;
      case Strategy::graph:
        for (int it = 0; it <= settings_.max_iterations; it += defaults_check_every) {
          CUDA_CHECK(cudaGraphLaunch(iterations_.exec, stream_));
          if (read_scalars().done) return;
        }
        break;
    }
    throw CallError(__FILE__, __LINE__, "CG finish", "the device never reported convergence");
  }

  double time_part(const std::function<void()>& part) override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaEventRecord(begin_, stream_));
    part();
    CUDA_CHECK(cudaEventRecord(end_, stream_));
    CUDA_CHECK(cudaEventSynchronize(end_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, begin_, end_));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  static constexpr int defaults_check_every = defaults::cg_check_every;

  int start_mode() const {
    switch (start_) {
      case Start::cold:
        return start_cold;
      case Start::warm:
        return start_warm;
      case Start::lazy:
        return start_gate;
    }
    return start_cold;
  }

  const double* b_device(int t) const {
    return rhs_device_.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n_);
  }

  Scalars read_scalars() {
    CUDA_CHECK(cudaMemcpyAsync(host_scalars_.data(), scalars_.data(), sizeof(Scalars), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ++syncs_;
    return host_scalars_[0];
  }

  void launch_cold(const double* b) { cold_kernel<<<grid_, block_size, 0, stream_>>>(b, state_); }

  void launch_persistent(const double* b, int start, bool iterate) {
    with_lanes(a_.lanes_per_row, [&](auto lanes) {
      CsrView a = a_.view();
      State st = state_;
      Control c = control_;
      int iter = iterate ? 1 : 0;
      void* args[] = {&a, &b, &st, &c, &start, &iter};
      CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(&persistent_kernel<decltype(lanes)::value>),
                                             dim3(grid_), dim3(block_size), args, 0, stream_));
    });
  }

  // k iterations (matvec, update, direction) captured once; replays run them back to back.
  void capture_iterations() {
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < defaults_check_every; ++k) {
      with_lanes(a_.lanes_per_row, [&](auto lanes) {
        matvec_kernel<decltype(lanes)::value><<<grid_, block_size, 0, stream_>>>(a_.view(), state_);
      });
      update_kernel<<<grid_, block_size, 0, stream_>>>(state_, control_);
      direction_kernel<<<grid_, block_size, 0, stream_>>>(state_);
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &iterations_.graph));
    CUDA_CHECK(cudaGraphInstantiate(&iterations_.exec, iterations_.graph, 0));
  }

  Strategy strategy_;
  cudaStream_t stream_;
  spmv::device::DeviceCsr a_;
  int64_t n_;
  cuda::DeviceBuffer<double> x_, cache_, r_, p_, q_, rhs_device_;
  cuda::DeviceBuffer<double> partial_a_, partial_b_, partial_c_;
  cuda::DeviceBuffer<Scalars> scalars_;
  cuda::DeviceBuffer<Totals> totals_;
  cuda::DeviceBuffer<unsigned int> arrivals_;
  cuda::PinnedBuffer<Scalars> host_scalars_;
  cuda::Event begin_, end_;
  GraphOwner iterations_;
  State state_;
  Control control_;
  int grid_ = 1;
  int64_t syncs_ = 0;
  bool done_ = false, verdict_pending_ = false;
};

}  // namespace

std::unique_ptr<Instance> make_cuda_solver(const Problem& p, const RunContext& ctx, Strategy strategy, Start start) {
  return std::make_unique<CudaCg>(p, ctx, strategy, start);
}

// ---- the propagator's rows (rows.h): the primitives of the step's solve ---------------------------
// Float, as the step runs them: a grid-stride ring Laplacian, a block per row for the dot products and
// the CG update, and one block that summarises the residuals for the host's read.

namespace {

constexpr int rows_elementwise_block = 256;
constexpr int rows_row_block = 128;
constexpr int rows_summary_block = 1024;

__global__ void rows_subtract_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x)
    out[e] = a[e] - b[e];
}

__global__ void ring_laplacian_kernel(float* y, const float* x, int64_t N, int64_t C, int64_t k, float alpha) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < N * C; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % C;
    const float* row = x + (e - i);
    float neighbours = 0;
    for (int64_t d = 1; d <= k / 2; ++d) neighbours += row[(i - d + C) % C] + row[(i + d) % C];
    y[e] = x[e] + alpha * (static_cast<float>(k) * x[e] - neighbours);
  }
}

__global__ void row_dots_kernel(float* out, const float* a, const float* b, int64_t C) {
  const int64_t row = blockIdx.x;
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += a[row * C + c] * b[row * C + c];
  s = cuda::block_reduce(s, false);
  if (threadIdx.x == 0) out[row] = s;
}

// One CG iteration of one row per block (CpuRows::cg_step).
__global__ void rows_cg_step_kernel(float* x, float* r, float* p, const float* ap, float* rs, const float* pap, int64_t C) {
  const int64_t row = blockIdx.x;
  const float a = pap[row] > 0.0f ? rs[row] / pap[row] : 0.0f;
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t e = row * C + c;
    x[e] += a * p[e];
    r[e] -= a * ap[e];
    s += r[e] * r[e];
  }
  s = cuda::block_reduce(s, false);
  const float beta = rs[row] > 0.0f ? s / rs[row] : 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) p[row * C + c] = r[row * C + c] + beta * p[row * C + c];
  __syncthreads();  // every thread has read rs[row] for beta before it is replaced
  if (threadIdx.x == 0) rs[row] = s;
}

// out[0] = max_n sqrt(rs/bb), out[1] = sum rs, out[2] = sum bb (one block).
__global__ void residual_summary_kernel(float* out, const float* rs, const float* bb, int64_t N) {
  float worst = 0, r = 0, b = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    if (bb[n] > 0.0f) worst = fmaxf(worst, sqrtf(rs[n] / bb[n]));
    r += rs[n];
    b += bb[n];
  }
  worst = cuda::block_reduce(worst, true);
  r = cuda::block_reduce(r, false);
  b = cuda::block_reduce(b, false);
  if (threadIdx.x == 0) {
    out[0] = worst;
    out[1] = r;
    out[2] = b;
  }
}

}  // namespace

struct CudaRows::Readback {
  cuda::DeviceBuffer<float> summary{3};
  cuda::PinnedBuffer<float> host{3};
};

CudaRows::CudaRows(CUstream_st* stream, int device) : stream_(stream), readback_(std::make_unique<Readback>()) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  max_grid_ = std::max(1, sms * 16);
}

CudaRows::~CudaRows() = default;

void CudaRows::zero(float* x, int64_t n) {
  CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<std::size_t>(n) * sizeof(float), stream_));
}

void CudaRows::copy(float* dst, const float* src, int64_t n) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaRows::subtract(float* out, const float* a, const float* b, int64_t n) {
  if (n == 0) return;
  const int grid = static_cast<int>(
      std::clamp<int64_t>((n + rows_elementwise_block - 1) / rows_elementwise_block, 1, max_grid_));
  rows_subtract_kernel<<<grid, rows_elementwise_block, 0, stream_>>>(out, a, b, n);
  CUDA_CHECK(cudaGetLastError());
}

void CudaRows::laplacian_apply(float* y, const float* x, int64_t N, int64_t C, int64_t k, float alpha) {
  if (N * C == 0) return;
  const int grid = static_cast<int>(
      std::clamp<int64_t>((N * C + rows_elementwise_block - 1) / rows_elementwise_block, 1, max_grid_));
  ring_laplacian_kernel<<<grid, rows_elementwise_block, 0, stream_>>>(y, x, N, C, k, alpha);
  CUDA_CHECK(cudaGetLastError());
}

void CudaRows::row_dots(float* out, const float* a, const float* b, int64_t N, int64_t C) {
  if (N == 0) return;
  row_dots_kernel<<<static_cast<unsigned>(N), rows_row_block, 0, stream_>>>(out, a, b, C);
  CUDA_CHECK(cudaGetLastError());
}

void CudaRows::cg_step(float* x, float* r, float* p, const float* ap, float* rs, const float* pap, int64_t N, int64_t C) {
  if (N == 0) return;
  rows_cg_step_kernel<<<static_cast<unsigned>(N), rows_row_block, 0, stream_>>>(x, r, p, ap, rs, pap, C);
  CUDA_CHECK(cudaGetLastError());
}

// The host-checked solve reads its convergence test back: one synchronisation per call.
RowResidual CudaRows::residual(const float* rs, const float* bb, int64_t N) {
  residual_summary_kernel<<<1, rows_summary_block, 0, stream_>>>(readback_->summary.data(), rs, bb, N);
  CUDA_CHECK(cudaGetLastError());
  float* out = readback_->host.data();
  CUDA_CHECK(cudaMemcpyAsync(out, readback_->summary.data(), 3 * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return RowResidual{out[0], out[2] > 0 ? std::sqrt(out[1] / out[2]) : 0.0};
}

namespace {

class CudaRowsWindow final : public RowsWindow {
 public:
  CudaRowsWindow(const Problem& p, const RunContext& ctx, Start start)
      : RowsWindow(p, start),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        rows_(stream_, ctx.cuda_device),
        n_(settings_.system.rows * settings_.system.width),
        rhs_device_(static_cast<std::size_t>(n_) * static_cast<std::size_t>(settings_.window + 1)),
        x_(size(n_)),
        cache_(size(n_)),
        solved_b0_(size(n_)),
        workspace_(size(rows_workspace(settings_.system.rows, settings_.system.width))) {
    CUDA_CHECK(cudaMemcpy(rhs_device_.data(), rhs_.b(0), rhs_device_.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());  // the pageable copy ran on the legacy stream, which ours does not wait for
    rows_.zero(x_.data(), n_);
    rows_.zero(cache_.data(), n_);
    if (starts_from_cache()) {  // the cache a window starts from: b_0 solved from zero
      solve_rows(rows_, settings_.system, x_.data(), b_device(0), cache_.data(), false, workspace_.data());
      rows_.copy(solved_b0_.data(), cache_.data(), n_);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::vector<float> solution() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> x(size(n_));
    CUDA_CHECK(cudaMemcpy(x.data(), x_.data(), x_.bytes(), cudaMemcpyDeviceToHost));
    return x;
  }

 protected:
  void begin_window() override {
    if (starts_from_cache()) rows_.copy(cache_.data(), solved_b0_.data(), n_);
  }
  RowStats solve(int t) override {
    return solve_rows(rows_, settings_.system, x_.data(), b_device(t), starts_from_cache() ? cache_.data() : nullptr,
                      start_ == Start::lazy, workspace_.data());
  }

 private:
  static std::size_t size(int64_t n) { return static_cast<std::size_t>(n); }
  const float* b_device(int t) const { return rhs_device_.data() + size(n_) * static_cast<std::size_t>(t); }

  cudaStream_t stream_;
  CudaRows rows_;
  int64_t n_;
  cuda::DeviceBuffer<float> rhs_device_, x_, cache_, solved_b0_, workspace_;
};

}  // namespace

std::unique_ptr<Instance> make_cuda_rows(const Problem& p, const RunContext& ctx, Start start) {
  return std::make_unique<CudaRowsWindow>(p, ctx, start);
}

}  // namespace tb::cg
