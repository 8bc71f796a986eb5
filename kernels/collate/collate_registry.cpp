// Stage `collate`: per-sample copy + stack against the paths that avoid it. Sizes in
// runtime/defaults.h.
#include <unistd.h>

#include "collate.h"
#include "runtime/defaults.h"
#include "runtime/device_info.h"

namespace tb {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// What a variant holds beyond the host dataset, in datasets and batches.
struct Footprint {
  double host_datasets = 1, host_batches = 0, device_datasets = 0, device_batches = 0;
};

// Whether a variant has a form for layout=token_rows (the training step's data path).
enum class TokenRows { runs, field_layouts_only };

std::function<std::string(const Problem&)> unsupported(Footprint fp, TokenRows token_rows) {
  return [fp, token_rows](const Problem& p) -> std::string {
    const collate::Shape s = collate::shape_of(p);
    if (const std::string why = collate::invalid_reason(s); !why.empty()) return why;
    if (token_rows == TokenRows::field_layouts_only)
      if (const std::string why = collate::field_layout_reason(s); !why.empty()) return why;
    const double dataset = static_cast<double>(s.dataset_bytes());
    const double batch = static_cast<double>(s.batch_bytes());
    const std::string host = host_memory_reason(fp.host_datasets * dataset + fp.host_batches * batch);
    if (!host.empty()) return host;
    return device_memory_reason(fp.device_datasets * dataset + fp.device_batches * batch);
  };
}

// The working set of back-to-back calls, for the cache test of % peak. Consecutive calls take
// consecutive batches of the epoch, so a path that gathers from the dataset (or reads a slab) touches
// the samples of a whole epoch, not one batch's worth; to that come the batch-sized buffers it
// writes and reads again (sample tensors, stacked and device batches).
struct Touched {
  double epochs = 0;   // the epoch's samples (batches_per_epoch x batch bytes), one batch per call
  double batches = 0;  // batch-sized buffers, host and device
};

// What the timed region moves: nothing (a view), the batch across the link, or a copy inside one memory.
enum class Moves { nothing, transfer, copy };

// Bytes per call: for a transfer, the batch that crosses the link (as `peak`'s H2D rows count it);
// for a copy inside one memory, the batch's dataset rows read and the batch written once (as `peak`'s
// copy rows count it; for the field layouts twice the batch), the least any collate moves; 0 for a
// view, whose timed region moves nothing. Counters: samples per call (samples/s = samples / time),
// copies across the link, kernels, and bytes the host copies.
std::function<Work(const Problem&)> work(Moves moves, const char* peak_key, double h2d_copies_per_field,
                                         double fixed_h2d_copies, double host_copies, bool gather_kernel, Touched touched) {
  return [=](const Problem& p) {
    const collate::Shape s = collate::shape_of(p);
    const double batch = static_cast<double>(s.batch_bytes());
    const double batch_rows = static_cast<double>(s.batch * s.dataset_row_bytes());  // what a batch reads
    const double epoch = static_cast<double>(s.batches_per_epoch()) * batch_rows;
    double bytes = moves == Moves::copy ? batch_rows + batch : moves == Moves::transfer ? batch : 0.0;
    double footprint = touched.epochs * epoch + touched.batches * batch;
    if (gather_kernel) {
      // The batch's indices and the epoch's order: int64, or the step's int32 sample ids for token rows.
      const double index_bytes = s.layout == collate::Layout::token_rows ? 4.0 : 8.0;
      bytes += index_bytes * static_cast<double>(s.batch);
      footprint += index_bytes * static_cast<double>(s.batches_per_epoch() * s.batch);
    }
    const double kernels = (gather_kernel ? 1.0 : 0.0) + (s.compute_us > 0 ? 1.0 : 0.0);
    Work w{bytes, 0.0, Work::Bound::memory, peak_key, {}};
    // Not the default (the bytes moved): that counts one batch, not the epoch a gather cycles through.
    w.footprint_bytes = footprint;
    w.counters = {{"samples_per_call", static_cast<double>(s.batch)}};
    if (p.has("compute_us")) {
      w.counters.emplace_back("h2d_copies",
                              h2d_copies_per_field * static_cast<double>(s.fields().size()) + fixed_h2d_copies);
      w.counters.emplace_back("kernels", kernels);
    }
    w.counters.emplace_back("host_bytes", host_copies * batch);
    return w;
  };
}

}  // namespace

