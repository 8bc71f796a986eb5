// CUDA collates: each call delivers the next batch of the epoch into device memory and, when the
// problem has compute_us > 0, runs the step's stand-in compute on it. Everything is enqueued on the
// context's stream (prefetch forks a copy stream off it and joins it back), nothing synchronises
// the device; host work that a call does (stacking) shows in the event timing when the device has
// to wait for it.
#include <algorithm>
#include <vector>

#include "collate.h"
#include "runtime/cuda_raii.h"

namespace tb::collate {

namespace {

constexpr int block_size = 256;
constexpr int warps_per_block = block_size / 32;
// Consumer blocks per SM: 4 x 256 threads are resident at once, so the whole grid runs (and spins)
// together and the kernel lasts compute_us.
constexpr int consume_blocks_per_sm = 4;
constexpr int gather_blocks_per_sm = 8;
constexpr int64_t max_grid_extent = 65535;  // gridDim.y's limit; grid-stride loops cover the rest

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Stands in for the step's compute on a batch: reads every word (a checksum the check compares, so
// a compute that ran before its batch had landed is caught) and then occupies its SMs until
// spin_ns have passed since it started.
__global__ void consume_kernel(const uint32_t* __restrict__ batch, int64_t words, uint32_t* __restrict__ partials,
                               uint64_t spin_ns) {
  const uint64_t start = global_ns();
  uint32_t sum = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words; i += int64_t{gridDim.x} * blockDim.x)
    sum += batch[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ uint32_t warp_sums[warps_per_block];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t block_sum = 0;
    for (int w = 0; w < warps_per_block; ++w) block_sum += warp_sums[w];
    partials[blockIdx.x] = block_sum;
  }
  while (global_ns() - start < spin_ns) {
  }
}

struct GatherField {
  const unsigned char* src;  // the dataset's array for this field, [samples x row_bytes]
  unsigned char* dst;        // this field's rows in the batch, [batch x row_bytes]
  int64_t row_bytes;
  int vec16;  // rows and their places are 16-byte aligned
};
struct GatherArgs {
  GatherField field[3];
  const int64_t* indices;  // this batch's sample indices
  int64_t rows;            // samples per batch
};

// One warp per (sample, field) row: a row is contiguous in the dataset and in the batch, so the
// lanes copy it with coalesced 16-byte accesses (4-byte ones when a row is not 16-byte aligned).
// blockIdx.y picks the field.
__global__ void gather_kernel(GatherArgs a) {
  // Constant indices only: a dynamic index into a by-value kernel argument copies the whole struct
  // to the stack (local memory) first; selecting among the three reads each field from parameter
  // space.
  const GatherField f = blockIdx.y == 0 ? a.field[0] : blockIdx.y == 1 ? a.field[1] : a.field[2];
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * warps_per_block;
  for (int64_t r = blockIdx.x * int64_t{warps_per_block} + threadIdx.x / 32; r < a.rows; r += warps) {
    const unsigned char* src = f.src + a.indices[r] * f.row_bytes;
    unsigned char* dst = f.dst + r * f.row_bytes;
    if (f.vec16) {
      const auto* s = reinterpret_cast<const uint4*>(src);
      auto* d = reinterpret_cast<uint4*>(dst);
      for (int64_t w = lane; w < f.row_bytes / 16; w += 32) d[w] = s[w];
    } else {
      const auto* s = reinterpret_cast<const uint32_t*>(src);
      auto* d = reinterpret_cast<uint32_t*>(dst);
      for (int64_t w = lane; w < f.row_bytes / 4; w += 32) d[w] = s[w];
    }
  }
}

// The token rows' gather (the step's resident data path). A row of T + 1 int32 starts at any 4-byte
// offset and its targets one token after its inputs, so no access wider than 4 bytes is aligned in
// general: consecutive threads take consecutive tokens of one row (coalesced reads and writes, no
// division per token; the target read row[t + 1] is the neighbouring thread's input read, an L1 hit),
// and blockIdx.y walks the picked rows.
__global__ void gather_token_rows_kernel(const int32_t* __restrict__ rows, int64_t T, const int32_t* __restrict__ picked,
                                         int64_t B, int32_t* __restrict__ out) {
  int32_t* inputs = out;
  int32_t* targets = out + B * T;
  for (int64_t b = blockIdx.y; b < B; b += gridDim.y) {
    const int32_t* row = rows + static_cast<int64_t>(picked[b]) * (T + 1);
    for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < T; t += int64_t{gridDim.x} * blockDim.x) {
      inputs[b * T + t] = row[t];
      targets[b * T + t] = row[t + 1];
    }
  }
}

