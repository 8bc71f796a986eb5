// The host dataset and the host-side collate steps shared by the CPU and CUDA variants. A copy of
// at least defaults::collate_parallel_min_bytes is spread over the OpenMP team by sample, as a
// loader's workers would share it (docs/sources.md#000-sem-v55); all host paths follow the same rule, so a pair's
// ratio is never one path's threads against another's single core.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "collate.h"
#include "runtime/defaults.h"
#include "runtime/error.h"

namespace tb::collate {

namespace {

// A token-rows batch (2 * B * T int32) goes to the team by the same rule as a Shape's batch.
bool token_rows_parallel(int64_t T, int64_t B) {
  return 2 * B * T * static_cast<int64_t>(sizeof(int32_t)) >= defaults::collate_parallel_min_bytes;
}

}  // namespace

HostDataset::HostDataset(const Shape& shape) {
  if (shape.layout == Layout::token_rows) {
    fields_.emplace_back(static_cast<std::size_t>(shape.dataset_bytes()));
    auto* rows = reinterpret_cast<int32_t*>(fields_.front().data());
    const int64_t n = shape.samples, T = shape.seq_len;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t t = 0; t <= T; ++t) rows[s * (T + 1) + t] = token_row_value(s, t, T);
    return;
  }
  const Fields fields = shape.fields();
  for (const auto& f : fields) fields_.emplace_back(static_cast<std::size_t>(shape.samples * f.row_bytes));
  const int64_t n = shape.samples, dim = shape.embed_dim, seq = shape.seq_len;
  const bool text_pair = shape.layout == Layout::text_pair;
  auto* input = text_pair ? reinterpret_cast<float*>(fields_[0].data()) : nullptr;
  auto* target = text_pair ? reinterpret_cast<float*>(fields_[1].data()) : nullptr;
  auto* tokens = reinterpret_cast<int64_t*>(fields_.back().data());
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < n; ++s) {
    if (text_pair)
      for (int64_t j = 0; j < dim; ++j) {
        input[s * dim + j] = embedding_value(seed_input, s, j, dim);
        target[s * dim + j] = embedding_value(seed_target, s, j, dim);
      }
    for (int64_t t = 0; t < seq; ++t) tokens[s * seq + t] = token_value(s, t, seq);
  }
}

void first_touch(unsigned char* buffer, int64_t bytes) {
  constexpr int64_t chunk = int64_t{1} << 16;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (bytes + chunk - 1) / chunk; ++c)
    std::memset(buffer + c * chunk, 0, static_cast<std::size_t>(std::min(chunk, bytes - c * chunk)));
}

SampleTensors::SampleTensors(const Shape& shape) : fields_(shape.fields().size()) {
  const Fields fields = shape.fields();
  tensors_.reserve(static_cast<std::size_t>(shape.batch) * fields_);
  for (int64_t i = 0; i < shape.batch; ++i)
    for (const auto& f : fields) {
      tensors_.emplace_back(static_cast<std::size_t>(f.row_bytes));
      std::memset(tensors_.back().data(), 0, static_cast<std::size_t>(f.row_bytes));
    }
}

void copy_out_samples(const Shape& shape, const HostDataset& data, const int64_t* indices, SampleTensors& out) {
  const Fields fields = shape.fields();
  const int64_t batch = shape.batch;
#pragma omp parallel for schedule(static) if (shape.parallel())
  for (int64_t i = 0; i < batch; ++i)
    for (std::size_t f = 0; f < fields.size(); ++f)
      std::memcpy(out.at(i, f), data.field(f) + indices[i] * fields[f].row_bytes,
                  static_cast<std::size_t>(fields[f].row_bytes));
}

void stack_samples(const Shape& shape, const SampleTensors& samples, unsigned char* batch_out) {
  const Fields fields = shape.fields();
  int64_t offset[3] = {0, 0, 0};
  for (std::size_t f = 0; f < fields.size(); ++f) offset[f] = shape.field_offset(f);
  const int64_t batch = shape.batch;
#pragma omp parallel for schedule(static) if (shape.parallel())
  for (int64_t i = 0; i < batch; ++i)
    for (std::size_t f = 0; f < fields.size(); ++f)
      std::memcpy(batch_out + offset[f] + i * fields[f].row_bytes, samples.at(i, f),
                  static_cast<std::size_t>(fields[f].row_bytes));
}

