// Stage `collate`: every variant against the reference at odd sizes, shuffled and sequential, after
// one call and after wrapping past the end of the epoch; and the reference itself catches a wrong
// batch (a flipped byte, the wrong order, the wrong batch). The token rows (the training step's data
// path): the host copies and the device gather against the oracle at odd sizes, the oracle against a
// batch written out by hand, and the check against a shift off by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "collate/collate.h"
#include "cuda_testing.h"
#include "runtime/error.h"
#include "stage_testing.h"

namespace tb {
namespace {

const Stage& collate_stage() { return *builtin_registry().find("collate"); }

struct Case {
  const char* layout;
  const char* order;
  int64_t samples, batch, embed_dim, seq_len;
  int runs;  // calls before the check: more than batches_per_epoch wraps to the next epoch
};

// One sample; odd rows (28-byte embeddings take the gather kernel's 4-byte path) wrapping a
// two-batch epoch; token sequences alone; the report's 768-d rows in sequential order; a batch
// above defaults::collate_parallel_min_bytes, so the host copies run on the OpenMP team. Token rows
// (the variants that have a form for them): one token of one sample; 7 tokens wrapping a two-batch
// epoch; 130 tokens (a row longer than a warp) in batches of 17; a batch above the parallel size.
const Case cases[] = {
    {"text_pair", "shuffled", 1, 1, 1, 1, 1},
    {"text_pair", "shuffled", 7, 3, 7, 5, 3},
    {"tokens", "shuffled", 7, 3, 1, 3, 2},
    {"text_pair", "sequential", 1003, 64, 768, 128, 2},
    {"text_pair", "shuffled", 1000, 160, 768, 128, 7},
    {"tokens", "sequential", 1000003, 4099, 1, 1, 3},
    {"token_rows", "shuffled", 1, 1, 1, 1, 1},
    {"token_rows", "shuffled", 7, 3, 1, 7, 3},
    {"token_rows", "sequential", 40, 17, 1, 130, 2},
    {"token_rows", "shuffled", 20000, 4099, 1, 33, 3},
};

bool runs_token_rows(const Variant& v) {
  return v.backend == Backend::cpu ? (v.id == "per_sample" || v.id == "gather") : v.id == "resident";
}

Problem problem_for(const Variant& v, const Case& c, const char* compute_us) {
  Problem p({{"layout", c.layout},
             {"order", c.order},
             {"samples", std::to_string(c.samples)},
             {"batch", std::to_string(c.batch)},
             {"embed_dim", std::to_string(c.embed_dim)},
             {"seq_len", std::to_string(c.seq_len)}});
  if (std::find(v.axes.begin(), v.axes.end(), "compute_us") != v.axes.end()) p.set("compute_us", compute_us);
  return p;
}

class CollateVariant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CollateVariant, MatchesReferenceByteForByte) {
  const Variant& v = collate_stage().variants.at(GetParam());
  if (const std::string why = testing::cannot_run_here(v); !why.empty())
    GTEST_SKIP() << v.id << " (" << to_string(v.backend) << "): " << why;
  for (const Case& c : cases)
    // With a compute kernel (5 us) the check also compares the checksum it took of its batch.
    for (const char* compute_us : {"0", "5"}) {
      const Problem p = problem_for(v, c, compute_us);
      if (std::string(c.layout) == "token_rows" && !runs_token_rows(v)) break;  // TokenRowsRunsTheStepsPaths
      ASSERT_EQ(v.unsupported(p), "") << p.label();
      const Verdict verdict = testing::run_and_check(v, p, c.runs);
      EXPECT_TRUE(verdict.passed) << to_string(v.backend) << "/" << v.id << " at " << p.label() << " after " << c.runs
                                  << " calls: " << verdict.detail;
      if (!p.has("compute_us")) break;
    }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CollateVariant, ::testing::Range<std::size_t>(0, collate_stage().variants.size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           const Variant& v = collate_stage().variants.at(info.param);
                           return std::string(to_string(v.backend)) + "_" + v.id;
                         });

collate::Shape small_shape(collate::Order order) {
  collate::Shape s;
  s.layout = collate::Layout::text_pair;
  s.order = order;
  s.samples = 50;
  s.batch = 8;
  s.embed_dim = 6;
  s.seq_len = 3;
  return s;
}

TEST(CollateReference, EpochOrderIsASeededPermutation) {
  const auto shuffled = collate::epoch_order(small_shape(collate::Order::shuffled));
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(collate::epoch_order(small_shape(collate::Order::sequential)), identity);
  EXPECT_NE(shuffled, identity);
  auto sorted = shuffled;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);
  EXPECT_EQ(collate::epoch_order(small_shape(collate::Order::shuffled)), shuffled);  // deterministic
}

