// Stage `collate`: how a batch gets from a dataset in host memory to where the step reads it.
// Per-sample `__getitem__` copies + `torch.stack` + a pageable copy (docs/sources.md#001-energy-flow-bridge) against
// stacking straight into pinned memory, a pre-batched slab, a GPU-resident dataset gathered by index, and a double-buffered
// prefetch that overlaps the copy with the step's compute.
//
// The dataset holds `samples` samples of fixed-size fields, one array per field as a loaded
// dataset dict has them: text pairs (input embedding, target embedding: embed_dim fp32 each; token
// ids: seq_len int64) or token sequences alone. A batch is `batch` samples taken in the epoch's
// order (sequential or a seeded permutation; the last partial batch is dropped), stored field by
// field: all input embeddings [batch x embed_dim], then all target embeddings, then all token ids
// [batch x seq_len]. Every variant must produce exactly these bytes.
//
// layout=token_rows is the training step's data path (kernels/step's Trainer::load_batch runs its
// functions, declared below under "token rows"): rows of seq_len + 1 int32 tokens, a batch of them
// as inputs then next-token targets.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/host_buffer.h"
#include "runtime/registry.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*: the CUDA function below takes one without this
                     // header including CUDA's, so that the CPU build and .cpp files can include it

namespace tb::collate {

enum class Layout { text_pair, tokens, token_rows };
enum class Order { sequential, shuffled };

inline constexpr uint64_t seed_input = 21, seed_target = 22, seed_tokens = 23;
inline constexpr int64_t vocab = 50257;  // token ids are drawn below a GPT-2-sized vocabulary

struct Field {
  const char* name;
  int64_t row_bytes;     // one sample's share of the batch
  int64_t elem_bytes;    // 4 (fp32, int32) or 8 (int64)
  bool integer = false;  // token ids, not embeddings
};

// A sample's fields, at most three: a fixed array so that run() never allocates.
class Fields {
 public:
  void add(Field f) { fields_[count_++] = f; }
  std::size_t size() const { return count_; }
  const Field& operator[](std::size_t i) const { return fields_[i]; }
  const Field* begin() const { return fields_.data(); }
  const Field* end() const { return fields_.data() + count_; }

 private:
  std::array<Field, 3> fields_{};
  std::size_t count_ = 0;
};

struct Shape {
  Layout layout = Layout::text_pair;
  Order order = Order::shuffled;
  int64_t samples = 0, batch = 0, embed_dim = 0, seq_len = 0;
  double compute_us = 0;  // the step's compute per batch (CUDA variants); 0: none

  // The batch's fields; token_rows: inputs and targets, seq_len int32 each.
  Fields fields() const;
  int64_t sample_bytes() const;  // one sample's share of the batch
  // One sample as the dataset stores it: its fields' rows, or a token row of seq_len + 1 int32.
  int64_t dataset_row_bytes() const;
  int64_t dataset_bytes() const { return samples * dataset_row_bytes(); }
  int64_t batch_bytes() const { return batch * sample_bytes(); }
  int64_t batches_per_epoch() const { return batch > 0 ? samples / batch : 0; }  // drop_last
  // Byte offset of field `f` inside a batch: the batch's rows of every earlier field come first.
  int64_t field_offset(std::size_t f) const;
  // Whether a collate of this size is spread over the OpenMP team (defaults.h).
  bool parallel() const;
};

// Reads the stage's axes; compute_us is 0 when the problem has no such axis (CPU variants).
Shape shape_of(const Problem& problem);
// Why this shape cannot be collated (no full batch in the dataset, a negative compute time, token
// rows beyond int32 sample ids), or "".
std::string invalid_reason(const Shape& shape);
// shape_of, throwing UsageError with invalid_reason: what a variant's constructor starts from.
Shape runnable_shape(const Problem& problem);
// What a variant that batches the field layouts only (no token_rows form) says of this shape: "" or why
// not. The registry reports it before any make(); require_field_layout, which such a variant's factory
// calls first, throws it as UsageError.
std::string field_layout_reason(const Shape& shape);
void require_field_layout(const Problem& problem);

// The sample indices of one epoch in order: 0..samples-1, or a Fisher-Yates permutation seeded by
// defaults::collate_shuffle_seed. Batch k is order[k*batch .. (k+1)*batch).
std::vector<int64_t> epoch_order(const Shape& shape);

// Field values as functions of (sample, element): the dataset is filled from them, and the
// reference regenerates them instead of trusting any stored copy.
float embedding_value(uint64_t seed, int64_t sample, int64_t j, int64_t embed_dim);
int64_t token_value(int64_t sample, int64_t t, int64_t seq_len);
// Token t (0..seq_len) of dataset row `sample` in the token_rows layout.
int32_t token_row_value(int64_t sample, int64_t t, int64_t seq_len);

// ---- reference: plain loops, the oracle -------------------------------------------------------
// Batch k of the epoch, built element by element from the generator (token_rows: reference_token_rows
// over the batch's rows, regenerated).
std::vector<unsigned char> reference_batch(const Shape& shape, const std::vector<int64_t>& order, int64_t k);
// `got` (batch_bytes() bytes) against reference_batch(k), byte for byte. max_error counts the bytes
// that differ; detail names the first one by field, sample and element.
Verdict check_batch(const Shape& shape, const std::vector<int64_t>& order, int64_t k, const unsigned char* got);
// What the stand-in compute kernel reports about the batch it read: the wrapping sum of its 32-bit
// words (batch_bytes() is always a multiple of 4).
uint32_t batch_checksum(const unsigned char* batch, int64_t bytes);

// ---- token rows: the training step's data path (collate_reference.cpp, collate_host.cpp) -------
// The dataset is rows of T + 1 int32 tokens. A batch of the B rows at `picked` is inputs [B, T] =
// row[0, T) followed by targets [B, T] = row[1, T + 1): target t is the token after input t (the
// next-token shift), both blocks contiguous in `out` (2 * B * T int32). kernels/step's Trainer loads
// every micro-batch with these; the stage's layout=token_rows times them.

// The oracle: plain loops, token by token.
void reference_token_rows(const int32_t* rows, int64_t T, const int32_t* picked, int64_t B, int32_t* out);
// One copy: each picked row's two slices go from the dataset straight to their places in the batch
// (a batched `__getitems__` gather; the step without per_sample_copy).
void stack_token_rows(const int32_t* rows, int64_t T, const int32_t* picked, int64_t B, int32_t* out);

// The rows `__getitem__` returns: one host allocation of T + 1 tokens per sample, made once and
// reused, so that the per-sample path allocates nothing per batch.
class TokenRowSamples {
 public:
  TokenRowSamples() = default;
  TokenRowSamples(int64_t samples, int64_t T);
  int32_t* row(int64_t i) { return rows_[static_cast<std::size_t>(i)].data(); }
  const int32_t* row(int64_t i) const { return rows_[static_cast<std::size_t>(i)].data(); }
  int64_t samples() const { return static_cast<int64_t>(rows_.size()); }
  int64_t tokens() const { return tokens_; }  // T + 1