void gather_batch(const Shape& shape, const HostDataset& data, const int64_t* indices, unsigned char* batch_out) {
  const Fields fields = shape.fields();
  int64_t offset[3] = {0, 0, 0};
  for (std::size_t f = 0; f < fields.size(); ++f) offset[f] = shape.field_offset(f);
  const int64_t batch = shape.batch;
#pragma omp parallel for schedule(static) if (shape.parallel())
  for (int64_t i = 0; i < batch; ++i)
    for (std::size_t f = 0; f < fields.size(); ++f)
      std::memcpy(batch_out + offset[f] + i * fields[f].row_bytes, data.field(f) + indices[i] * fields[f].row_bytes,
                  static_cast<std::size_t>(fields[f].row_bytes));
}

void stack_token_rows(const int32_t* rows, int64_t T, const int32_t* picked, int64_t B, int32_t* out) {
  int32_t* inputs = out;
  int32_t* targets = out + B * T;
  const auto row_bytes = static_cast<std::size_t>(T) * sizeof(int32_t);
#pragma omp parallel for schedule(static) if (token_rows_parallel(T, B))
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = rows + static_cast<int64_t>(picked[b]) * (T + 1);
    std::memcpy(inputs + b * T, row, row_bytes);
    std::memcpy(targets + b * T, row + 1, row_bytes);
  }
}

TokenRowSamples::TokenRowSamples(int64_t samples, int64_t T) : tokens_(T + 1) {
  rows_.reserve(static_cast<std::size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) {
    rows_.emplace_back(static_cast<std::size_t>(tokens_));
    std::memset(rows_.back().data(), 0, rows_.back().bytes());
  }
}

void stack_token_rows_per_sample(const int32_t* rows, int64_t T, const int32_t* picked, int64_t B, TokenRowSamples& samples,
                                 int32_t* out) {
  TB_REQUIRE(samples.samples() >= B && samples.tokens() == T + 1,
             "the sample buffers hold " + std::to_string(samples.samples()) + " rows of " +
                 std::to_string(samples.tokens()) + " tokens; the batch needs " + std::to_string(B) + " of " +
                 std::to_string(T + 1));
  const bool parallel = token_rows_parallel(T, B);
  const auto sample_bytes = static_cast<std::size_t>(T + 1) * sizeof(int32_t);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(samples.row(b), rows + static_cast<int64_t>(picked[b]) * (T + 1), sample_bytes);
  int32_t* inputs = out;
  int32_t* targets = out + B * T;
  const auto row_bytes = static_cast<std::size_t>(T) * sizeof(int32_t);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(inputs + b * T, samples.row(b), row_bytes);
    std::memcpy(targets + b * T, samples.row(b) + 1, row_bytes);
  }
}

double build_slab(const Shape& shape, const HostDataset& data, const std::vector<int64_t>& order, unsigned char* slab) {
  const auto start = std::chrono::steady_clock::now();
  const Fields fields = shape.fields();
  int64_t offset[3] = {0, 0, 0};
  for (std::size_t f = 0; f < fields.size(); ++f) offset[f] = shape.field_offset(f);
  const int64_t batch = shape.batch, rows = shape.batches_per_epoch() * batch, batch_bytes = shape.batch_bytes();
  // The whole epoch at once: always large enough for the team.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    unsigned char* dst = slab + (r / batch) * batch_bytes;
    const int64_t i = r % batch;
    for (std::size_t f = 0; f < fields.size(); ++f)
      std::memcpy(dst + offset[f] + i * fields[f].row_bytes,
                  data.field(f) + order[static_cast<std::size_t>(r)] * fields[f].row_bytes,
                  static_cast<std::size_t>(fields[f].row_bytes));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<std::pair<std::string, double>> slab_counters(const Shape& shape, double build_s) {
  if (shape.order == Order::sequential) return {{"slab_build_once_ms", 1e3 * build_s}, {"slab_build_ms_per_batch", 0.0}};
  return {{"slab_build_ms", 1e3 * build_s},
          {"slab_build_ms_per_batch", 1e3 * build_s / static_cast<double>(shape.batches_per_epoch())}};
}

}  // namespace tb::collate