TEST(CollateReference, BatchIsLaidOutFieldByField) {
  const auto shape = small_shape(collate::Order::shuffled);
  const auto order = collate::epoch_order(shape);
  const auto batch = collate::reference_batch(shape, order, 2);
  ASSERT_EQ(static_cast<int64_t>(batch.size()), shape.batch * (2 * 6 * 4 + 3 * 8));
  const int64_t i = 5, sample = order[2 * 8 + i];
  float target;
  std::memcpy(&target, batch.data() + shape.field_offset(1) + (i * 6 + 4) * 4, 4);
  EXPECT_EQ(target, collate::embedding_value(collate::seed_target, sample, 4, 6));
  int64_t token;
  std::memcpy(&token, batch.data() + shape.field_offset(2) + (i * 3 + 2) * 8, 8);
  EXPECT_EQ(token, collate::token_value(sample, 2, 3));
  EXPECT_GE(token, 0);
  EXPECT_LT(token, collate::vocab);
}

TEST(CollateReference, CatchesAFlippedByte) {
  const auto shape = small_shape(collate::Order::shuffled);
  const auto order = collate::epoch_order(shape);
  auto batch = collate::reference_batch(shape, order, 1);
  EXPECT_TRUE(collate::check_batch(shape, order, 1, batch.data()).passed);
  batch[static_cast<std::size_t>(shape.field_offset(2) + 3 * 24 + 9)] ^= 0x01;  // tokens of sample 3, element 1
  const Verdict v = collate::check_batch(shape, order, 1, batch.data());
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.max_error, 1.0);
  EXPECT_NE(v.detail.find("tokens of sample 3"), std::string::npos) << v.detail;
  EXPECT_NE(v.detail.find("element 1"), std::string::npos) << v.detail;
}

TEST(CollateReference, CatchesTheWrongOrderAndTheWrongBatch) {
  const auto shuffled = small_shape(collate::Order::shuffled);
  const auto order = collate::epoch_order(shuffled);
  const auto sequential_batch = collate::reference_batch(shuffled,
                                                         collate::epoch_order(small_shape(collate::Order::sequential)), 0);
  EXPECT_FALSE(collate::check_batch(shuffled, order, 0, sequential_batch.data()).passed);
  const auto batch1 = collate::reference_batch(shuffled, order, 1);
  const Verdict v = collate::check_batch(shuffled, order, 0, batch1.data());
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.detail.find("input_embedding of sample 0"), std::string::npos) << v.detail;
}

TEST(CollateReference, ChecksumIsTheWrappingSumOfWords) {
  const uint32_t words[] = {0xffffffffu, 2u, 7u};
  unsigned char bytes[sizeof words];
  std::memcpy(bytes, words, sizeof words);
  EXPECT_EQ(collate::batch_checksum(bytes, sizeof words), 8u);
}

// ---- token rows -------------------------------------------------------------------------------