// What every CUDA collate has: the host dataset and epoch order, the context's stream, the
// stand-in compute, and the check of a device batch.
class CudaCollate : public Instance {
 public:
  CudaCollate(const Problem& p, const RunContext& ctx)
      : shape_(runnable_shape(p)),
        fields_(shape_.fields()),
        order_(epoch_order(shape_)),
        data_(shape_),
        stream_(cuda::as_stream(ctx.cuda_stream)),
        spin_ns_(static_cast<uint64_t>(shape_.compute_us * 1e3)) {
    CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, ctx.cuda_device));
    consume_grid_ = sms_ * consume_blocks_per_sm;
    for (std::size_t f = 0; f < fields_.size(); ++f) offset_[f] = shape_.field_offset(f);
  }

 protected:
  int64_t next_batch() { return calls_++ % shape_.batches_per_epoch(); }
  int64_t batch_of_call(int64_t call) const { return call % shape_.batches_per_epoch(); }
  const int64_t* indices(int64_t k) const { return order_.data() + k * shape_.batch; }
  std::size_t batch_bytes() const { return static_cast<std::size_t>(shape_.batch_bytes()); }
  bool computes() const { return spin_ns_ > 0; }
  cuda::DeviceBuffer<uint32_t> make_partials() const {
    return computes() ? cuda::DeviceBuffer<uint32_t>(static_cast<std::size_t>(consume_grid_))
                      : cuda::DeviceBuffer<uint32_t>();
  }

  // The step's compute on the batch just delivered, on `stream`.
  void consume(const unsigned char* batch, uint32_t* partials, cudaStream_t stream) const {
    if (!computes()) return;
    consume_kernel<<<consume_grid_, block_size, 0, stream>>>(reinterpret_cast<const uint32_t*>(batch),
                                                             shape_.batch_bytes() / 4, partials, spin_ns_);
  }

  // After the work has finished: the device batch against the reference batch k, and (with
  // `partials`) the checksum the compute kernel took of it.
  Verdict check_device(const unsigned char* device_batch, int64_t k, const uint32_t* partials) const {
    CUDA_CHECK(cudaGetLastError());
    std::vector<unsigned char> host(batch_bytes());
    CUDA_CHECK(cudaMemcpy(host.data(), device_batch, host.size(), cudaMemcpyDeviceToHost));
    Verdict verdict = check_batch(shape_, order_, k, host.data());
    if (!verdict.passed || !partials || !computes()) return verdict;
    std::vector<uint32_t> sums(static_cast<std::size_t>(consume_grid_));
    CUDA_CHECK(cudaMemcpy(sums.data(), partials, sums.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    uint32_t got = 0;
    for (uint32_t s : sums) got += s;
    const uint32_t want = batch_checksum(host.data(), shape_.batch_bytes());
    if (got != want)
      return Verdict{false, 1.0,
                     "the compute kernel on batch " + std::to_string(k) + " read checksum " + std::to_string(got) +
                         ", the batch's is " + std::to_string(want) + " (it ran before its batch had landed)"};
    return verdict;
  }
  Verdict not_run() const { return Verdict{false, 0.0, "check() before any run()"}; }

  Shape shape_;
  Fields fields_;
  int64_t offset_[3] = {0, 0, 0};
  std::vector<int64_t> order_;
  HostDataset data_;
  cudaStream_t stream_;
  uint64_t spin_ns_;
  int sms_ = 0;
  int consume_grid_ = 0;
  int64_t calls_ = 0;
};

// `__getitem__` copies each sample's tensors out, `collate_fn` stacks them into pageable tensors,
// and `{k: v.to(device)}` copies each stacked tensor: pageable, so the driver stages every byte.
class PerSample final : public CudaCollate {
 public:
  PerSample(const Problem& p, const RunContext& ctx)
      : CudaCollate(p, ctx),
        samples_(shape_),
        host_batch_(batch_bytes()),
        device_batch_(batch_bytes()),
        partials_(make_partials()) {
    first_touch(host_batch_.data(), shape_.batch_bytes());
  }
  void run() override {
    const int64_t k = next_batch();
    copy_out_samples(shape_, data_, indices(k), samples_);
    stack_samples(shape_, samples_, host_batch_.data());
    for (std::size_t f = 0; f < fields_.size(); ++f)
      CUDA_CHECK(cudaMemcpyAsync(device_batch_.data() + offset_[f], host_batch_.data() + offset_[f],
                                 static_cast<std::size_t>(shape_.batch * fields_[f].row_bytes), cudaMemcpyHostToDevice,
                                 stream_));
    consume(device_batch_.data(), partials_.data(), stream_);
  }
  Verdict check() override {
    if (calls_ == 0) return not_run();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_device(device_batch_.data(), batch_of_call(calls_ - 1), partials_.data());
  }

 private:
  SampleTensors samples_;
  HostBuffer<unsigned char> host_batch_;
  cuda::DeviceBuffer<unsigned char> device_batch_;
  cuda::DeviceBuffer<uint32_t> partials_;
};

// Rows go from the dataset straight into a pinned batch (no sample tensors), then one asynchronous
// copy at the link's rate. Two pinned buffers, as a caching host allocator would hand out: the next
// call stacks into the other one while this copy is in flight, and waits only if that one's copy
// has not finished.
class Pinned final : public CudaCollate {
 public:
  Pinned(const Problem& p, const RunContext& ctx)
      : CudaCollate(p, ctx), device_batch_(batch_bytes()), partials_(make_partials()) {
    for (auto& h : host_) h = cuda::PinnedBuffer<unsigned char>(batch_bytes());
  }
  void run() override {
    const int slot = static_cast<int>(calls_ % 2);
    const int64_t k = next_batch();
    CUDA_CHECK(cudaEventSynchronize(host_free_[slot]));
    gather_batch(shape_, data_, indices(k), host_[slot].data());
    CUDA_CHECK(cudaMemcpyAsync(device_batch_.data(), host_[slot].data(), batch_bytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(host_free_[slot], stream_));
    consume(device_batch_.data(), partials_.data(), stream_);
  }
  Verdict check() override {
    if (calls_ == 0) return not_run();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_device(device_batch_.data(), batch_of_call(calls_ - 1), partials_.data());
  }

 private:
  cuda::PinnedBuffer<unsigned char> host_[2];
  cuda::Event host_free_[2];
  cuda::DeviceBuffer<unsigned char> device_batch_;
  cuda::DeviceBuffer<uint32_t> partials_;
};

// The epoch stored batch by batch (the slab rebuilt in a new order once per epoch when shuffled,
// reported by slab_counters, not timed; the stage's pairs add it back per batch): a batch is a view
// and one copy, with no host work. The slab is pageable (docs/sources.md#001-energy-flow-bridge's torch.split of a loaded
// tensor, first-touched so that the build timed is a rebuild) or pinned.
class Prebatched final : public CudaCollate {
 public:
  Prebatched(const Problem& p, const RunContext& ctx, bool pinned)
      : CudaCollate(p, ctx), device_batch_(batch_bytes()), partials_(make_partials()) {
    const auto bytes = static_cast<std::size_t>(shape_.batches_per_epoch()) * batch_bytes();
    if (pinned) pinned_slab_ = cuda::PinnedBuffer<unsigned char>(bytes);
    else pageable_slab_ = HostBuffer<unsigned char>(bytes);
    slab_ = pinned ? pinned_slab_.data() : pageable_slab_.data();
    if (!pinned) first_touch(slab_, static_cast<int64_t>(bytes));
    build_s_ = build_slab(shape_, data_, order_, slab_);
  }
  void run() override {
    const int64_t k = next_batch();
    CUDA_CHECK(cudaMemcpyAsync(device_batch_.data(), slab_ + k * shape_.batch_bytes(), batch_bytes(), cudaMemcpyHostToDevice,
                               stream_));
    consume(device_batch_.data(), partials_.data(), stream_);
  }
  Verdict check() override {
    if (calls_ == 0) return not_run();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_device(device_batch_.data(), batch_of_call(calls_ - 1), partials_.data());
  }
  std::vector<std::pair<std::string, double>> observed() const override { return slab_counters(shape_, build_s_); }

 private:
  cuda::PinnedBuffer<unsigned char> pinned_slab_;
  HostBuffer<unsigned char> pageable_slab_;
  unsigned char* slab_ = nullptr;
  double build_s_ = 0;
  cuda::DeviceBuffer<unsigned char> device_batch_;
  cuda::DeviceBuffer<uint32_t> partials_;
};

// The whole dataset in device memory (docs/sources.md#001-energy-flow-bridge's torch.load(map_location='cuda')) and the
// epoch's order with it: a batch is one gather kernel, no host work and no transfer.
class Resident final : public CudaCollate {
 public:
  Resident(const Problem& p, const RunContext& ctx)
      : CudaCollate(p, ctx), order_device_(order_.size()), device_batch_(batch_bytes()), partials_(make_partials()) {
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      dataset_[f] = cuda::DeviceBuffer<unsigned char>(static_cast<std::size_t>(shape_.samples * fields_[f].row_bytes));
      CUDA_CHECK(cudaMemcpyAsync(dataset_[f].data(), data_.field(f), dataset_[f].bytes(), cudaMemcpyHostToDevice, stream_));
      const bool aligned = fields_[f].row_bytes % 16 == 0 && offset_[f] % 16 == 0;
      args_.field[f] = GatherField{dataset_[f].data(), device_batch_.data() + offset_[f], fields_[f].row_bytes,
                                   aligned ? 1 : 0};
    }
    CUDA_CHECK(cudaMemcpyAsync(order_device_.data(), order_.data(), order_device_.bytes(), cudaMemcpyHostToDevice, stream_));
    // On the context stream and waited for: a pageable cudaMemcpy may return before its DMA lands,
    // and the legacy stream it uses does not order a non-blocking stream.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    args_.rows = shape_.batch;
    const int64_t blocks = (shape_.batch + warps_per_block - 1) / warps_per_block;
    grid_ = dim3(static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{sms_} * gather_blocks_per_sm)),
                 static_cast<unsigned>(fields_.size()));
  }
  void run() override {
    args_.indices = order_device_.data() + next_batch() * shape_.batch;
    gather_kernel<<<grid_, block_size, 0, stream_>>>(args_);
    consume(device_batch_.data(), partials_.data(), stream_);
  }
  Verdict check() override {
    if (calls_ == 0) return not_run();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_device(device_batch_.data(), batch_of_call(calls_ - 1), partials_.data());
  }

 private:
  cuda::DeviceBuffer<unsigned char> dataset_[3];
  cuda::DeviceBuffer<int64_t> order_device_;
  cuda::DeviceBuffer<unsigned char> device_batch_;
  cuda::DeviceBuffer<uint32_t> partials_;
  GatherArgs args_{};
  dim3 grid_;
};

