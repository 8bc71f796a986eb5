// attention_tiles [SHAPE ...] [--rounds R] [--calls N]: the bf16 tensor-core attention's tile
// configurations (attention.h's cuda_bf16_*_tilings) held against each other on this GPU. Each one is
// checked against the double reference first (a wrong one is reported as incorrect and not timed),
// then all are timed in interleaved rounds in runtime/schedule.h's order (N calls between two CUDA
// events per measurement), so that the GPU's clocks and a shared host drift alike for all of them. Prints per
// shape, pass and tiling the median time and TFLOP/s (the stage's counting: the forward's 4 B H S^2 D
// halved when causal, the backward twice that) and the ratio to the default with its range over the
// rounds. The default is what benchsuite's rows and the training step run; this answers "would
// another tiling be faster here" before one is made the default.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "runtime/cuda_raii.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/schedule.h"
#include "runtime/stats.h"

namespace {

using namespace tb;
using namespace tb::attention;

std::vector<bf16_bits> to_bits(int64_t n, float (*input)(int64_t, DType)) {
  std::vector<bf16_bits> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float x = input(i, DType::bf16);  // already rounded: the upper half is exact
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    out[i] = static_cast<bf16_bits>(u >> 16);
  }
  return out;
}
float dout_input(int64_t i, DType) { return input_dout(i); }

template <class T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& host) {
  cuda::DeviceBuffer<T> d(host.size());
  CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
std::vector<float> download_float(const float* d, int64_t n) {
  std::vector<float> h(static_cast<std::size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}
std::vector<float> download_bf16(const bf16_bits* d, int64_t n) {
  std::vector<bf16_bits> h(static_cast<std::size_t>(n));
  CUDA_CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(bf16_bits), cudaMemcpyDeviceToHost));
  std::vector<float> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = bf16_bits_to_float(h[i]);
  return out;
}

struct Entry {
  std::string pass, tiling;
  bool correct = false;
  std::string why;
  std::vector<double> seconds;  // one per round
};

void report(const Shape& s, bool causal, std::vector<Entry>& entries, double flops_forward) {
  const char* mask = causal ? "causal" : "full";
  for (const Entry& e : entries) {
    const std::string shape = std::to_string(s.batch) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.seq) + "x" +
                              std::to_string(s.head_dim);
    if (!e.correct) {
      std::printf("%-16s %-6s %-8s %-24s incorrect: %s\n", shape.c_str(), mask, e.pass.c_str(), e.tiling.c_str(),
                  e.why.c_str());
      continue;
    }
    const double work = e.pass == "forward" ? flops_forward : 2 * flops_forward;
    const double t = median_of(e.seconds);
    const Entry* base = nullptr;  // the pass's default: the first of its pass
    for (const Entry& b : entries)
      if (b.pass == e.pass) {
        base = &b;
        break;
      }
    std::string ratio = "(default)";
    if (base != &e && base->correct) {
      std::vector<double> r;
      for (std::size_t i = 0; i < e.seconds.size(); ++i) r.push_back(e.seconds[i] / base->seconds[i]);
      char text[96];
      std::snprintf(text, sizeof text, "%.3fx the default's time (rounds %.3f-%.3f)", median_of(r),
                    *std::min_element(r.begin(), r.end()), *std::max_element(r.begin(), r.end()));
      ratio = text;
    }
    std::printf("%-16s %-6s %-8s %-24s %9.3f ms %7.1f TFLOP/s  %s\n", shape.c_str(), mask, e.pass.c_str(), e.tiling.c_str(),
                t * 1e3, work / t / 1e12, ratio.c_str());
  }
  std::fflush(stdout);
}