// `samples` rows of T + 1 tokens, every token distinct (its index in the dataset), so that a token from
// the wrong row or the wrong place shows.
std::vector<int32_t> numbered_rows(int64_t samples, int64_t T) {
  std::vector<int32_t> rows(static_cast<std::size_t>(samples * (T + 1)));
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

// B picks among `samples` rows from `start` backwards by 3, wrapping (with repeats when B is large),
// as a shuffled order may pick them.
std::vector<int32_t> picks(int64_t B, int64_t samples, int64_t start) {
  std::vector<int32_t> picked(static_cast<std::size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    picked[static_cast<std::size_t>(b)] = static_cast<int32_t>(((start - 3 * b) % samples + samples) % samples);
  return picked;
}

std::vector<int32_t> reference_token_rows(const std::vector<int32_t>& rows, int64_t T, const std::vector<int32_t>& picked) {
  const auto B = static_cast<int64_t>(picked.size());
  std::vector<int32_t> out(static_cast<std::size_t>(2 * B * T));
  collate::reference_token_rows(rows.data(), T, picked.data(), B, out.data());
  return out;
}

struct TokenRowsSize {
  int64_t T, B;
};
// The odd sizes, and one batch above defaults::collate_parallel_min_bytes (the copies on the team).
std::vector<TokenRowsSize> token_rows_sizes() {
  std::vector<TokenRowsSize> sizes;
  for (int64_t T : {1, 7, 130})
    for (int64_t B : {1, 3, 17}) sizes.push_back({T, B});
  sizes.push_back({33, 4099});
  return sizes;
}

// Written out by hand: two rows of three tokens picked in reverse. Inputs are each row's first two
// tokens, targets its last two; a shift off by one either way changes this batch.
TEST(CollateTokenRows, ReferenceShiftsTheTargetsByOneToken) {
  const std::vector<int32_t> rows{10, 11, 12, 20, 21, 22};
  EXPECT_EQ(reference_token_rows(rows, 2, {1, 0}), (std::vector<int32_t>{20, 21, 10, 11, 21, 22, 11, 12}));
}

TEST(CollateTokenRows, HostPathsEqualTheReferenceAtOddSizes) {
  for (const auto [T, B] : token_rows_sizes()) {
    const int64_t samples = B + 5;  // some rows are never picked
    const auto rows = numbered_rows(samples, T);
    const auto picked = picks(B, samples, samples - 1);
    const auto want = reference_token_rows(rows, T, picked);
    std::vector<int32_t> straight(want.size(), -1), per_sample(want.size(), -1);
    collate::stack_token_rows(rows.data(), T, picked.data(), B, straight.data());
    EXPECT_EQ(straight, want) << "stack_token_rows, T=" << T << " B=" << B;
    // The sample buffers are reused: a first batch of other rows leaves nothing behind.
    collate::TokenRowSamples buffers(B, T);
    const auto other = picks(B, samples, 2);
    collate::stack_token_rows_per_sample(rows.data(), T, other.data(), B, buffers, per_sample.data());
    EXPECT_EQ(per_sample, reference_token_rows(rows, T, other)) << "first batch, T=" << T << " B=" << B;
    collate::stack_token_rows_per_sample(rows.data(), T, picked.data(), B, buffers, per_sample.data());
    EXPECT_EQ(per_sample, want) << "stack_token_rows_per_sample, T=" << T << " B=" << B;
    EXPECT_EQ(per_sample, straight) << "T=" << T << " B=" << B;
  }
}

TEST(CollateTokenRows, PerSampleRefusesBuffersOfTheWrongSize) {
  const auto rows = numbered_rows(8, 7);
  const auto picked = picks(3, 8, 7);
  std::vector<int32_t> out(2 * 3 * 7);
  collate::TokenRowSamples too_few(2, 7), too_short(3, 6);
  for (collate::TokenRowSamples* buffers : {&too_few, &too_short})
    EXPECT_THROW(collate::stack_token_rows_per_sample(rows.data(), 7, picked.data(), 3, *buffers, out.data()), CallError);
}

TEST(CollateTokenRows, CudaGatherEqualsTheReferenceAtOddSizes) {
  if (!cuda_status().available()) GTEST_SKIP() << "no CUDA device: " << cuda_status().unavailable_reason;
  std::vector<TokenRowsSize> sizes = token_rows_sizes();
  sizes.push_back({1000, 3});   // a row over several blocks
  sizes.push_back({1, 70001});  // more rows than a grid has along y
  for (const auto [T, B] : sizes) {
    const int64_t samples = B + 5;
    const auto rows = numbered_rows(samples, T);
    const auto picked = picks(B, samples, samples - 1);
    EXPECT_EQ(testing::gather_token_rows_on_device(rows, T, picked), reference_token_rows(rows, T, picked))
        << "T=" << T << " B=" << B;
  }
}

collate::Shape token_rows_shape() {
  collate::Shape s;
  s.layout = collate::Layout::token_rows;
  s.order = collate::Order::shuffled;
  s.samples = 50;
  s.batch = 8;
  s.seq_len = 5;
  return s;
}

// The stage's reference batch is the generator's rows shifted by one token; a batch built with no
// shift, or with both blocks one token late, fails the check, which names the block.
TEST(CollateTokenRows, StageCheckCatchesAShiftOffByOne) {
  const auto shape = token_rows_shape();
  const auto order = collate::epoch_order(shape);
  const int64_t k = 1, B = shape.batch, T = shape.seq_len;
  const auto bytes = collate::reference_batch(shape, order, k);
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), 2 * B * T * 4);
  std::vector<int32_t> batch(bytes.size() / 4);
  std::memcpy(batch.data(), bytes.data(), bytes.size());
  for (int64_t i = 0; i < B; ++i) {
    const int64_t sample = order[static_cast<std::size_t>(k * B + i)];
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(batch[i * T + t], collate::token_row_value(sample, t, T)) << "input " << i << ", " << t;
      ASSERT_EQ(batch[B * T + i * T + t], collate::token_row_value(sample, t + 1, T)) << "target " << i << ", " << t;
    }
  }
  EXPECT_TRUE(collate::check_batch(shape, order, k, bytes.data()).passed);

  auto check = [&](const std::vector<int32_t>& wrong) {
    std::vector<unsigned char> b(bytes.size());
    std::memcpy(b.data(), wrong.data(), b.size());
    return collate::check_batch(shape, order, k, b.data());
  };
  std::vector<int32_t> unshifted = batch;
  std::copy(batch.begin(), batch.begin() + B * T, unshifted.begin() + B * T);  // targets = inputs
  const Verdict no_shift = check(unshifted);
  EXPECT_FALSE(no_shift.passed);
  EXPECT_NE(no_shift.detail.find("targets of sample 0"), std::string::npos) << no_shift.detail;
  std::vector<int32_t> late = batch;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t sample = order[static_cast<std::size_t>(k * B + i)];
    for (int64_t t = 0; t < T; ++t) {
      late[i * T + t] = collate::token_row_value(sample, t + 1, T);
      late[B * T + i * T + t] = t + 2 <= T ? collate::token_row_value(sample, t + 2, T) : 0;
    }
  }
  const Verdict one_late = check(late);
  EXPECT_FALSE(one_late.passed);
  EXPECT_NE(one_late.detail.find("inputs of sample 0"), std::string::npos) << one_late.detail;
}