// layout=token_rows: the training step's device path (data.location=device), the rows and the
// epoch's order (int32 sample ids, as the step keeps them) in device memory, a batch is
// cuda_gather_token_rows.
class TokenRowsResident final : public CudaCollate {
 public:
  TokenRowsResident(const Problem& p, const RunContext& ctx)
      : CudaCollate(p, ctx),
        rows_(static_cast<std::size_t>(shape_.dataset_bytes() / 4)),
        picked_(order_.size()),
        device_batch_(batch_bytes()),
        partials_(make_partials()) {
    const std::vector<int32_t> picked(order_.begin(), order_.end());
    CUDA_CHECK(cudaMemcpyAsync(rows_.data(), data_.token_rows(), rows_.bytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(picked_.data(), picked.data(), picked_.bytes(), cudaMemcpyHostToDevice, stream_));
    // Waited for: pageable sources, and `picked` goes out of scope.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void run() override {
    cuda_gather_token_rows(rows_.data(), shape_.seq_len, picked_.data() + next_batch() * shape_.batch, shape_.batch,
                           reinterpret_cast<int32_t*>(device_batch_.data()), stream_);
    consume(device_batch_.data(), partials_.data(), stream_);
  }
  Verdict check() override {
    if (calls_ == 0) return not_run();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return check_device(device_batch_.data(), batch_of_call(calls_ - 1), partials_.data());
  }

 private:
  cuda::DeviceBuffer<int32_t> rows_;
  cuda::DeviceBuffer<int32_t> picked_;
  cuda::DeviceBuffer<unsigned char> device_batch_;
  cuda::DeviceBuffer<uint32_t> partials_;
};

// Double buffering on two streams. Call i computes on batch i (already in device buffer i%2) on the
// context stream while a copy stream brings batch i+1 into the other buffer; the host meanwhile
// stacks batch i+2 into the pinned buffer batch i came from. The copy stream is forked from the
// context stream at the start of the call and joined at its end, so the timing brackets both.
// Events around each copy and compute measure how much of the copy ran under the compute.
class Prefetch final : public CudaCollate {
 public:
  Prefetch(const Problem& p, const RunContext& ctx) : CudaCollate(p, ctx) {
    for (int j = 0; j < 2; ++j) {
      host_[j] = cuda::PinnedBuffer<unsigned char>(batch_bytes());
      device_[j] = cuda::DeviceBuffer<unsigned char>(batch_bytes());
      partials_[j] = make_partials();
    }
    // Before the first call, as after any: batch 0 on the device, batch 1 stacked in pinned memory.
    gather_batch(shape_, data_, indices(0), host_[0].data());
    CUDA_CHECK(cudaMemcpyAsync(device_[0].data(), host_[0].data(), batch_bytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    gather_batch(shape_, data_, indices(batch_of_call(1)), host_[1].data());
  }
  ~Prefetch() override { cudaStreamSynchronize(copy_stream_); }

  void run() override {
    const int64_t i = calls_++;
    const int cur = static_cast<int>(i % 2), nxt = 1 - cur;
    Timing& t = ring_[i % ring_size];
    if (i >= ring_size) harvest(t);
    CUDA_CHECK(cudaEventRecord(t.fork, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, t.fork, 0));
    // Compute on batch i, which the previous call's copy brought in.
    CUDA_CHECK(cudaStreamWaitEvent(stream_, copied_[cur], 0));
    CUDA_CHECK(cudaEventRecord(t.compute_start, stream_));
    consume(device_[cur].data(), partials_[cur].data(), stream_);
    CUDA_CHECK(cudaEventRecord(t.compute_end, stream_));
    CUDA_CHECK(cudaEventRecord(consumed_[cur], stream_));
    // Meanwhile batch i+1 into the other buffer, once the compute that last read it (call i-1) is done.
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, consumed_[nxt], 0));
    CUDA_CHECK(cudaEventRecord(t.copy_start, copy_stream_));
    CUDA_CHECK(cudaMemcpyAsync(device_[nxt].data(), host_[nxt].data(), batch_bytes(), cudaMemcpyHostToDevice, copy_stream_));
    CUDA_CHECK(cudaEventRecord(t.copy_end, copy_stream_));
    CUDA_CHECK(cudaEventRecord(copied_[nxt], copy_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, copied_[nxt], 0));  // join
    // On the host, batch i+2 into the pinned buffer that batch i was copied from (copy done by now,
    // unless the device is the bottleneck).
    CUDA_CHECK(cudaEventSynchronize(copied_[cur]));
    gather_batch(shape_, data_, indices(batch_of_call(i + 2)), host_[cur].data());
  }