void register_stage_collate(Registry& registry) {
  using namespace collate;
  Stage s;
  s.name = "collate";
  s.question =
      "what the __getitem__ copy + torch.stack + pageable copy pattern costs against one copy, a resident "
      "dataset and a prefetch that hides the copy";
  s.source =
      "docs/sources.md#001-energy-flow-bridge (tensor copies in __getitem__, stack in collate_fn, whole dataset to the GPU, "
      "pin_memory, "
      "prefetch), docs/sources.md#000-sem-v55 (loader workers, shuffle)";
  s.axes = {
      Axis{"layout",
           AxisKind::choice,
           {"text_pair", "tokens"},
           {"text_pair"},
           "text_pair: two embed_dim fp32 embeddings + seq_len int64 token ids a sample "
           "(docs/sources.md#001-energy-flow-bridge); tokens: the "
           "token ids alone; token_rows (not a default): the training step's data path, rows of seq_len + 1 int32 "
           "tokens batched as inputs then next-token targets (per_sample, gather, resident)",
           {"text_pair", "tokens", "token_rows"}},
      Axis{"order",
           AxisKind::choice,
           {"shuffled"},
           {},
           "the epoch's order: a seeded permutation, or sequential",
           {"shuffled", "sequential"}},
      Axis{"samples",
           AxisKind::positive_int,
           {str(defaults::collate_samples)},
           {str(defaults::quick_collate_samples)},
           "samples in the dataset; the last partial batch of an epoch is dropped",
           {}},
      Axis{"batch",
           AxisKind::positive_int,
           {str(defaults::collate_batch_before), str(defaults::collate_batch_after), str(defaults::collate_batch_large)},
           {str(defaults::collate_batch_after), str(defaults::collate_batch_large)},
           "samples per batch (docs/sources.md#001-energy-flow-bridge: 16 -> 64; docs/sources.md#000-sem-v55: 4096)",
           {}},
      Axis{"embed_dim",
           AxisKind::positive_int,
           {str(defaults::collate_embed_dim)},
           {},
           "fp32 elements per embedding (text_pair; docs/sources.md#001-energy-flow-bridge)",
           {}},
      Axis{"seq_len",
           AxisKind::positive_int,
           {str(defaults::collate_seq_len)},
           {},
           "int64 token ids per sample (token_rows: int32 inputs and as many targets, from a row one token longer)",
           {}},
      Axis{"compute_us",
           AxisKind::number,
           {"0", str(defaults::collate_compute_us)},
           {},
           "the step's compute per batch on the GPU in microseconds, after the batch lands (0: none, the data path "
           "alone); prefetch overlaps the next copy with it",
           {}},
  };
  const std::vector<std::string> cpu_axes{"layout", "order", "samples", "batch", "embed_dim", "seq_len"};
  std::vector<std::string> cuda_axes = cpu_axes;
  cuda_axes.push_back("compute_us");

  s.variants = {
      Variant{"per_sample", Backend::cpu,
              "__getitem__ copies each sample's tensors out, collate_fn stacks them: every byte copied twice", cpu_axes,
              work(Moves::copy, "cpu.copy", 0, 0, 2, false, {1, 2}), unsupported({1, 2, 0, 0}, TokenRows::runs),
              make_cpu_per_sample, ""},
      Variant{"prebatched", Backend::cpu,
              "samples stored batch by batch in the epoch's order (rebuilt once per epoch when shuffled: "
              "slab_build_ms, outside the timed region): a batch is a view, nothing is copied",
              cpu_axes, work(Moves::nothing, "", 0, 0, 0, false, {0, 0}),
              unsupported({2, 0, 0, 0}, TokenRows::field_layouts_only), make_cpu_prebatched, ""},
      Variant{"gather", Backend::cpu, "each row from the dataset straight into a reused batch buffer: one copy", cpu_axes,
              work(Moves::copy, "cpu.copy", 0, 0, 1, false, {1, 1}), unsupported({1, 1, 0, 0}, TokenRows::runs),
              make_cpu_gather, ""},

      Variant{"per_sample", Backend::cuda,
              "__getitem__ copies out, torch.stack into pageable tensors, one pageable H2D per tensor: the default "
              "DataLoader path",
              cuda_axes, work(Moves::transfer, "cuda.h2d_pageable", 1, 0, 2, false, {1, 3}),
              unsupported({1, 2, 0, 1}, TokenRows::field_layouts_only), cuda_factory(make_cuda_per_sample), ""},
      Variant{"pinned", Backend::cuda,
              "rows stacked straight into a pinned batch (double-buffered), one async H2D: pin_memory without the "
              "per-sample copies",
              cuda_axes, work(Moves::transfer, "cuda.h2d_pinned", 0, 1, 1, false, {1, 3}),
              unsupported({1, 2, 0, 1}, TokenRows::field_layouts_only), cuda_factory(make_cuda_pinned), ""},
      Variant{"prebatched", Backend::cuda,
              "a pageable slab stored batch by batch (reshuffled once per epoch, slab_build_ms, untimed): a batch is "
              "a view, one H2D",
              cuda_axes, work(Moves::transfer, "cuda.h2d_pageable", 0, 1, 0, false, {1, 1}),
              unsupported({2, 0, 0, 1}, TokenRows::field_layouts_only),
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_prebatched(p, c, false); }), ""},
      Variant{"prebatched_pinned", Backend::cuda,
              "the same slab in pinned memory: one async H2D and no host work, the best a host-side dataset gets", cuda_axes,
              work(Moves::transfer, "cuda.h2d_pinned", 0, 1, 0, false, {1, 1}),
              unsupported({2, 0, 0, 1}, TokenRows::field_layouts_only),
              cuda_factory([](const Problem& p, const RunContext& c) { return make_cuda_prebatched(p, c, true); }), ""},
      Variant{"resident", Backend::cuda,
              "the dataset in device memory (torch.load to cuda, docs/sources.md#001-energy-flow-bridge): a gather kernel "
              "by index, no transfer",
              cuda_axes, work(Moves::copy, "cuda.copy", 0, 0, 0, true, {1, 1}), unsupported({1, 0, 1, 1}, TokenRows::runs),
              cuda_factory(make_cuda_resident), ""},
      Variant{"prefetch", Backend::cuda,
              "pinned double buffering on two streams: batch i+1's copy runs under batch i's compute (copy_hidden)",
              cuda_axes, work(Moves::transfer, "cuda.h2d_pinned", 0, 1, 1, false, {1, 4}),
              unsupported({1, 2, 0, 2}, TokenRows::field_layouts_only), cuda_factory(make_cuda_prefetch), ""},
  };
  // A pre-batched slab is built outside the timed region, once per epoch: its pairs add that cost
  // back per batch, so that they compare what a batch costs either way.
  const MovedOutCost slab_rebuild{"slab build", "slab_build_ms_per_batch", "slab_build_ms", "epoch", "batch"};
  s.pairs = {
      Pair{"per_sample", "pinned", "pinned stack + async copy vs per-sample copies + stack + pageable copy"},
      Pair{"per_sample", "prebatched", "pre-batched slab, rebuilt per epoch, vs per-sample copies + stack", slab_rebuild},
      Pair{"pinned", "prebatched_pinned", "pre-batched pinned slab, rebuilt per epoch, vs pinned stack + copy",
           slab_rebuild},
      Pair{"pinned", "resident", "GPU-resident gather vs pinned stack + copy"},
      Pair{"pinned", "prefetch", "double-buffered prefetch vs pinned stack + copy"},
      Pair{"per_sample", "gather", "gather into a reused buffer vs per-sample copies + stack"},
  };
  registry.add(std::move(s));
}

}  // namespace tb
