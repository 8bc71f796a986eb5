// The problem (shape, epoch order, generated values) and the oracle for `collate`: plain loops.
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "collate.h"
#include "runtime/defaults.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace tb::collate {

Fields Shape::fields() const {
  Fields out;
  if (layout == Layout::token_rows) {
    out.add(Field{"inputs", seq_len * 4, 4, true});
    out.add(Field{"targets", seq_len * 4, 4, true});
    return out;
  }
  if (layout == Layout::text_pair) {
    out.add(Field{"input_embedding", embed_dim * 4, 4});
    out.add(Field{"target_embedding", embed_dim * 4, 4});
  }
  out.add(Field{"tokens", seq_len * 8, 8, true});
  return out;
}

int64_t Shape::sample_bytes() const {
  int64_t bytes = 0;
  for (const auto& f : fields()) bytes += f.row_bytes;
  return bytes;
}

int64_t Shape::dataset_row_bytes() const { return layout == Layout::token_rows ? (seq_len + 1) * 4 : sample_bytes(); }

int64_t Shape::field_offset(std::size_t f) const {
  const Fields all = fields();
  int64_t offset = 0;
  for (std::size_t g = 0; g < f && g < all.size(); ++g) offset += batch * all[g].row_bytes;
  return offset;
}

bool Shape::parallel() const { return batch_bytes() >= defaults::collate_parallel_min_bytes; }

Shape shape_of(const Problem& p) {
  Shape s;
  const std::string& layout = p.get("layout");
  if (layout == "text_pair") s.layout = Layout::text_pair;
  else if (layout == "tokens") s.layout = Layout::tokens;
  else if (layout == "token_rows") s.layout = Layout::token_rows;
  else throw UsageError("collate: layout=" + layout + " (text_pair, tokens, token_rows)");
  const std::string& order = p.get("order");
  if (order == "shuffled") s.order = Order::shuffled;
  else if (order == "sequential") s.order = Order::sequential;
  else throw UsageError("collate: order=" + order + " (shuffled, sequential)");
  s.samples = p.get_int("samples");
  s.batch = p.get_int("batch");
  s.embed_dim = p.get_int("embed_dim");
  s.seq_len = p.get_int("seq_len");
  s.compute_us = p.has("compute_us") ? p.get_double("compute_us") : 0.0;
  return s;
}

std::string invalid_reason(const Shape& s) {
  if (s.samples < s.batch)
    return "samples=" + std::to_string(s.samples) + " < batch=" + std::to_string(s.batch) +
           ": the dataset holds no full batch (the last partial batch is dropped)";
  if (!(s.compute_us >= 0 && s.compute_us <= 1e6)) return "compute_us must be between 0 and 1e6";
  if (s.layout == Layout::token_rows && s.samples > std::numeric_limits<int32_t>::max())
    return "layout=token_rows picks rows by int32 sample id, as the step does: at most 2^31 - 1 samples";
  return "";
}

Shape runnable_shape(const Problem& problem) {
  Shape shape = shape_of(problem);
  if (const std::string why = invalid_reason(shape); !why.empty()) throw UsageError("collate: " + why);
  return shape;
}

std::string field_layout_reason(const Shape& shape) {
  if (shape.layout != Layout::token_rows) return "";
  return "layout=token_rows (the training step's data path) has a form in per_sample and gather on the CPU and "
         "resident on CUDA only";
}

void require_field_layout(const Problem& problem) {
  if (const std::string why = field_layout_reason(shape_of(problem)); !why.empty()) throw UsageError("collate: " + why);
}

std::vector<int64_t> epoch_order(const Shape& shape) {
  std::vector<int64_t> order(static_cast<std::size_t>(shape.samples));
  for (int64_t i = 0; i < shape.samples; ++i) order[static_cast<std::size_t>(i)] = i;
  if (shape.order == Order::shuffled)
    for (int64_t i = shape.samples - 1; i > 0; --i) {
      const uint64_t r = splitmix64(defaults::collate_shuffle_seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
      std::swap(order[static_cast<std::size_t>(i)], order[r % static_cast<uint64_t>(i + 1)]);
    }
  return order;
}

float embedding_value(uint64_t seed, int64_t sample, int64_t j, int64_t embed_dim) {
  return uniform_at(seed, static_cast<uint64_t>(sample * embed_dim + j));
}

int64_t token_value(int64_t sample, int64_t t, int64_t seq_len) {
  return static_cast<int64_t>(splitmix64(seed_tokens * 0xd1342543de82ef95ull + static_cast<uint64_t>(sample * seq_len + t)) %
                              static_cast<uint64_t>(vocab));
}

int32_t token_row_value(int64_t sample, int64_t t, int64_t seq_len) {
  return static_cast<int32_t>(token_value(sample, t, seq_len + 1));  // below vocab: fits int32
}

void reference_token_rows(const int32_t* rows, int64_t T, const int32_t* picked, int64_t B, int32_t* out) {
  int32_t* inputs = out;
  int32_t* targets = out + B * T;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = rows + static_cast<int64_t>(picked[b]) * (T + 1);
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = row[t];
      targets[b * T + t] = row[t + 1];
    }
  }
}