  Verdict check() override {
    if (calls_ == 0) return not_run();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    const int64_t last = calls_ - 1;
    const int cur = static_cast<int>(last % 2), nxt = 1 - cur;
    Verdict computed = check_device(device_[cur].data(), batch_of_call(last), partials_[cur].data());
    if (!computed.passed) return computed;
    Verdict prefetched = check_device(device_[nxt].data(), batch_of_call(last + 1), nullptr);
    if (!prefetched.passed) return Verdict{false, prefetched.max_error, "prefetched " + prefetched.detail};
    Verdict stacked = check_batch(shape_, order_, batch_of_call(last + 2), host_[cur].data());
    if (!stacked.passed) return Verdict{false, stacked.max_error, "stacked in pinned memory: " + stacked.detail};
    return computed;
  }

  // copy_hidden: the share of the copy time that overlapped the compute (0 when there is none).
  std::vector<std::pair<std::string, double>> observed() const override {
    if (timed_calls_ == 0) return {};
    const double n = static_cast<double>(timed_calls_);
    return {{"copy_hidden", copy_ms_ > 0 ? hidden_ms_ / copy_ms_ : 0.0},
            {"copy_ms", copy_ms_ / n},
            {"compute_ms", compute_ms_ / n}};
  }

 private:
  struct Timing {
    cuda::Event fork, compute_start, compute_end, copy_start, copy_end;
  };
  static constexpr int64_t ring_size = 4;

