#include <gtest/gtest.h>

#include <set>

#include "runtime/error.h"
#include "runtime/registry.h"

namespace tb {
namespace {

Variant fake_variant(const std::string& id, Backend backend, std::vector<std::string> axes = {}) {
  Variant v;
  v.id = id;
  v.backend = backend;
  v.rationale = "test";
  v.axes = std::move(axes);
  v.work = [](const Problem&) { return Work{}; };
  return v;
}

TEST(Problem, ParsesNumbersAsWrittenInReports) {
  Problem p({{"params", "29.9e6"}, {"n", "4096"}, {"alpha", "0.5"}, {"bad", "12x"}});
  EXPECT_EQ(p.get_int("params"), 29900000);
  EXPECT_EQ(p.get_int("n"), 4096);
  EXPECT_DOUBLE_EQ(p.get_double("alpha"), 0.5);
  EXPECT_THROW(p.get_int("alpha"), UsageError);
  EXPECT_THROW(p.get_int("bad"), UsageError);
  EXPECT_THROW(p.get("missing"), std::out_of_range);
  EXPECT_EQ(p.label(), "params=29.9e6,n=4096,alpha=0.5,bad=12x");
}

TEST(Axis, RejectsValuesThatCannotRun) {
  Axis sizes{"n", AxisKind::positive_int, {"8"}, {}, "", {}};
  EXPECT_EQ(sizes.invalid_reason("1000003"), "");
  EXPECT_EQ(sizes.invalid_reason("1e6"), "");
  EXPECT_NE(sizes.invalid_reason("0"), "");
  EXPECT_NE(sizes.invalid_reason("-5"), "");
  EXPECT_NE(sizes.invalid_reason("2.5"), "");
  EXPECT_NE(sizes.invalid_reason("abc"), "");
  EXPECT_NE(sizes.invalid_reason(""), "");
  Axis dtype{"dtype", AxisKind::choice, {"fp32"}, {}, "", {"fp32", "bf16"}};
  EXPECT_EQ(dtype.invalid_reason("bf16"), "");
  EXPECT_NE(dtype.invalid_reason("fp16"), "");
  Axis shape{"shape", AxisKind::text, {"2x3"}, {}, "", {}, [](const std::string& v) {
               return v.find('x') == std::string::npos ? std::string("expected AxB") : std::string();
             }};
  EXPECT_EQ(shape.invalid_reason("2x3"), "");
  EXPECT_EQ(shape.invalid_reason("23"), "expected AxB");
}

TEST(Registry, RejectsInconsistentDeclarations) {
  Registry r;
  Stage s;
  s.name = "toy";
  s.axes = {Axis{"n", AxisKind::positive_int, {"4"}, {}, "", {}}};
  s.variants = {fake_variant("a", Backend::cpu, {"n"}), fake_variant("a", Backend::cpu)};
  EXPECT_THROW(r.add(s), std::logic_error);  // duplicate variant
  s.variants = {fake_variant("a", Backend::cpu, {"m"})};
  EXPECT_THROW(r.add(s), std::logic_error);  // unknown axis
  s.variants = {fake_variant("a", Backend::cpu), fake_variant("b", Backend::cuda)};
  s.pairs = {Pair{"a", "b", "a vs b"}};
  EXPECT_THROW(r.add(s), std::logic_error);  // a pair across backends
  s.pairs = {};
  s.axes[0].values = {"0"};
  EXPECT_THROW(r.add(s), std::logic_error);  // a default that cannot run
  s.axes[0].values = {"4"};
  r.add(s);
  EXPECT_THROW(r.add(s), std::logic_error);  // duplicate stage
}

TEST(Registry, ExpandsAxesWithQuickValuesAndOverrides) {
  Registry r;
  Stage s;
  s.name = "toy";
  s.axes = {Axis{"n", AxisKind::positive_int, {"100", "200"}, {"10"}, "", {}},
            Axis{"dtype", AxisKind::choice, {"fp32", "bf16"}, {}, "", {"fp32", "bf16"}}};
  s.variants = {fake_variant("a", Backend::cpu, {"n", "dtype"}), fake_variant("b", Backend::cpu)};
  r.add(s);
  const Stage& toy = *r.find("toy");
  EXPECT_EQ(expand_problems(toy, toy.variants[0], {}, false).size(), 4u);
  const auto quick = expand_problems(toy, toy.variants[0], {}, true);
  ASSERT_EQ(quick.size(), 2u);
  EXPECT_EQ(quick[0].label(), "n=10,dtype=fp32");
  const auto o = parse_axis_override(r, "toy.n=7,1000003");
  const auto over = expand_problems(toy, toy.variants[0], {o}, true);
  ASSERT_EQ(over.size(), 4u);
  EXPECT_EQ(benchmark_name(toy, toy.variants[0], over[3]), "toy/cpu/a/n=1000003,dtype=bf16");
  // A variant without axes runs once, and its name has no problem part.
  const auto none = expand_problems(toy, toy.variants[1], {o}, false);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(benchmark_name(toy, toy.variants[1], none[0]), "toy/cpu/b");
}

TEST(Registry, AxisOverrideErrorsSayWhatExists) {
  Registry r;
  Stage s;
  s.name = "toy";
  s.axes = {Axis{"n", AxisKind::positive_int, {"100"}, {}, "", {}}};
  s.variants = {fake_variant("a", Backend::cpu, {"n"})};
  r.add(s);
  auto message = [&](const std::string& text) {
    try {
      parse_axis_override(r, text);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("toy.n").find("expected STAGE.AXIS="), std::string::npos);
  EXPECT_NE(message("nope.n=1").find("stages: toy"), std::string::npos);
  EXPECT_NE(message("toy.m=1").find("axes: n"), std::string::npos);
  EXPECT_NE(message("toy.n=-5").find("must be at least 1"), std::string::npos);
  EXPECT_NE(message("toy.n=1,,2").find("is not a number"), std::string::npos);
}

TEST(BuiltinRegistry, EveryStageIsWellFormed) {
  const Registry& r = builtin_registry();
  ASSERT_NE(r.find("peak"), nullptr);
  std::set<std::string> names;
  for (const auto& stage : r.stages()) {
    EXPECT_FALSE(stage.question.empty()) << stage.name;
    EXPECT_FALSE(stage.source.empty()) << stage.name;
    for (const auto& v : stage.variants) {
      EXPECT_FALSE(v.rationale.empty()) << stage.name << "/" << v.id;
      for (const auto& p : expand_problems(stage, v, {}, false)) {
        EXPECT_TRUE(names.insert(benchmark_name(stage, v, p)).second) << benchmark_name(stage, v, p);
        const Work w = v.work(p);
        // A timed region that moves nothing (a view into a slab built outside it) is a model too, but
        // only with the cost it moved out named by every pair that divides by its time.
        if (w.moves_nothing()) {
          for (const auto& pair : stage.pairs) {
            if (pair.improved != v.id) continue;
            EXPECT_TRUE(pair.moved_out.declared()) << benchmark_name(stage, v, p) << " moves nothing, and pair '"
                                                   << pair.label << "' names no cost moved out of it";
          }
          continue;
        }
        EXPECT_TRUE(w.bytes > 0 || w.flops > 0) << benchmark_name(stage, v, p) << " has no work model";
      }
    }
  }
}

TEST(BuiltinRegistry, PeakDeclaresEveryCeilingOfTheDesign) {
  const Stage& peak = *builtin_registry().find("peak");
  std::set<std::string> provided;
  for (const auto& v : peak.variants)
    if (!v.provides_peak.empty()) provided.insert(v.provides_peak);
  for (const char* key :
       {"cpu.copy", "cpu.triad", "cpu.memory", "cpu.gemm_fp32", "cuda.copy", "cuda.triad", "cuda.h2d_pinned", "cuda.h2d_pageable",
        "cuda.d2h_pinned", "cuda.d2h_pageable", "cuda.gemm_fp32", "cuda.gemm_tf32", "cuda.gemm_bf16"})
    EXPECT_TRUE(provided.count(key)) << key;
#ifdef TRAINBENCH_HAVE_CUDA
  for (const auto& v : peak.variants) EXPECT_TRUE(v.make) << v.id << " should be built with CUDA";
#else
  for (const auto& v : peak.variants) {
    if (v.backend == Backend::cuda) {
      EXPECT_FALSE(v.make) << v.id;
    }
  }
#endif
}

}  // namespace
}  // namespace tb