 private:
  std::vector<HostBuffer<int32_t>> rows_;
  int64_t tokens_ = 0;
};
// Two copies, as `__getitem__` + `collate_fn` make them: each picked row copied out into its sample
// buffer, then the samples stacked into the batch (the step with per_sample_copy). `samples` holds
// at least B rows of T + 1.
void stack_token_rows_per_sample(const int32_t* rows, int64_t T, const int32_t* picked, int64_t B, TokenRowSamples& samples,
                                 int32_t* out);

// ---- the dataset and the host-side steps every host path is made of (collate_host.cpp) --------
class HostDataset {
 public:
  explicit HostDataset(const Shape& shape);  // generated in parallel (first touch by the team)
  const unsigned char* field(std::size_t f) const { return fields_[f].data(); }
  // token_rows: the one array of rows, samples x (seq_len + 1).
  const int32_t* token_rows() const { return reinterpret_cast<const int32_t*>(fields_.front().data()); }

 private:
  std::vector<HostBuffer<unsigned char>> fields_;  // one array per field, or the token rows
};

// Zeroes a buffer from the threads that will later write it (first touch: NUMA-local pages).
void first_touch(unsigned char* buffer, int64_t bytes);

// The tensors `__getitem__` returns: one host allocation per (sample, field), reused across calls.
class SampleTensors {
 public:
  explicit SampleTensors(const Shape& shape);
  unsigned char* at(int64_t sample, std::size_t f) {
    return tensors_[static_cast<std::size_t>(sample) * fields_ + f].data();
  }
  const unsigned char* at(int64_t sample, std::size_t f) const {
    return tensors_[static_cast<std::size_t>(sample) * fields_ + f].data();
  }

 private:
  std::size_t fields_;
  std::vector<HostBuffer<unsigned char>> tensors_;
};

// `__getitem__` per sample: copy each field row of the samples at `indices` out of the dataset.
void copy_out_samples(const Shape& shape, const HostDataset& data, const int64_t* indices, SampleTensors& out);
// `torch.stack` per field: the sample tensors into one batch laid out as the header says.
void stack_samples(const Shape& shape, const SampleTensors& samples, unsigned char* batch);
// Both at once: each row goes from the dataset straight to its place in the batch.
void gather_batch(const Shape& shape, const HostDataset& data, const int64_t* indices, unsigned char* batch);
// Every batch of the epoch, back to back (batches_per_epoch() * batch_bytes() bytes): after this a
// batch is a view. Returns the seconds it took, the cost of one reshuffle at the slab level.
double build_slab(const Shape& shape, const HostDataset& data, const std::vector<int64_t>& order, unsigned char* slab);
// What a pre-batched variant reports about its slab, built in `build_s` seconds into memory already
// touched (a rebuild's cost, not the page faults of a first allocation). Shuffled, the slab is rebuilt
// every epoch: slab_build_ms, and slab_build_ms_per_batch spread over the epoch's batches, the cost
// its pairs add back to the timed view (Pair::moved_out). Sequential, it is built once, like the
// dataset: slab_build_once_ms, and nothing per batch.
std::vector<std::pair<std::string, double>> slab_counters(const Shape& shape, double build_s);

// ---- CPU variants (collate_cpu.cpp) ----------------------------------------------------------
// per_sample and gather, like CUDA's resident, have a token_rows form; the others batch the field
// layouts only (field_layout_reason).
std::unique_ptr<Instance> make_cpu_per_sample(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_prebatched(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cpu_gather(const Problem&, const RunContext&);

// ---- CUDA variants (collate_cuda.cu) ---------------------------------------------------------
// The token rows' batch gathered on the device from a resident dataset (the step's
// data.location=device): rows, picked and out in device memory, enqueued on `stream`.
void cuda_gather_token_rows(const int32_t* rows_on_device, int64_t T, const int32_t* picked_on_device, int64_t B,
                            int32_t* out, CUstream_st* stream);

std::unique_ptr<Instance> make_cuda_per_sample(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_pinned(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_prebatched(const Problem&, const RunContext&, bool pinned_slab);
std::unique_ptr<Instance> make_cuda_resident(const Problem&, const RunContext&);
std::unique_ptr<Instance> make_cuda_prefetch(const Problem&, const RunContext&);

}  // namespace tb::collate