  // The events of call i - ring_size: complete already (the host never runs more than two calls
  // ahead of the copies), so these waits do not block.
  void harvest(Timing& t) {
    CUDA_CHECK(cudaEventSynchronize(t.copy_end));
    CUDA_CHECK(cudaEventSynchronize(t.compute_end));
    float cs = 0, ce = 0, ks = 0, ke = 0;
    CUDA_CHECK(cudaEventElapsedTime(&cs, t.fork, t.copy_start));
    CUDA_CHECK(cudaEventElapsedTime(&ce, t.fork, t.copy_end));
    CUDA_CHECK(cudaEventElapsedTime(&ks, t.fork, t.compute_start));
    CUDA_CHECK(cudaEventElapsedTime(&ke, t.fork, t.compute_end));
    copy_ms_ += ce - cs;
    compute_ms_ += ke - ks;
    hidden_ms_ += std::max(0.0f, std::min(ce, ke) - std::max(cs, ks));
    ++timed_calls_;
  }

  cuda::Stream copy_stream_;
  cuda::PinnedBuffer<unsigned char> host_[2];
  cuda::DeviceBuffer<unsigned char> device_[2];
  cuda::DeviceBuffer<uint32_t> partials_[2];
  cuda::Event copied_[2], consumed_[2];
  Timing ring_[ring_size];
  double copy_ms_ = 0, compute_ms_ = 0, hidden_ms_ = 0;
  int64_t timed_calls_ = 0;
};

}  // namespace