// layout=token_rows is the step's data path: per_sample and gather on the CPU and resident on CUDA run
// it; every other variant says why not (the registry, before any make), and its factory refuses it.
TEST(CollateStage, TokenRowsRunsTheStepsPaths) {
  const Case c{"token_rows", "shuffled", 64, 8, 1, 16, 1};
  int running = 0;
  for (const auto& v : collate_stage().variants) {
    const std::string why = v.unsupported(problem_for(v, c, "0"));
    if (runs_token_rows(v)) {
      ++running;
      EXPECT_EQ(why, "") << to_string(v.backend) << "/" << v.id;
    } else {
      EXPECT_NE(why.find("layout=token_rows"), std::string::npos) << to_string(v.backend) << "/" << v.id << ": " << why;
    }
  }
  EXPECT_EQ(running, 3);
  const Variant& prebatched = *collate_stage().find_variant("prebatched", Backend::cpu);
  EXPECT_THROW(prebatched.make(problem_for(prebatched, c, "0"), RunContext{}), UsageError);
  EXPECT_EQ(collate_stage().axes.front().name, "layout");
  EXPECT_EQ(collate_stage().axes.front().values, (std::vector<std::string>{"text_pair", "tokens"}));  // not a default
}

// A token-rows copy reads each picked row (T + 1 int32) once and writes inputs and targets (2T): the
// rows, not a second batch, are what it reads; the resident gather's picks are int32.
TEST(CollateStage, WorkModelReadsTheTokenRowsOnce) {
  const Stage& s = collate_stage();
  const Case c{"token_rows", "shuffled", 4096, 64, 768, 128, 1};
  const double batch = 64.0 * 2 * 128 * 4, rows = 64.0 * 129 * 4, epoch = 64 * rows;
  const Variant& gather = *s.find_variant("gather", Backend::cpu);
  const Work w = gather.work(problem_for(gather, c, "0"));
  EXPECT_EQ(w.bytes, rows + batch);
  EXPECT_EQ(w.footprint_bytes, epoch + batch);
  const Variant& resident = *s.find_variant("resident", Backend::cuda);
  const Work r = resident.work(problem_for(resident, c, "0"));
  EXPECT_EQ(r.bytes, rows + batch + 4 * 64);
  EXPECT_EQ(r.footprint_bytes, epoch + batch + 4.0 * 4096);
}

TEST(CollateStage, NoFullBatchIsUnsupportedWithTheReason) {
  for (const auto& v : collate_stage().variants) {
    const Problem p = problem_for(v, Case{"text_pair", "shuffled", 3, 4, 8, 8, 1}, "0");
    EXPECT_NE(v.unsupported(p).find("no full batch"), std::string::npos) << v.id;
  }
  const Variant& gather = *collate_stage().find_variant("gather", Backend::cpu);
  const Problem p = problem_for(gather, Case{"text_pair", "shuffled", 3, 4, 8, 8, 1}, "0");
  EXPECT_THROW(gather.make(p, RunContext{}), UsageError);
  const Variant& prefetch = *collate_stage().find_variant("prefetch", Backend::cuda);
  EXPECT_NE(prefetch.unsupported(problem_for(prefetch, Case{"tokens", "shuffled", 8, 4, 8, 8, 1}, "-1")), "");
}

