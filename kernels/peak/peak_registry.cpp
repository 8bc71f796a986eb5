// Stage `peak`: the measured ceilings. Sizes in runtime/defaults.h.
#include "peak.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

Work stream_work(const Problem& p, int arrays, const char* peak_key) {
  return Work{static_cast<double>(arrays) * 8.0 * static_cast<double>(p.get_int("n")),
              arrays == 3 ? 2.0 * static_cast<double>(p.get_int("n")) : 0.0,
              Work::Bound::memory,
              peak_key,
              {}};
}

Work gemm_work(int64_t n, double element_bytes, const char* peak_key) {
  const double nn = static_cast<double>(n);
  return Work{3.0 * nn * nn * element_bytes, 2.0 * nn * nn * nn, Work::Bound::compute, peak_key, {}};
}

Work transfer_work(const Problem& p, const char* peak_key) {
  return Work{static_cast<double>(p.get_int("transfer_bytes") / 4 * 4), 0.0, Work::Bound::memory, peak_key, {}};
}

}  // namespace

void register_stage_peak(Registry& registry) {
  using namespace peak;
  Stage s;
  s.name = "peak";
  s.question = "the machine's measured ceilings: every other stage reports % of these";
  s.source = "all reports (what 'expected 2-3x' would have to be measured against)";
  s.axes = {
      Axis{"n",
           AxisKind::positive_int,
           {str(defaults::stream_elements)},
           {str(defaults::quick_stream_elements)},
           "elements (double) per STREAM array",
           {}},
      Axis{"cpu_gemm_n",
           AxisKind::positive_int,
           {str(defaults::cpu_gemm_n)},
           {str(defaults::quick_cpu_gemm_n)},
           "m = n = k of the CPU BLAS SGEMM",
           {}},
      Axis{"gemm_n",
           AxisKind::positive_int,
           {str(defaults::cuda_gemm_n)},
           {str(defaults::quick_cuda_gemm_n)},
           "m = n = k of the cuBLAS GEMMs",
           {}},
      Axis{"transfer_bytes",
           AxisKind::positive_int,
           {str(defaults::transfer_bytes)},
           {str(defaults::quick_transfer_bytes)},
           "bytes per host<->device copy (a multiple of 4)",
           {}},
  };

  auto host_stream = [](int arrays) {
    return [arrays](const Problem& p) { return host_memory_reason(arrays * 8.0 * static_cast<double>(p.get_int("n"))); };
  };
  auto device_stream = [](int arrays) {
    return [arrays](const Problem& p) { return device_memory_reason(arrays * 8.0 * static_cast<double>(p.get_int("n"))); };
  };
  auto transfer_reason = [](const Problem& p) -> std::string {
    const auto bytes = p.get_int("transfer_bytes");
    if (bytes % 4) return "transfer_bytes must be a multiple of 4";
    const std::string host = host_memory_reason(2.0 * static_cast<double>(bytes));
    return host.empty() ? device_memory_reason(static_cast<double>(bytes)) : host;
  };
  auto gemm_reason = [](double element_bytes) {
    return [element_bytes](const Problem& p) -> std::string {
      const auto n = p.get_int("gemm_n");
      if (n > 46340) return "gemm_n above 46340: n*n overflows cuBLAS's int leading dimensions";
      return device_memory_reason(3.0 * element_bytes * static_cast<double>(n) * static_cast<double>(n));
    };
  };

  s.variants = {
      Variant{"copy",
              Backend::cpu,
              "STREAM copy, OpenMP: the CPU's read+write bandwidth",
              {"n"},
              [](const Problem& p) { return stream_work(p, 2, "cpu.copy"); },
              host_stream(3),
              make_cpu_copy,
              "cpu.copy"},
      Variant{"triad",
              Backend::cpu,
              "STREAM triad, OpenMP: the bandwidth a fused elementwise update can reach",
              {"n"},
              [](const Problem& p) { return stream_work(p, 3, "cpu.triad"); },
              host_stream(3),
              make_cpu_triad,
              "cpu.triad"},
      Variant{"memory",
              Backend::cpu,
              "the memory ceiling: the best of the access mixes the stages use (copy; triad; read-modify-write of 4 "
              "streams in, 3 out as AdamW's), each at 24 n bytes per call, at every team size",
              {"n"},
              [](const Problem& p) {
                return Work{24.0 * static_cast<double>(p.get_int("n")), 0.0, Work::Bound::memory, "cpu.memory", {}};
              },
              host_stream(3),
              make_cpu_memory,
              "cpu.memory"},
      Variant{"triad_1thread",
              Backend::cpu,
              "the same triad on one core: what threading buys",
              {"n"},
              [](const Problem& p) { return stream_work(p, 3, "cpu.triad"); },
              host_stream(3),
              make_cpu_triad_1thread,
              ""},
      Variant{"gemm_fp32",
              Backend::cpu,
              "SGEMM from the CPU BLAS: the CPU's compute ceiling",
              {"cpu_gemm_n"},
              [](const Problem& p) { return gemm_work(p.get_int("cpu_gemm_n"), 4, "cpu.gemm_fp32"); },
              [](const Problem& p) {
                const double n = static_cast<double>(p.get_int("cpu_gemm_n"));
                return host_memory_reason(12.0 * n * n);
              },
              make_cpu_gemm_fp32,
              "cpu.gemm_fp32"},

      Variant{"copy",
              Backend::cuda,
              "device copy kernel (16-byte accesses): HBM read+write bandwidth",
              {"n"},
              [](const Problem& p) { return stream_work(p, 2, "cuda.copy"); },
              device_stream(3),
              cuda_factory(make_cuda_copy),
              "cuda.copy"},
      Variant{"triad",
              Backend::cuda,
              "device STREAM triad: the ceiling of a fused elementwise kernel",
              {"n"},
              [](const Problem& p) { return stream_work(p, 3, "cuda.triad"); },
              device_stream(3),
              cuda_factory(make_cuda_triad),
              "cuda.triad"},
      Variant{"h2d_pinned",
              Backend::cuda,
              "host-to-device from pinned memory: a loader with pin_memory",
              {"transfer_bytes"},
              [](const Problem& p) { return transfer_work(p, "cuda.h2d_pinned"); },
              transfer_reason,
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_transfer(p, c, true, true); }),
              "cuda.h2d_pinned"},
      Variant{"h2d_pageable",
              Backend::cuda,
              "host-to-device from pageable memory: the default DataLoader path",
              {"transfer_bytes"},
              [](const Problem& p) { return transfer_work(p, "cuda.h2d_pageable"); },
              transfer_reason,
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_transfer(p, c, true, false); }),
              "cuda.h2d_pageable"},
      Variant{"d2h_pinned",
              Backend::cuda,
              "device-to-host into pinned memory: an async metrics read",
              {"transfer_bytes"},
              [](const Problem& p) { return transfer_work(p, "cuda.d2h_pinned"); },
              transfer_reason,
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_transfer(p, c, false, true); }),
              "cuda.d2h_pinned"},
      Variant{"d2h_pageable",
              Backend::cuda,
              "device-to-host into pageable memory: .item() / .cpu()",
              {"transfer_bytes"},
              [](const Problem& p) { return transfer_work(p, "cuda.d2h_pageable"); },
              transfer_reason,
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_transfer(p, c, false, false); }),
              "cuda.d2h_pageable"},
      Variant{"gemm_fp32",
              Backend::cuda,
              "cuBLAS SGEMM without tensor cores: the fp32 FMA ceiling",
              {"gemm_n"},
              [](const Problem& p) { return gemm_work(p.get_int("gemm_n"), 4, "cuda.gemm_fp32"); },
              gemm_reason(4),
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_gemm(p, c, GemmType::fp32); }),
              "cuda.gemm_fp32"},
      Variant{"gemm_tf32",
              Backend::cuda,
              "cuBLAS GEMM on fp32 data with TF32 tensor cores",
              {"gemm_n"},
              [](const Problem& p) { return gemm_work(p.get_int("gemm_n"), 4, "cuda.gemm_tf32"); },
              gemm_reason(4),
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_gemm(p, c, GemmType::tf32); }),
              "cuda.gemm_tf32"},
      Variant{"gemm_bf16",
              Backend::cuda,
              "cuBLAS bf16 GEMM, fp32 accumulation: the mixed-precision ceiling",
              {"gemm_n"},
              [](const Problem& p) { return gemm_work(p.get_int("gemm_n"), 2, "cuda.gemm_bf16"); },
              gemm_reason(2),
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_gemm(p, c, GemmType::bf16); }),
              "cuda.gemm_bf16"},
  };
  s.pairs = {
      Pair{"triad_1thread", "triad", "triad: OpenMP team vs one thread"},
      Pair{"h2d_pageable", "h2d_pinned", "H2D: pinned vs pageable"},
      Pair{"d2h_pageable", "d2h_pinned", "D2H: pinned vs pageable"},
      Pair{"gemm_fp32", "gemm_tf32", "GEMM: tf32 vs fp32"},
      Pair{"gemm_fp32", "gemm_bf16", "GEMM: bf16 vs fp32"},
  };
  registry.add(std::move(s));
}

}  // namespace tb