int run(const std::vector<std::string>& shapes, int rounds, int calls) {
  cuda::Stream stream;
  cuda::Event start, stop;
  auto time_calls = [&](auto&& call) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int c = 0; c < calls; ++c) call();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3 / calls;
  };
  const auto forward_names = cuda_bf16_forward_tilings(), backward_names = cuda_bf16_backward_tilings();
  for (const std::string& text : shapes) {
    const Shape s = parse_shape(text);
    if (const std::string why = cuda_bf16_reason(s); !why.empty()) {
      std::printf("%s: %s\n", text.c_str(), why.c_str());
      continue;
    }
    const int64_t n = s.elements();
    auto q = upload(to_bits(n, input_q)), k = upload(to_bits(n, input_k)), v = upload(to_bits(n, input_v));
    auto dout = upload(to_bits(n, dout_input));
    cuda::DeviceBuffer<bf16_bits> o(static_cast<std::size_t>(n));
    cuda::DeviceBuffer<float> lse(static_cast<std::size_t>(s.rows())), dq(static_cast<std::size_t>(n)),
        dk(static_cast<std::size_t>(n)), dv(static_cast<std::size_t>(n)),
        scratch(static_cast<std::size_t>(cuda_bf16_backward_scratch(s)));
    const Bf16Operands x{q.data(), k.data(), v.data(), o.data(), dout.data()};
    const Gradients<float> g{dq.data(), dk.data(), dv.data(), nullptr};
    for (const bool causal : {true, false}) {
      std::vector<Entry> entries;
      for (std::size_t f = 0; f < forward_names.size(); ++f) {
        Entry e{"forward", forward_names[f]};
        cuda_bf16_forward_tiled(f, s, causal, q.data(), k.data(), v.data(), o.data(), lse.data(), stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        const Verdict verdict = check_output(s, causal, DType::bf16, download_bf16(o.data(), n));
        e.correct = verdict.passed;
        e.why = verdict.detail;
        entries.push_back(e);
      }
      // The backward from the default forward's O and log-sum-exp.
      cuda_bf16_forward(s, causal, q.data(), k.data(), v.data(), o.data(), lse.data(), stream);
      for (std::size_t b = 0; b < backward_names.size(); ++b) {
        Entry e{"backward", backward_names[b]};
        cuda_bf16_backward_tiled(b, s, causal, x, lse.data(), g, bhsd(s), scratch.data(), stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        const Verdict verdict = check_gradients(s, causal, DType::bf16, download_float(dq.data(), n),
                                                download_float(dk.data(), n), download_float(dv.data(), n));
        e.correct = verdict.passed;
        e.why = verdict.detail;
        entries.push_back(e);
      }
      for (const std::size_t at : schedule(entries.size(), static_cast<std::size_t>(rounds))) {
        Entry& e = entries[at];
        if (!e.correct) continue;
        const std::size_t index = at < forward_names.size() ? at : at - forward_names.size();
        if (e.pass == "forward")
          e.seconds.push_back(time_calls([&] {
            cuda_bf16_forward_tiled(index, s, causal, q.data(), k.data(), v.data(), o.data(), lse.data(), stream);
          }));
        else
          e.seconds.push_back(time_calls(
              [&] { cuda_bf16_backward_tiled(index, s, causal, x, lse.data(), g, bhsd(s), scratch.data(), stream); }));
      }
      report(s, causal, entries, attention_flops(s, causal));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes;
  int rounds = 7, calls = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--rounds" || arg == "--calls") && i + 1 < argc) {
      const int value = std::atoi(argv[++i]);
      if (value < 1) {
        std::fprintf(stderr, "attention_tiles: %s takes a positive count\n", arg.c_str());
        return 2;
      }
      (arg == "--rounds" ? rounds : calls) = value;
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "attention_tiles [SHAPE ...] [--rounds R] [--calls N]: the bf16 attention's tilings, checked, "
          "then timed interleaved (default 4x16x4096x128 16x16x2048x64, 7 rounds of 10 calls)\n");
      return 0;
    } else if (const std::string why = shape_invalid_reason(arg); !why.empty()) {
      std::fprintf(stderr, "attention_tiles: '%s': %s\n", arg.c_str(), why.c_str());
      return 2;
    } else {
      shapes.push_back(arg);
    }
  }
  if (shapes.empty()) shapes = {"4x16x4096x128", "16x16x2048x64"};
  try {
    return run(shapes, rounds, calls);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_tiles: %s\n", e.what());
    return 1;
  }
}