TEST(CollateStage, WorkModelCountsTheBatch) {
  const Stage& s = collate_stage();
  const Case c{"text_pair", "shuffled", 4096, 64, 768, 128, 1};
  const double batch_bytes = 64.0 * 7168;
  const Variant& pinned = *s.find_variant("pinned", Backend::cuda);
  const Work w = pinned.work(problem_for(pinned, c, "0"));
  EXPECT_EQ(w.bytes, batch_bytes);
  EXPECT_EQ(w.peak_key, "cuda.h2d_pinned");
  ASSERT_FALSE(w.counters.empty());
  EXPECT_EQ(w.counters.front(), (std::pair<std::string, double>{"samples_per_call", 64}));
  const Variant& resident = *s.find_variant("resident", Backend::cuda);
  EXPECT_EQ(resident.work(problem_for(resident, c, "0")).bytes, 2 * batch_bytes + 8 * 64);
  EXPECT_EQ(resident.work(problem_for(resident, c, "0")).peak_key, "cuda.copy");
  EXPECT_EQ(s.find_variant("per_sample", Backend::cuda)->work(problem_for(pinned, c, "0")).peak_key, "cuda.h2d_pageable");
  const Variant& cpu = *s.find_variant("per_sample", Backend::cpu);
  EXPECT_EQ(cpu.work(problem_for(cpu, c, "0")).peak_key, "cpu.copy");
}

// A view moves nothing in its timed region: the work model says so (no bytes, no FLOPs: no GB/s,
// no rate at all), where it once claimed the batch read and written, 2 x batch bytes over ~10 ns.
// The CUDA slabs still copy the batch to the device in their timed region.
TEST(CollateStage, APrebatchedViewMovesNothing) {
  const Stage& s = collate_stage();
  const Case c{"text_pair", "shuffled", 4096, 64, 768, 128, 1};
  const Variant& view = *s.find_variant("prebatched", Backend::cpu);
  const Work w = view.work(problem_for(view, c, "0"));
  EXPECT_TRUE(w.moves_nothing());
  EXPECT_EQ(w.bytes, 0.0);
  EXPECT_EQ(w.peak_key, "");
  for (const char* id : {"prebatched", "prebatched_pinned"}) {
    const Variant& slab = *s.find_variant(id, Backend::cuda);
    const Work cw = slab.work(problem_for(slab, c, "0"));
    EXPECT_FALSE(cw.moves_nothing()) << id;
    EXPECT_EQ(cw.bytes, 64.0 * 7168) << id;
  }
}

// Back-to-back calls gather consecutive batches of the epoch, so the working set a cache would have
// to hold is the whole epoch's samples plus the buffers, not one batch: docs/sources.md#000-sem-v55's batch of 4096
// from 8192 samples touches 117 MB, which no 32 MiB last-level cache holds.
TEST(CollateStage, FootprintCountsTheEpochAGatherCyclesThrough) {
  const Stage& s = collate_stage();
  const Case c{"text_pair", "shuffled", 8192, 4096, 768, 128, 1};
  const double batch = 4096.0 * 7168, epoch = 2 * batch;
  const Variant& per_sample = *s.find_variant("per_sample", Backend::cpu);
  EXPECT_EQ(per_sample.work(problem_for(per_sample, c, "0")).footprint_bytes, epoch + 2 * batch);
  const Variant& gather = *s.find_variant("gather", Backend::cpu);
  EXPECT_EQ(gather.work(problem_for(gather, c, "0")).footprint_bytes, epoch + batch);
  const Variant& resident = *s.find_variant("resident", Backend::cuda);
  EXPECT_EQ(resident.work(problem_for(resident, c, "0")).footprint_bytes, epoch + batch + 8.0 * 8192);
  const Variant& view = *s.find_variant("prebatched", Backend::cpu);
  EXPECT_EQ(view.work(problem_for(view, c, "0")).footprint_bytes, 0.0);
  // The drop_last tail is never gathered: 8191 samples make one batch of 4096, and 4095 are left.
  const Case tail{"text_pair", "shuffled", 8191, 4096, 768, 128, 1};
  EXPECT_EQ(gather.work(problem_for(gather, tail, "0")).footprint_bytes, 2 * batch);
}

