// The all-reduce stage on CUDA: ncclAllReduce, out of place, one process per GPU. NCCL is loaded at
// run time (dlopen of libnccl.so.2: the toolkit's, or the one named by TRAINBENCH_NCCL_LIBRARY, e.g.
// PyTorch's nvidia-nccl wheel), so a machine without it still runs every other CUDA stage. Under
// mpirun the communicator's unique id goes from rank 0 to the others over MPI (comm.h); alone, the
// process is a communicator of one rank, and the all-reduce is NCCL's local copy.
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include "allreduce.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_fill.cuh"
#include "runtime/cuda_raii.h"

namespace tb::allreduce {

namespace {

// The NCCL entry points this stage calls, resolved once.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*get_version)(int*) = nullptr;
  std::string reason;  // why NCCL cannot be used here
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    std::vector<std::string> candidates;
    if (const char* path = std::getenv("TRAINBENCH_NCCL_LIBRARY"); path && *path) candidates.push_back(path);
    candidates.push_back("libnccl.so.2");
    candidates.push_back("/usr/local/cuda/lib64/libnccl.so.2");
    void* handle = nullptr;
    std::string errors;
    for (const auto& c : candidates) {
      if ((handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
      const char* why = dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(why ? why : c);
    }
    if (!handle) {
      a.reason = "NCCL cannot be loaded (" + errors + "): install libnccl2 or set TRAINBENCH_NCCL_LIBRARY";
      return a;
    }
    auto sym = [&](const char* name) { return dlsym(handle, name); };
    a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
    a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    a.get_version = reinterpret_cast<decltype(a.get_version)>(sym("ncclGetVersion"));
    if (!a.get_unique_id || !a.comm_init_rank || !a.comm_destroy || !a.all_reduce || !a.error_string || !a.get_version)
      a.reason = "the NCCL library found lacks ncclCommInitRank / ncclAllReduce: too old";
    return a;
  }();
  return api;
}

#define NCCL_CHECK(call)                                                                                      \
  do {                                                                                                        \
    const ncclResult_t tb_nc_ = (call);                                                                       \
    if (tb_nc_ != ncclSuccess) throw ::tb::CallError(__FILE__, __LINE__, #call, nccl().error_string(tb_nc_)); \
  } while (0)

// One communicator per device for the life of the process (creating one costs a bootstrap across
// every rank), destroyed at exit before the CUDA runtime is torn down.
class NcclComm {
 public:
  explicit NcclComm(int device) {
    const int ranks = comm::launched_ranks();
    ncclUniqueId id{};
    if (ranks > 1) {
      comm::Group& world = comm::world();
      if (world.rank() == 0) NCCL_CHECK(nccl().get_unique_id(&id));
      world.broadcast(&id, sizeof id, 0);
    } else {
      NCCL_CHECK(nccl().get_unique_id(&id));
    }
    CUDA_CHECK(cudaSetDevice(device));
    NCCL_CHECK(nccl().comm_init_rank(&comm_, ranks, id, ranks > 1 ? comm::world().rank() : 0));
    rank_ = ranks > 1 ? comm::world().rank() : 0;
    ranks_ = ranks;
  }
  ~NcclComm() {
    if (comm_) nccl().comm_destroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, ranks_ = 1;
};

NcclComm& communicator(int device) {
  static std::map<int, std::unique_ptr<NcclComm>> comms;
  auto& c = comms[device];
  if (!c) c = std::make_unique<NcclComm>(device);
  return *c;
}

// The synthetic backward of one tensor (see allreduce.h): `fmas` multiply-adds per element with
// run-time coefficients (1, 0), so the FLOPs are spent and the value kept.
template <class G>
__device__ float load(const G* p, int64_t i) {
  if constexpr (std::is_same_v<G, float>) return p[i];
  else return __bfloat162float(p[i]);
}
template <class G>
__device__ void store(G* p, int64_t i, float v) {
  if constexpr (std::is_same_v<G, float>) p[i] = v;
  else p[i] = __float2bfloat16_rn(v);
}

template <class G>
__global__ void backward_kernel(G* grad, int64_t n, int64_t fmas, float one, float zero) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float y = load(grad, i);
#pragma unroll 8
    for (int64_t k = 0; k < fmas; ++k) y = fmaf(y, one, zero);
    store(grad, i, y);
  }
}

template <class G>
class CudaAllreduce final : public Instance {
 public:
  CudaAllreduce(ParamSet set, Dtype dtype, Kind kind, double cap_bytes, int64_t tokens, const RunContext& ctx)
      : device_(ctx.cuda_device),
        stream_(static_cast<cudaStream_t>(ctx.cuda_stream)),
        comm_(communicator(ctx.cuda_device)),
        set_(std::move(set)),
        dtype_(dtype),
        kind_(kind),
        calls_(calls_for(kind, set_, adamw::element_bytes(dtype), cap_bytes)),
        fmas_(backward_fmas(tokens)),
        grad_(static_cast<std::size_t>(set_.arena)),
        reduced_(static_cast<std::size_t>(set_.arena)) {
    // Rank r's gradients: the host fills them as the CPU variants do (the reference regenerates them).
    const auto chunks = adamw::make_chunks(set_, 8192);
    const uint64_t seed = adamw::seed_grad + static_cast<uint64_t>(comm_.rank());
    if constexpr (std::is_same_v<G, float>) {
      std::vector<float> host(static_cast<std::size_t>(set_.arena));
      adamw::fill_arena(set_, chunks, seed, host.data());
      CUDA_CHECK(cudaMemcpyAsync(grad_.data(), host.data(), grad_.bytes(), cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // before `host` goes
    } else {
      std::vector<uint16_t> host(static_cast<std::size_t>(set_.arena));
      adamw::fill_arena_bf16(set_, chunks, seed, host.data());
      CUDA_CHECK(cudaMemcpyAsync(grad_.data(), host.data(), grad_.bytes(), cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    // On the benchmark stream, which does not wait for the legacy stream: a plain cudaMemset could
    // still be zeroing `reduced_` after the first all-reduce wrote it (seen on an H100: a few hundred
    // elements read back as 0 for the variants that start with the all-reduce).
    CUDA_CHECK(cudaMemsetAsync(reduced_.data(), 0, reduced_.bytes(), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (kind_ == Kind::overlap) bucket_ready_.resize(calls_.size());
  }

  void run() override {
    switch (kind_) {
      case Kind::serial:
        backward(0, set_.count() - 1, stream_);
        [[fallthrough]];
      case Kind::per_tensor:
      case Kind::bucketed:
      case Kind::flat:
      case Kind::link:
        for (const Bucket& c : calls_) reduce(c, stream_);
        return;
      case Kind::overlap:
        // DDP's pattern: the backward on the compute stream records an event per finished bucket;
        // the communication stream waits for it and all-reduces while the backward goes on.
        CUDA_CHECK(cudaEventRecord(backward_begins_, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, backward_begins_, 0));
        for (std::size_t b = 0; b < calls_.size(); ++b) {
          backward(calls_[b].first_tensor, calls_[b].last_tensor, stream_);
          CUDA_CHECK(cudaEventRecord(bucket_ready_[b], stream_));
          CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, bucket_ready_[b], 0));
          reduce(calls_[b], comm_stream_);
        }
        CUDA_CHECK(cudaEventRecord(reduced_all_, comm_stream_));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, reduced_all_, 0));  // the timer's stream sees the end
        return;
    }
  }

  Verdict check() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> got;
    if constexpr (std::is_same_v<G, float>) {
      std::vector<float> host(static_cast<std::size_t>(set_.arena));
      CUDA_CHECK(cudaMemcpy(host.data(), reduced_.data(), reduced_.bytes(), cudaMemcpyDeviceToHost));
      got = adamw::gather(set_, host.data());
    } else {
      std::vector<uint16_t> host(static_cast<std::size_t>(set_.arena));
      CUDA_CHECK(cudaMemcpy(host.data(), reduced_.data(), reduced_.bytes(), cudaMemcpyDeviceToHost));
      got = adamw::gather_bf16(set_, host.data());
    }
    Verdict v = check_sum(got, comm_.ranks(), dtype_);
    if (v.passed && (kind_ == Kind::serial || kind_ == Kind::overlap)) measure_parts();
    return v;
  }

  std::vector<std::pair<std::string, double>> observed() const override {
    return parts_.together_s > 0 ? parts_.counters() : std::vector<std::pair<std::string, double>>{};
  }

 private:
  void reduce(const Bucket& c, cudaStream_t stream) {
    const ncclDataType_t type = std::is_same_v<G, float> ? ncclFloat32 : ncclBfloat16;
    NCCL_CHECK(nccl().all_reduce(grad_.data() + c.begin, reduced_.data() + c.begin, static_cast<size_t>(c.length), type,
                                 ncclSum, comm_.get(), stream));
  }

  void backward(int64_t first, int64_t last, cudaStream_t stream) {
    for (int64_t t = last; t >= first; --t) {
      const int64_t n = set_.sizes[t];
      if (n == 0) continue;
      backward_kernel<<<cuda::grid_for(n, 256, device_), 256, 0, stream>>>(grad_.data() + set_.offsets[t], n, fmas_, one_,
                                                                           zero_);
      CUDA_CHECK(cudaGetLastError());
    }
  }

  // Seconds of one call: each rank's events, every rank starting together, the slowest rank's kept.
  template <class F>
  double agreed_seconds(F&& call) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (comm_.ranks() > 1) comm::world().barrier();
    CUDA_CHECK(cudaEventRecord(start_, stream_));
    call();
    CUDA_CHECK(cudaEventRecord(stop_, stream_));
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return comm::agree_max(ms * 1e-3);
  }

  void measure_parts() {
    parts_ = measure_overlap_parts([&](int part) {
      return agreed_seconds([&] {
        if (part == 0) backward(0, set_.count() - 1, stream_);
        else if (part == 1)
          for (const Bucket& c : calls_) reduce(c, stream_);
        else run();
      });
    });
    parts_.overlapped = kind_ == Kind::overlap;
  }

  int device_;
  cudaStream_t stream_;
  NcclComm& comm_;
  ParamSet set_;
  Dtype dtype_;
  Kind kind_;
  std::vector<Bucket> calls_;
  int64_t fmas_;
  float one_ = std::atof("1"), zero_ = std::atof("0");  // from the run time: the compiler cannot fold them
  cuda::DeviceBuffer<std::conditional_t<std::is_same_v<G, float>, float, __nv_bfloat16>> grad_, reduced_;
  cuda::Stream comm_stream_;
  cuda::Event start_, stop_, backward_begins_, reduced_all_;
  std::vector<cuda::Event> bucket_ready_;
  OverlapParts parts_;
};

}  // namespace

std::string nccl_unavailable_reason() { return nccl().reason; }

void cuda_allreduce_sum(float* data, int64_t count, void* stream, int device) {
  TB_REQUIRE(nccl().reason.empty(), nccl().reason);
  NCCL_CHECK(nccl().all_reduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, communicator(device).get(),
                               static_cast<cudaStream_t>(stream)));
}

std::unique_ptr<Instance> make_cuda(const Problem& p, const RunContext& ctx, Kind kind) {
  Setup s = setup_for(p, kind);
  if (s.dtype == Dtype::fp32)
    return std::make_unique<CudaAllreduce<float>>(std::move(s.set), s.dtype, kind, s.cap_bytes, s.tokens, ctx);
  return std::make_unique<CudaAllreduce<__nv_bfloat16>>(std::move(s.set), s.dtype, kind, s.cap_bytes, s.tokens, ctx);
}

}  // namespace tb::allreduce
