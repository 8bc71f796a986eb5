// CPU collates: the batch ends in host memory, where a CPU step (docs/sources.md#004-small-gpt) reads it. Each call
// delivers the next batch of the epoch (wrapping to the first after the last).
#include "collate.h"

namespace tb::collate {

namespace {

class CpuCollate : public Instance {
 public:
  explicit CpuCollate(const Problem& p) : shape_(runnable_shape(p)), order_(epoch_order(shape_)), data_(shape_) {}

 protected:
  int64_t next_batch() { return calls_++ % shape_.batches_per_epoch(); }
  int64_t last_batch() const { return (calls_ - 1) % shape_.batches_per_epoch(); }
  const int64_t* indices(int64_t k) const { return order_.data() + k * shape_.batch; }
  Verdict check_host(const unsigned char* batch) const {
    if (calls_ == 0) return Verdict{false, 0.0, "check() before any run()"};
    return check_batch(shape_, order_, last_batch(), batch);
  }

  Shape shape_;
  std::vector<int64_t> order_;
  HostDataset data_;
  int64_t calls_ = 0;
};

// `__getitem__` copies each sample's tensors out, `collate_fn` stacks them: two copies of every byte.
class PerSample final : public CpuCollate {
 public:
  explicit PerSample(const Problem& p)
      : CpuCollate(p), samples_(shape_), batch_(static_cast<std::size_t>(shape_.batch_bytes())) {
    first_touch(batch_.data(), shape_.batch_bytes());
  }
  void run() override {
    const int64_t k = next_batch();
    copy_out_samples(shape_, data_, indices(k), samples_);
    stack_samples(shape_, samples_, batch_.data());
  }
  Verdict check() override { return check_host(batch_.data()); }

 private:
  SampleTensors samples_;
  HostBuffer<unsigned char> batch_;
};

// Samples stored batch by batch in the epoch's order: a batch is a pointer, nothing is copied. With
// a shuffled order the slab is rebuilt once per epoch; that cost is reported (slab_counters), not
// timed, and the stage's pairs add it back per batch. The slab is first-touched, so the build timed
// is a rebuild, as every epoch after the first pays it.
class Prebatched final : public CpuCollate {
 public:
  explicit Prebatched(const Problem& p)
      : CpuCollate(p), slab_(static_cast<std::size_t>(shape_.batches_per_epoch() * shape_.batch_bytes())) {
    first_touch(slab_.data(), shape_.batches_per_epoch() * shape_.batch_bytes());
    build_s_ = build_slab(shape_, data_, order_, slab_.data());
  }
  void run() override { view_ = slab_.data() + next_batch() * shape_.batch_bytes(); }
  Verdict check() override { return check_host(view_); }
  std::vector<std::pair<std::string, double>> observed() const override { return slab_counters(shape_, build_s_); }

 private:
  HostBuffer<unsigned char> slab_;
  const unsigned char* view_ = nullptr;
  double build_s_ = 0;
};

// One copy: each row goes from the dataset to its place in a batch buffer that is reused.
class Gather final : public CpuCollate {
 public:
  explicit Gather(const Problem& p) : CpuCollate(p), batch_(static_cast<std::size_t>(shape_.batch_bytes())) {
    first_touch(batch_.data(), shape_.batch_bytes());
  }
  void run() override { gather_batch(shape_, data_, indices(next_batch()), batch_.data()); }
  Verdict check() override { return check_host(batch_.data()); }

 private:
  HostBuffer<unsigned char> batch_;
};

// layout=token_rows: the training step's host paths, through the functions its Trainer::load_batch
// calls. The epoch's order is kept as the step keeps its picks, int32 sample ids.
class TokenRowsCollate : public CpuCollate {
 public:
  explicit TokenRowsCollate(const Problem& p)
      : CpuCollate(p),
        picked_(order_.begin(), order_.end()),
        batch_(static_cast<std::size_t>(shape_.batch_bytes()) / sizeof(int32_t)) {
    first_touch(reinterpret_cast<unsigned char*>(batch_.data()), shape_.batch_bytes());
  }
  Verdict check() override { return check_host(reinterpret_cast<const unsigned char*>(batch_.data())); }

 protected:
  const int32_t* picked(int64_t k) const { return picked_.data() + k * shape_.batch; }

  std::vector<int32_t> picked_;
  HostBuffer<int32_t> batch_;
};

// The step with per_sample_copy: each row copied out into its reused sample buffer, then stacked.
class TokenRowsPerSample final : public TokenRowsCollate {
 public:
  explicit TokenRowsPerSample(const Problem& p) : TokenRowsCollate(p), samples_(shape_.batch, shape_.seq_len) {}
  void run() override {
    stack_token_rows_per_sample(data_.token_rows(), shape_.seq_len, picked(next_batch()), shape_.batch, samples_,
                                batch_.data());
  }

 private:
  TokenRowSamples samples_;
};

// The step without it: each row's inputs and targets straight into the batch.
class TokenRowsGather final : public TokenRowsCollate {
 public:
  explicit TokenRowsGather(const Problem& p) : TokenRowsCollate(p) {}
  void run() override {
    stack_token_rows(data_.token_rows(), shape_.seq_len, picked(next_batch()), shape_.batch, batch_.data());
  }
};

bool is_token_rows(const Problem& p) { return shape_of(p).layout == Layout::token_rows; }

}  // namespace

std::unique_ptr<Instance> make_cpu_per_sample(const Problem& p, const RunContext&) {
  if (is_token_rows(p)) return std::make_unique<TokenRowsPerSample>(p);
  return std::make_unique<PerSample>(p);
}
std::unique_ptr<Instance> make_cpu_prebatched(const Problem& p, const RunContext&) {
  require_field_layout(p);
  return std::make_unique<Prebatched>(p);
}
std::unique_ptr<Instance> make_cpu_gather(const Problem& p, const RunContext&) {
  if (is_token_rows(p)) return std::make_unique<TokenRowsGather>(p);
  return std::make_unique<Gather>(p);
}

}  // namespace tb::collate