TEST(CollateStage, DeclaresTheIssuesPairsAndEveryVariant) {
  const Stage& s = collate_stage();
  std::set<std::pair<std::string, std::string>> pairs;
  for (const auto& p : s.pairs) pairs.emplace(p.baseline, p.improved);
  for (const auto& [baseline, improved] : std::vector<std::pair<std::string, std::string>>{
           {"per_sample", "pinned"}, {"per_sample", "prebatched"}, {"pinned", "resident"}, {"pinned", "prefetch"}})
    EXPECT_TRUE(pairs.count({baseline, improved})) << improved << " vs " << baseline;
  for (const char* id : {"per_sample", "pinned", "prebatched", "resident", "prefetch"})
    EXPECT_NE(s.find_variant(id, Backend::cuda), nullptr) << id;
  for (const char* id : {"per_sample", "prebatched", "gather"}) EXPECT_NE(s.find_variant(id, Backend::cpu), nullptr) << id;
#ifndef TRAINBENCH_HAVE_CUDA
  for (const auto& v : s.variants) {
    if (v.backend == Backend::cuda) {
      EXPECT_FALSE(v.make) << v.id;  // listed, unavailable
    }
  }
#endif
}

// Shuffled, the slab is rebuilt every epoch: its build per batch is the cost the pairs add back.
// Sequential, it is built once like the dataset, and costs nothing per batch.
TEST(CollateStage, PrebatchedReportsTheSlabBuild) {
  const Variant& v = *collate_stage().find_variant("prebatched", Backend::cpu);
  auto instance = v.make(problem_for(v, Case{"text_pair", "shuffled", 100, 10, 16, 4, 1}, "0"), RunContext{});
  instance->run();
  ASSERT_TRUE(instance->check().passed);
  const auto seen = instance->observed();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, "slab_build_ms");
  EXPECT_GE(seen[0].second, 0.0);
  EXPECT_EQ(seen[1].first, "slab_build_ms_per_batch");
  EXPECT_DOUBLE_EQ(seen[1].second, seen[0].second / 10);  // 10 batches per epoch

  collate::Shape sequential = small_shape(collate::Order::sequential);
  const auto once = collate::slab_counters(sequential, 0.004);
  ASSERT_EQ(once.size(), 2u);
  EXPECT_EQ(once[0], (std::pair<std::string, double>{"slab_build_once_ms", 4.0}));
  EXPECT_EQ(once[1], (std::pair<std::string, double>{"slab_build_ms_per_batch", 0.0}));
}

// Every pair of a pre-batched variant adds the slab build back per batch, from a counter that
// variant really reports (a name that matched nothing would leave the pair without a ratio).
TEST(CollateStage, PrebatchedPairsAddTheSlabBuildBack) {
  const Stage& s = collate_stage();
  int pairs = 0;
  for (const auto& pair : s.pairs) {
    if (pair.improved.find("prebatched") == std::string::npos) {
      EXPECT_FALSE(pair.moved_out.declared()) << pair.label;
      continue;
    }
    ++pairs;
    ASSERT_TRUE(pair.moved_out.declared()) << pair.label;
    EXPECT_EQ(pair.moved_out.ms_per_call, "slab_build_ms_per_batch");
    EXPECT_EQ(pair.moved_out.ms_each, "slab_build_ms");
    EXPECT_EQ(pair.moved_out.paid_per, "epoch");
    for (Backend backend : {Backend::cpu, Backend::cuda}) {
      const Variant* v = s.find_variant(pair.improved, backend);
      if (!v || !testing::cannot_run_here(*v).empty()) continue;
      auto session = make_session(backend, 0);
      auto instance = v->make(problem_for(*v, Case{"text_pair", "shuffled", 100, 10, 16, 4, 1}, "0"), session->context());
      instance->run();
      std::set<std::string> reported;
      for (const auto& [key, value] : instance->observed()) reported.insert(key);
      EXPECT_TRUE(reported.count(pair.moved_out.ms_per_call)) << to_string(backend) << "/" << v->id;
      EXPECT_TRUE(reported.count(pair.moved_out.ms_each)) << to_string(backend) << "/" << v->id;
    }
  }
  EXPECT_EQ(pairs, 2);  // per_sample -> prebatched (both backends), pinned -> prebatched_pinned
}

}  // namespace
}  // namespace tb