void cuda_gather_token_rows(const int32_t* rows_on_device, int64_t T, const int32_t* picked_on_device, int64_t B,
                            int32_t* out, CUstream_st* stream) {
  if (B == 0 || T == 0) return;
  // A block as wide as the row in whole warps (up to block_size), so that short rows leave no
  // threads idle; enough blocks along x to cover the row, one row per block along y.
  const int64_t threads = std::min<int64_t>(block_size, (T + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(std::min((T + threads - 1) / threads, max_grid_extent)),
                  static_cast<unsigned>(std::min(B, max_grid_extent)));
  gather_token_rows_kernel<<<grid, static_cast<unsigned>(threads), 0, stream>>>(rows_on_device, T, picked_on_device, B, out);
  CUDA_CHECK(cudaGetLastError());
}

std::unique_ptr<Instance> make_cuda_per_sample(const Problem& p, const RunContext& ctx) {
  require_field_layout(p);
  return std::make_unique<PerSample>(p, ctx);
}
std::unique_ptr<Instance> make_cuda_pinned(const Problem& p, const RunContext& ctx) {
  require_field_layout(p);
  return std::make_unique<Pinned>(p, ctx);
}
std::unique_ptr<Instance> make_cuda_prebatched(const Problem& p, const RunContext& ctx, bool pinned_slab) {
  require_field_layout(p);
  return std::make_unique<Prebatched>(p, ctx, pinned_slab);
}
std::unique_ptr<Instance> make_cuda_resident(const Problem& p, const RunContext& ctx) {
  if (shape_of(p).layout == Layout::token_rows) return std::make_unique<TokenRowsResident>(p, ctx);
  return std::make_unique<Resident>(p, ctx);
}
std::unique_ptr<Instance> make_cuda_prefetch(const Problem& p, const RunContext& ctx) {
  require_field_layout(p);
  return std::make_unique<Prefetch>(p, ctx);
}

}  // namespace tb::collate