namespace {

// Element j of field f of dataset sample `sample`, as bytes.
void write_element(const Shape& shape, std::size_t f, int64_t sample, int64_t j, unsigned char* dst) {
  const bool embedding = shape.layout == Layout::text_pair && f < 2;
  if (embedding) {
    const float v = embedding_value(f == 0 ? seed_input : seed_target, sample, j, shape.embed_dim);
    std::memcpy(dst, &v, sizeof v);
  } else {
    const int64_t v = token_value(sample, j, shape.seq_len);
    std::memcpy(dst, &v, sizeof v);
  }
}

std::string element_text(const Field& field, const unsigned char* at) {
  std::ostringstream out;
  out.precision(9);
  if (!field.integer) {
    float v;
    std::memcpy(&v, at, sizeof v);
    out << v;
  } else if (field.elem_bytes == 4) {
    int32_t v;
    std::memcpy(&v, at, sizeof v);
    out << v;
  } else {
    int64_t v;
    std::memcpy(&v, at, sizeof v);
    out << v;
  }
  return out.str();
}

// Token rows: the batch's rows regenerated (row i is sample order[k * batch + i]), then the oracle.
std::vector<unsigned char> reference_token_rows_batch(const Shape& shape, const std::vector<int64_t>& order, int64_t k) {
  const int64_t B = shape.batch, T = shape.seq_len;
  std::vector<int32_t> rows(static_cast<std::size_t>(B * (T + 1))), picked(static_cast<std::size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    const int64_t sample = order[static_cast<std::size_t>(k * B + i)];
    picked[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    for (int64_t t = 0; t <= T; ++t) rows[static_cast<std::size_t>(i * (T + 1) + t)] = token_row_value(sample, t, T);
  }
  std::vector<int32_t> batch(static_cast<std::size_t>(2 * B * T));
  reference_token_rows(rows.data(), T, picked.data(), B, batch.data());
  std::vector<unsigned char> out(batch.size() * sizeof(int32_t));
  std::memcpy(out.data(), batch.data(), out.size());
  return out;
}

}  // namespace

std::vector<unsigned char> reference_batch(const Shape& shape, const std::vector<int64_t>& order, int64_t k) {
  if (shape.layout == Layout::token_rows) return reference_token_rows_batch(shape, order, k);
  std::vector<unsigned char> out(static_cast<std::size_t>(shape.batch_bytes()));
  const auto fields = shape.fields();
  for (std::size_t f = 0; f < fields.size(); ++f) {
    const int64_t elems = fields[f].row_bytes / fields[f].elem_bytes;
    for (int64_t i = 0; i < shape.batch; ++i) {
      const int64_t sample = order[static_cast<std::size_t>(k * shape.batch + i)];
      for (int64_t j = 0; j < elems; ++j)
        write_element(shape, f, sample, j,
                      out.data() + shape.field_offset(f) + i * fields[f].row_bytes + j * fields[f].elem_bytes);
    }
  }
  return out;
}

Verdict check_batch(const Shape& shape, const std::vector<int64_t>& order, int64_t k, const unsigned char* got) {
  const auto want = reference_batch(shape, order, k);
  if (std::memcmp(got, want.data(), want.size()) == 0) return Verdict{true, 0.0, ""};
  std::size_t differing = 0, first = want.size();
  for (std::size_t b = 0; b < want.size(); ++b)
    if (got[b] != want[b]) {
      ++differing;
      if (first == want.size()) first = b;
    }
  const auto fields = shape.fields();
  std::size_t f = 0;
  while (f + 1 < fields.size() && static_cast<int64_t>(first) >= shape.field_offset(f + 1)) ++f;
  const int64_t within = static_cast<int64_t>(first) - shape.field_offset(f);
  const int64_t i = within / fields[f].row_bytes;
  const int64_t j = (within % fields[f].row_bytes) / fields[f].elem_bytes;
  const int64_t element_at = shape.field_offset(f) + i * fields[f].row_bytes + j * fields[f].elem_bytes;
  std::ostringstream msg;
  msg << "batch " << k << ": " << fields[f].name << " of sample " << i << " (dataset index "
      << order[static_cast<std::size_t>(k * shape.batch + i)] << "), element " << j << " = "
      << element_text(fields[f], got + element_at) << ", reference " << element_text(fields[f], want.data() + element_at)
      << "; " << differing << " of " << want.size() << " bytes differ";
  return Verdict{false, static_cast<double>(differing), msg.str()};
}

uint32_t batch_checksum(const unsigned char* batch, int64_t bytes) {
  uint32_t sum = 0;
  for (int64_t w = 0; w < bytes / 4; ++w) {
    uint32_t word;
    std::memcpy(&word, batch + 4 * w, sizeof word);
    sum += word;
  }
  return sum;
}

}  // namespace tb::collate
