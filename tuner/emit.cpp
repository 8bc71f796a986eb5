#include "tuner/emit.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "runtime/error.h"
#include "trainbench/build_info.h"
#include "tuner/trial.h"

namespace tb::tune {

using json = nlohmann::ordered_json;

OutFormat out_format_from_string(const std::string& name) {
  if (name == "yaml") return OutFormat::yaml;
  if (name == "json") return OutFormat::json;
  if (name == "deepspeed") return OutFormat::deepspeed;
  if (name == "lightning") return OutFormat::lightning;
  if (name == "hf") return OutFormat::hf;
  if (name == "accelerate") return OutFormat::accelerate;
  throw UsageError("unknown format '" + name + "' (yaml, json, deepspeed, lightning, hf, accelerate)");
}

// "1.031x (95% CI 0.972-1.093 over 6 interleaved rounds)"; without an interval, "1.031x from 1
// interleaved round".
static std::string ratio_text(double ratio, double ci_low, double ci_high, double level, int rounds) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << ratio << "x";
  const std::string round_words = std::to_string(rounds) + " interleaved round" + (rounds == 1 ? "" : "s");
  if (rounds >= 2)
    out << " (" << std::lround(100 * level) << "% CI " << ci_low << "-" << ci_high << " over " << round_words << ")";
  else out << " from " << round_words;
  return out.str();
}

static std::string percent(double fraction) {
  std::ostringstream out;
  out << std::setprecision(3) << 100 * fraction << "%";
  return out.str();
}

Speedup speedup_from_rounds(const PairedRounds& p, double noise_margin, const std::string& against) {
  Speedup s;
  s.ratio = p.ratio;
  s.level = p.level;
  s.rounds = p.rounds;
  if (p.rounds >= 2) {
    s.ci_low = p.ci_low;
    s.ci_high = p.ci_high;
  }
  s.significant = p.faster_beyond(noise_margin);
  const std::string measured = ratio_text(p.ratio, p.ci_low, p.ci_high, p.level, p.rounds);
  if (s.significant) s.note = "the choice runs at " + measured + " " + against + "'s throughput, measured interleaved";
  else if (p.slower_beyond(noise_margin))
    s.note = "the choice is slower than " + against + " beyond noise: " + measured +
             "; it won the tie-break on peak memory among the finalists within noise of the fastest, or " + against +
             " runs without the memory headroom";
  else if (!p.decides())
    s.note = "too few interleaved rounds to judge the choice against " + against + ": " + measured +
             "; no speedup is claimed";
  else
    s.note = "the choice is within noise of " + against + ": " + measured + " does not exclude 1 by the " +
             percent(noise_margin) + " noise margin; keeping " + against + " loses nothing measurable";
  return s;
}

Speedup speedup_from_separate_trials(double ratio, const std::string& why) {
  Speedup s;
  s.ratio = ratio;
  std::ostringstream note;
  note << std::fixed << std::setprecision(3) << "not measured interleaved (" << why << "): " << ratio
       << "x from trials run apart, which compare the machine's drift as much as the configurations; no speedup is claimed";
  s.note = note.str();
  return s;
}

Speedup speedup_of_own_choice(const std::string& against) {
  Speedup s;
  s.note = "the choice is " + against;
  return s;
}

static json measured(const TrialResult& r) {
  // After a race: the median of the interleaved rounds with its distribution-free interval.
  return json{{"samples_per_s", r.samples_per_s},
              {"ci_low", r.ci_low},
              {"ci_high", r.ci_high},
              {"peak_memory_bytes", r.peak_bytes},
              {"steps", r.steps}};
}

// Each finalist with its per-round throughput, its ratio to the leader and what became of it.
// `own_as`: the key that marks the baseline's finalist (workload_config, or versus).
static json race_json(const RaceReport& race, const std::string& own_key, double noise_margin,
                      const std::string& own_as = "workload_config") {
  json finalists = json::array();
  for (std::size_t i = 0; i < race.finalists.size(); ++i) {
    const Finalist& f = race.finalists[i];
    json j{{"config", f.candidate.key()}};
    if (!f.why.empty()) j["raced_as"] = f.why;  // choice, tie, next fastest, best SWITCH=VALUE, own
    if (f.candidate.key() == own_key) j[own_as] = true;
    if (static_cast<int>(i) == race.choice) j["status"] = "chosen";
    else if (f.dropped_after) j["status"] = "dropped after round " + std::to_string(f.dropped_after);
    else j["status"] = "in";
    if (f.dropped_after) j["why"] = f.why_dropped;
    j["samples_per_s_per_round"] = f.per_round();
    if (f.vs_leader.rounds >= 2)
      j["vs_leader"] = {{"ratio", f.vs_leader.ratio}, {"ci_low", f.vs_leader.ci_low}, {"ci_high", f.vs_leader.ci_high}};
    else if (f.vs_leader.rounds == 1) j["vs_leader"] = {{"ratio", f.vs_leader.ratio}};
    finalists.push_back(j);
  }
  return json{{"rounds", race.rounds},        {"max_rounds", race.max_rounds}, {"ended", race.ended},
              {"noise_margin", noise_margin}, {"seconds", race.seconds},       {"finalists", finalists}};
}

static std::string list_text(const std::vector<int64_t>& values, int64_t scale) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += i + 1 == values.size() ? " and " : ", ";
    out += std::to_string(values[i] * scale);
  }
  return out;
}

std::string searched_batches_text(const GlobalBatchPlan& plan, int64_t ranks) {
  if (plan.pinned) return "searching global batch " + list_text(plan.batches, ranks) + " alone (" + plan.source + ")";
  const std::string what = plan.batches.size() == 1 ? "global batch " : "global batches ";
  return "searching " + what + list_text(plan.batches, ranks) + " (" + plan.source +
         "; --batch N pins one, --batch-range A:B searches others)";
}

static const char* const kConvergenceCaveat =
    "a larger global batch is not free: it takes fewer optimizer steps per epoch and may need another learning rate "
    "or more epochs to reach the same loss, which samples/s does not measure";

std::string global_batch_note(const TuneOutput& o) {
  const GlobalBatchPlan& plan = o.global_batches;
  const int64_t ranks = o.ranks;
  if (!o.report.found || plan.batches.empty()) return "";
  const int64_t chosen = o.report.best.candidate.global_batch;
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (plan.pinned) {
    out << "global batch " << chosen * ranks << " pinned by " << plan.source << ": "
        << (o.pinned_micro_batch > 0 ? "the switches were searched for it at micro-batch " +
                                           std::to_string(o.pinned_micro_batch) + " (--micro-batch)"
                                     : std::string("micro-batch, accumulation and switches were searched for it"));
    return out.str();
  }
  if (plan.batches.size() == 1) {
    out << "global batch " << chosen * ranks << " only (" << plan.source << "): give --batch-range A:B to search others";
    return out.str();
  }
  out << "searched global batches " << list_text(plan.batches, ranks) << " (" << plan.source
      << "); the search's best samples/s:";
  for (const auto& r : per_global_batch(o.report.trials, plan.batches)) {
    out << " " << r.global_batch * ranks << ": ";
    if (r.ok_trials) out << r.best_samples_per_s;
    else out << "none ran";
    out << (r.global_batch == plan.batches.back() ? ";" : ",");
  }
  out << " chose " << chosen * ranks;
  if (chosen == o.workload_global_batch) out << ", the workload's own,";
  out << " because its configuration was the fastest measured"
      << (o.race && o.race->rounds > 0 ? " in the race of the finalists" : " by the search (the race measured no round)")
      << " (ties to the least memory); " << kConvergenceCaveat << ": autotune --batch " << o.workload_global_batch * ranks
      << " keeps the workload's own";
  return out.str();
}

nlohmann::json native_executor_json() { return nlohmann::json{{"name", "native"}, {"step", "trainbench's C++ step"}}; }

static json ordered(const TuneOutput& o);

// A candidate as the output states it: with ranks, the global batch of every rank together, and
// the share each rank runs per step.
static json chosen_json(const Candidate& c, int64_t ranks) {
  json j = to_json(c);
  if (ranks > 1) {
    j["global_batch"] = c.global_batch * ranks;
    j["ranks"] = ranks;
    j["per_rank_batch"] = c.global_batch;
  }
  return j;
}

// ---- The frameworks' settings for the choice: what each holds of it, and a line for what it cannot hold ----

// One framework's settings, and a line per part of the choice they cannot hold, saying where it goes instead.
struct FrameworkSettings {
  json doc;
  std::vector<std::string> not_held;
};

static std::string switch_of(const Candidate& c, const std::string& name, const std::string& otherwise = "") {
  const auto it = c.switches.find(name);
  return it == c.switches.end() ? otherwise : it->second;
}

static std::string python_bool(bool b);

// The loader's settings of a choice with data switches ({num_workers, prefetch_factor, persistent_workers,
// pin_memory, cpu_threads}): the worker's own words for them where the time split asked (o.dataloader, the model's
// threads resolved), else from the switches; null for a choice without them.
static json dataloader_of(const TuneOutput& o, const Candidate& c) {
  if (!o.dataloader.is_null()) return json::parse(o.dataloader.dump());
  if (switch_of(c, "num_workers").empty()) return nullptr;
  const int64_t workers = std::stoll(switch_of(c, "num_workers"));
  json d{{"num_workers", workers}};
  d["prefetch_factor"] = workers ? json(std::stoll(switch_of(c, "prefetch_factor", "2"))) : json(nullptr);
  d["persistent_workers"] = workers && switch_of(c, "persistent_workers") == "on";
  if (!switch_of(c, "pin_memory").empty()) d["pin_memory"] = switch_of(c, "pin_memory") == "on";
  if (!switch_of(c, "cpu_threads").empty()) d["cpu_threads"] = switch_of(c, "cpu_threads");
  return d;
}

// The DataLoader's arguments of a choice with data switches, as a script passes them: "" without them.
static std::string dataloader_arguments(const json& d) {
  if (d.is_null()) return "";
  std::string out = "DataLoader(..., num_workers=" + std::to_string(d.value("num_workers", 0));
  if (d.value("num_workers", 0) > 0)
    out += ", prefetch_factor=" + std::to_string(d.value("prefetch_factor", 2)) +
           ", persistent_workers=" + python_bool(d.value("persistent_workers", false));
  if (d.contains("pin_memory")) out += ", pin_memory=" + python_bool(d.value("pin_memory", false));
  return out + ")";
}

// The model's intra-op threads the choice ran with beside its loader's workers, where they are a number ("" else).
static std::string cpu_threads_note(const json& d) {
  if (d.is_null() || !d.contains("cpu_threads") || !d["cpu_threads"].is_number_integer() ||
      d.value("num_workers", 0) == 0)
    return "";
  return "cpu_threads=" + std::to_string(d["cpu_threads"].get<int64_t>()) + ": torch.set_num_threads(" +
         std::to_string(d["cpu_threads"].get<int64_t>()) + ") in the training process (its loader's " +
         std::to_string(d.value("num_workers", 0)) + " worker processes have the other cores)";
}

// The data parallelism on ranks: "" in one process, else ddp, fsdp or fsdp_no_reshard (a candidate without the
// switch is DDP).
static std::string parallel_of(const TuneOutput& o, const Candidate& c) {
  return o.ranks > 1 ? switch_of(c, "parallel", "ddp") : "";
}
static bool sharded(const std::string& parallel) { return parallel.rfind("fsdp", 0) == 0; }

static int64_t bucket_cap_mb(const Candidate& c) {
  const std::string mb = switch_of(c, "bucket_mb", "25");
  if (mb.empty() || mb.size() > 9 || mb.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError("bucket_mb=" + mb + ": expected DDP's bucket size in whole MB");
  return std::stoll(mb);
}

static std::string python_bool(bool b) { return b ? "True" : "False"; }

// Switches of trainbench's loop that no framework's configuration holds: where each goes in a training script.
static void add_loop_notes(const Candidate& c, std::vector<std::string>& notes) {
  const std::string sync = switch_of(c, "sync"), sdpa = switch_of(c, "sdpa");
  if (sync == "async")
    notes.push_back("sync=async: read the loss on the host (loss.item()) one step late, not every step");
  else if (sync.rfind("every_n:", 0) == 0)
    notes.push_back("sync=" + sync + ": read the loss on the host (loss.item()) every " + sync.substr(8) +
                    " steps, not every step");
  if (switch_of(c, "cuda_graphs") == "on")
    notes.push_back("cuda_graphs=on: capture the step in a CUDA graph "
                    "(torch.compile(model, mode=\"reduce-overhead\"))");
  static const std::map<std::string, std::string> backends{
      {"math", "MATH"}, {"flash", "FLASH_ATTENTION"}, {"efficient", "EFFICIENT_ATTENTION"}};
  if (backends.count(sdpa))
    notes.push_back("sdpa=" + sdpa + ": run the step under torch.nn.attention.sdpa_kernel(SDPBackend." +
                    backends.at(sdpa) + ")");
}

// Switches that a script sets, for the frameworks whose configuration has no key for them (Lightning, Accelerate);
// `held`: those the configuration does hold (compile, activation_checkpointing).
static void add_script_notes(const TuneOutput& o, const Candidate& c, const std::set<std::string>& held,
                             std::vector<std::string>& notes) {
  static const std::map<std::string, std::string> optimizers{
      {"per_tensor", "foreach=False"}, {"foreach", "foreach=True"}, {"fused", "fused=True"}};
  const std::string optimizer = switch_of(c, "optimizer");
  if (optimizers.count(optimizer))
    notes.push_back("optimizer=" + optimizer + ": build the optimizer with " + optimizers.at(optimizer) +
                    " (e.g. torch.optim.AdamW(params, ..., " + optimizers.at(optimizer) + "))");
  if (!held.count("compile") && switch_of(c, "compile") == "on")
    notes.push_back("compile=on: torch.compile(model) before training (the configuration has no key for it)");
  if (!held.count("activation_checkpointing") && switch_of(c, "activation_checkpointing") == "on")
    notes.push_back("activation_checkpointing=on: checkpoint the model's blocks (torch.utils.checkpoint.checkpoint, or "
                    "model.gradient_checkpointing_enable() for a transformers model)");
  const json loader = dataloader_of(o, c);
  if (!loader.is_null()) {
    notes.push_back("the loader: " + dataloader_arguments(loader) +
                    " where the training DataLoader is built (a LightningDataModule's or LightningModule's "
                    "train_dataloader(), or the script's): the DataLoader's arguments are not Trainer settings");
    if (!cpu_threads_note(loader).empty()) notes.push_back(cpu_threads_note(loader));
  } else if (switch_of(c, "pin_memory") == "on") {
    notes.push_back("pin_memory=on: DataLoader(..., pin_memory=True)");
  }
  add_loop_notes(c, notes);
}

// Hugging Face TrainingArguments on ranks: DDP's arguments, or FSDP2 through fsdp_config.
static void add_hf_ranks(const Candidate& c, const std::string& parallel, FrameworkSettings& s) {
  json& hf = s.doc;
  if (sharded(parallel)) {
    json config{
        {"version", 2}, {"reshard_after_forward", parallel == "fsdp"}, {"auto_wrap_policy", "TRANSFORMER_BASED_WRAP"}};
    // Activation checkpointing as FSDP's own, not the Trainer's (which would all-gather once more in the backward).
    const std::string checkpointing = switch_of(c, "activation_checkpointing");
    if (!checkpointing.empty()) config["activation_checkpointing"] = checkpointing == "on";
    hf["fsdp"] = true;
    hf["fsdp_config"] = config;
    s.not_held.push_back("parallel=" + parallel +
                         ": TRANSFORMER_BASED_WRAP shards one by one the blocks a transformers model names in "
                         "_no_split_modules, as the tune sharded the repeated blocks; for another model name the "
                         "block's class in fsdp_config's transformer_layer_cls_to_wrap");
  } else {
    // DDP's default, as measured: the Trainer would search for unused parameters in a model that is not a
    // PreTrainedModel.
    hf["ddp_find_unused_parameters"] = false;
    hf["ddp_bucket_cap_mb"] = bucket_cap_mb(c);
    hf["ddp_static_graph"] = switch_of(c, "static_graph") == "on";
    if (switch_of(c, "gradient_as_bucket_view") == "on")
      s.not_held.push_back("gradient_as_bucket_view=on: not a TrainingArguments field (the Trainer's "
                           "DistributedDataParallel keeps the gradients apart from its buckets)");
  }
  // The Trainer skips the all-reduce of the micro-batches before the last (no_sync=on) unless told to sync each.
  if (c.accumulation() > 1 && switch_of(c, "no_sync") == "off")
    hf["accelerator_config"] = {{"gradient_accumulation_kwargs", {{"sync_each_batch", true}}}};
}

// Keyword arguments of transformers.TrainingArguments, loadable as `TrainingArguments(output_dir=..., **json)`.
static FrameworkSettings hf_settings(const TuneOutput& o, const Candidate& c) {
  FrameworkSettings s;
  json& hf = s.doc;
  hf = {{"per_device_train_batch_size", c.micro_batch}, {"gradient_accumulation_steps", c.accumulation()}};
  const std::string parallel = parallel_of(o, c);
  const std::string checkpointing = switch_of(c, "activation_checkpointing");
  if (!checkpointing.empty() && !sharded(parallel)) hf["gradient_checkpointing"] = checkpointing == "on";
  const std::string bf16 = switch_of(c, "bf16_matmuls");
  if (!bf16.empty()) hf["bf16"] = bf16 == "on";
  // TrainingArguments has no for-loop AdamW: per_tensor and foreach both map to adamw_torch, which
  // leaves the choice to torch.optim.AdamW (foreach on CUDA, the for-loop on the CPU).
  const std::string optimizer = switch_of(c, "optimizer");
  if (!optimizer.empty()) hf["optim"] = optimizer == "fused" ? "adamw_torch_fused" : "adamw_torch";
  const std::string compile = switch_of(c, "compile");  // autotune --entry's torch.compile
  if (!compile.empty()) hf["torch_compile"] = compile == "on";
  const std::string pin_memory = switch_of(c, "pin_memory");
  if (!pin_memory.empty()) hf["dataloader_pin_memory"] = pin_memory == "on";
  const json loader = dataloader_of(o, c);
  if (!loader.is_null()) {  // TrainingArguments refuses a prefetch factor without workers
    hf["dataloader_num_workers"] = loader.value("num_workers", 0);
    if (loader.value("num_workers", 0) > 0) hf["dataloader_prefetch_factor"] = loader["prefetch_factor"];
    hf["dataloader_persistent_workers"] = loader.value("persistent_workers", false);
    if (loader.contains("pin_memory")) hf["dataloader_pin_memory"] = loader.value("pin_memory", false);
    if (!cpu_threads_note(loader).empty()) s.not_held.push_back(cpu_threads_note(loader));
  }
  // Always written: TrainingArguments clips at 1.0 unless told otherwise, and 0 turns clipping off.
  hf["max_grad_norm"] = o.grad_clip;
  if (o.ranks > 1) add_hf_ranks(c, parallel, s);
  add_loop_notes(c, s.not_held);
  return s;
}

// Lightning's strategy on ranks, as LightningCLI reads it (class_path and init_args).
static json lightning_strategy(const Candidate& c, const std::string& parallel, int64_t ranks, FrameworkSettings& s) {
  if (sharded(parallel)) {
    // Lightning's FSDPStrategy wraps in FSDP1; ModelParallelStrategy is its FSDP2 (fully_shard), applied by the module.
    s.not_held.push_back("parallel=" + parallel +
                         ": ModelParallelStrategy leaves the sharding to your LightningModule's configure_model(): "
                         "fully_shard(block, mesh=self.device_mesh[\"data_parallel\"], reshard_after_forward=" +
                         python_bool(parallel == "fsdp") + ") on each repeated block, then on the module itself");
    return {{"class_path", "lightning.pytorch.strategies.ModelParallelStrategy"},
            {"init_args", {{"data_parallel_size", ranks}, {"tensor_parallel_size", 1}}}};
  }
  return {{"class_path", "lightning.pytorch.strategies.DDPStrategy"},
          {"init_args",
           {{"bucket_cap_mb", bucket_cap_mb(c)},
            {"gradient_as_bucket_view", switch_of(c, "gradient_as_bucket_view") == "on"},
            {"static_graph", switch_of(c, "static_graph") == "on"}}}};
}

// A LightningCLI-style configuration: trainer and data sections.
static FrameworkSettings lightning_settings(const TuneOutput& o, const Candidate& c) {
  FrameworkSettings s;
  json& pl = s.doc;
  pl = {{"trainer", {{"accumulate_grad_batches", c.accumulation()}}}, {"data", {{"batch_size", c.micro_batch}}}};
  const std::string parallel = parallel_of(o, c);
  if (o.ranks > 1) {
    // The backend the ranks were measured on: without it, "auto" would take GPUs where a CPU tune's ranks ran.
    pl["trainer"]["accelerator"] = o.device.value("backend", std::string()) == "cuda" ? "gpu" : "cpu";
    pl["trainer"]["devices"] = o.ranks;  // one node's worth; num_nodes x devices = ranks across nodes
    pl["trainer"]["strategy"] = lightning_strategy(c, parallel, o.ranks, s);
    // Lightning skips the all-reduce of the micro-batches before the last whatever it is told (no_sync=on).
    if (c.accumulation() > 1 && switch_of(c, "no_sync") == "off")
      s.not_held.push_back("no_sync=off: Lightning skips the all-reduce of the micro-batches before the last "
                           "whatever it is told; the choice all-reduces every micro-batch");
  }
  if (o.grad_clip > 0) pl["trainer"]["gradient_clip_val"] = o.grad_clip;
  if (switch_of(c, "bf16_matmuls") == "on") pl["trainer"]["precision"] = "bf16-mixed";
  add_script_notes(o, c, {}, s.not_held);
  return s;
}

// What an Accelerate script sets itself for the choice on ranks: the accumulation and DDP's arguments.
static void add_accelerate_script_notes(const TuneOutput& o, const Candidate& c, const std::string& parallel,
                                        std::vector<std::string>& notes) {
  const std::string a = std::to_string(c.accumulation());
  notes.push_back("micro-batch " + std::to_string(c.micro_batch) + " per process: the DataLoader's batch_size");
  if (c.accumulation() > 1) {
    const bool sync_each = o.ranks > 1 && switch_of(c, "no_sync") == "off";
    notes.push_back("accumulation " + a + ": " +
                    (sync_each ? "Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=" + a +
                                     ", sync_each_batch=True)), which all-reduces every micro-batch (no_sync=off)"
                               : "Accelerator(gradient_accumulation_steps=" + a + ")") +
                    ", each micro-batch under `with accelerator.accumulate(model):`" +
                    (sync_each || o.ranks == 1
                         ? ""
                         : " (skips the all-reduce of the micro-batches before the last: no_sync=on)"));
  }
  if (o.ranks > 1 && !sharded(parallel)) {
    std::ostringstream ddp;
    ddp << "DDP: Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=" << bucket_cap_mb(c)
        << ", gradient_as_bucket_view=" << python_bool(switch_of(c, "gradient_as_bucket_view") == "on")
        << ", static_graph=" << python_bool(switch_of(c, "static_graph") == "on") << ")])";
    notes.push_back(ddp.str());
  }
  if (o.grad_clip > 0) {
    std::ostringstream clip;
    clip << "gradient clipping at " << o.grad_clip << ": accelerator.clip_grad_norm_(model.parameters(), "
         << o.grad_clip << ") before optimizer.step()";
    notes.push_back(clip.str());
  }
}

// How Accelerate (1.15) runs CPU ranks: MULTI_CPU's processes start under mpirun given a hostfile, else one process
// starts; FSDP runs on accelerators only (its CPU processes get DistributedDataParallel instead).
static void add_accelerate_cpu_notes(int64_t ranks, const std::string& parallel, std::vector<std::string>& notes) {
  const std::string n = std::to_string(ranks);
  if (sharded(parallel))
    notes.push_back("parallel=" + parallel + " on the CPU: Accelerate runs FSDP on GPUs only (CPU processes get "
                    "DistributedDataParallel); on the CPU shard in the script with torch.distributed.fsdp.fully_shard, "
                    "under torchrun --standalone --nproc-per-node " + n + " YOUR_TRAINING_SCRIPT.py");
  else
    notes.push_back("CPU ranks: accelerate launch starts the " + n +
                    " processes under mpirun given a hostfile (mpirun_config: {mpirun_hostfile: FILE}, a line "
                    "`localhost slots=" + n + "`), else one; or start them as the tune did, torchrun --standalone "
                    "--nproc-per-node " + n + " YOUR_TRAINING_SCRIPT.py, with Accelerator(cpu=True)");
}

// An Accelerate config file (accelerate 1.15's ClusterConfig keys), for `accelerate launch --config_file F train.py`.
static FrameworkSettings accelerate_settings(const TuneOutput& o, const Candidate& c) {
  FrameworkSettings s;
  json& a = s.doc;
  const bool cuda = o.device.value("backend", std::string()) == "cuda";
  const std::string parallel = parallel_of(o, c);
  a = {{"compute_environment", "LOCAL_MACHINE"},
       {"distributed_type", o.ranks == 1 ? "NO" : sharded(parallel) ? "FSDP" : cuda ? "MULTI_GPU" : "MULTI_CPU"},
       {"num_processes", o.ranks},
       {"num_machines", 1},
       {"machine_rank", 0},
       {"use_cpu", !cuda},
       {"mixed_precision", switch_of(c, "bf16_matmuls") == "on" ? "bf16" : "no"}};
  if (cuda && o.ranks > 1) a["gpu_ids"] = "all";
  if (switch_of(c, "compile") == "on") a["dynamo_config"] = {{"dynamo_backend", "INDUCTOR"}};
  if (sharded(parallel)) {
    json fsdp{{"fsdp_version", 2},
              {"fsdp_reshard_after_forward", parallel == "fsdp"},
              {"fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"}};
    const std::string checkpointing = switch_of(c, "activation_checkpointing");
    if (!checkpointing.empty()) fsdp["fsdp_activation_checkpointing"] = checkpointing == "on";
    a["fsdp_config"] = fsdp;
    s.not_held.push_back("parallel=" + parallel +
                         ": TRANSFORMER_BASED_WRAP shards one by one the blocks a transformers model names in "
                         "_no_split_modules; for another model add fsdp_transformer_layer_cls_to_wrap: BLOCK_CLASS");
  }
  if (!cuda && o.ranks > 1) add_accelerate_cpu_notes(o.ranks, parallel, s.not_held);
  add_accelerate_script_notes(o, c, parallel, s.not_held);
  std::set<std::string> held{"compile"};  // dynamo_config
  if (sharded(parallel)) held.insert("activation_checkpointing");  // fsdp_activation_checkpointing
  add_script_notes(o, c, held, s.not_held);
  return s;
}

// For an entry on ranks: the command line that starts them as the tune did (executor.launcher) and the batch's split.
static void add_launch(json& chosen, const TuneOutput& o, const Candidate& c) {
  if (o.ranks > 1)
    chosen["batch_split"] = "global batch " + std::to_string(c.global_batch * o.ranks) + " = micro-batch " +
                            std::to_string(c.micro_batch) + " x accumulation " + std::to_string(c.accumulation()) +
                            " x " + std::to_string(o.ranks) + " ranks";
  const auto launcher = o.executor.find("launcher");
  if (o.ranks > 1 && launcher != o.executor.end() && launcher->is_string() && !launcher->get<std::string>().empty())
    chosen["launch"] = launcher->get<std::string>() + " YOUR_TRAINING_SCRIPT.py";
  if (o.executor.value("name", std::string()) != "torch-entry") return;
  json notes = json::object();  // what each framework's format cannot hold of the choice
  notes["hf"] = hf_settings(o, c).not_held;
  notes["lightning"] = lightning_settings(o, c).not_held;
  notes["accelerate"] = accelerate_settings(o, c).not_held;
  chosen["format_notes"] = notes;
}

nlohmann::json to_json(const TuneOutput& o) { return nlohmann::json::parse(ordered(o).dump()); }

// The choice with its measured numbers, or the note that nothing ran.
static void add_choice(json& t, const TuneOutput& o) {
  const SearchReport& rep = o.report;
  if (rep.found) {
    t["chosen"] = chosen_json(rep.best.candidate, o.ranks);
    add_launch(t["chosen"], o, rep.best.candidate);
    t["measured"] = measured(rep.best.result);
    if (!o.prediction.is_null())
      t["measured"]["of"] = std::string("one rank's share of the batch (global_batch / ranks samples per step), ") +
                            (o.prediction.contains("compute_measured_in") ? "in one process" : "ranks run independently");
    t["measured"]["headroom"] = rep.headroom;
    t["measured"]["confirmed"] = o.confirmed;
    t["measured"]["interleaved_rounds"] = o.confirmed && o.race ? o.race->rounds : 0;
    if (!o.communication.is_null()) t["measured"]["communication"] = json::parse(o.communication.dump());
    const json loader = dataloader_of(o, rep.best.candidate);
    if (!loader.is_null()) t["chosen"]["dataloader"] = loader;
    if (!o.time_split.is_null()) t["time_split"] = json::parse(o.time_split.dump());
    if (!o.choice_note.empty()) t["choice_note"] = o.choice_note;
  } else {
    t["chosen"] = nullptr;
    t["note"] = "no configuration ran successfully; see failed_trials";
  }
}

// The choice's speedup: inside the `versus` object (speedup, note), or beside the workload's own configuration
// as the document's speedup_* keys.
static void add_speedup(json& into, bool versus, const Speedup& speedup) {
  const std::string prefix = versus ? "" : "speedup_";
  into[versus ? "speedup" : "speedup_over_workload_config"] = speedup.ratio;
  into["speedup_significant"] = speedup.significant;
  if (speedup.rounds >= 2)
    into["speedup_interval"] = {{"ci_low", speedup.ci_low},
                                {"ci_high", speedup.ci_high},
                                {"level", speedup.level},
                                {"interleaved_rounds", speedup.rounds}};
  into[prefix + "note"] = speedup.note;
}

// The baseline (the workload's own configuration, or --versus's) as measured, and the choice's speedup over it:
// from the race's rounds, else from the two trials measured apart.
static void add_baseline(json& t, const TuneOutput& o) {
  const SearchReport& rep = o.report;
  const bool versus = !o.versus.is_null();
  json& base = versus ? (t["versus"] = o.versus) : (t["workload_config"] = json::object());
  base["config"] = chosen_json(o.baseline->candidate, o.ranks);
  base["measured"] = o.baseline->result.ok() ? measured(o.baseline->result) : json(nullptr);
  if (!o.baseline->result.ok())
    base["failed"] = {{"class", to_string(o.baseline->result.cls)}, {"message", o.baseline->result.message}};
  std::optional<Speedup> speedup = o.speedup;
  if (!speedup && rep.found && o.baseline->result.ok() && o.baseline->result.samples_per_s > 0)
    speedup = speedup_from_separate_trials(rep.best.result.samples_per_s / o.baseline->result.samples_per_s,
                                           "no race was run");
  if (rep.found && speedup) add_speedup(versus ? base : t, versus, *speedup);
}

// The global batches searched (every rank's together), the best samples/s the search measured at each, and why
// the choice has the one it has.
static json global_batches_json(const TuneOutput& o) {
  const SearchReport& rep = o.report;
  json per = json::array();
  for (const auto& r : per_global_batch(rep.trials, o.global_batches.batches)) {
    json j{{"global_batch", r.global_batch * o.ranks}, {"ok_trials", r.ok_trials}};
    j["best_samples_per_s"] = r.ok_trials ? json(r.best_samples_per_s) : json(nullptr);
    per.push_back(j);
  }
  std::vector<int64_t> searched;
  for (int64_t g : o.global_batches.batches) searched.push_back(g * o.ranks);
  return json{{"searched", searched},
              {"source", o.global_batches.source},
              {"workload_global_batch", o.workload_global_batch * o.ranks},
              {"chosen", rep.found ? json(rep.best.candidate.global_batch * o.ranks) : json(nullptr)},
              {"per_global_batch", per},
              {"note", global_batch_note(o)}};
}

// How the search went: its strategy, its trials, its time against the budget.
static json search_json(const TuneOutput& o) {
  const SearchReport& rep = o.report;
  // trials_total: every trial in the tune's log; trials_run: the ones the search itself ran now. The
  // difference is the workload's own configuration's trial (run before the search, which reuses it)
  // and, with --resume, the trials replayed from the journal. Race slices are counted in race.rounds.
  const int64_t from_journal_or_own = static_cast<int64_t>(rep.trials.size()) - rep.trials_run;
  json search{{"strategy", o.strategy},
              {"trials_run", rep.trials_run},
              {"trials_total", rep.trials.size()},
              {"trials_note", "trials_total: every trial in the journal of this tune (" + std::to_string(rep.trials.size()) +
                                  "); trials_run: those the search ran in this invocation (" +
                                  std::to_string(rep.trials_run) + "); the other " + std::to_string(from_journal_or_own) +
                                  ": the workload's own configuration, measured before the search, and trials "
                                  "replayed from the journal by --resume; race slices are not trials (race.rounds)"},
              {"seconds", rep.seconds},
              {"budget_seconds", o.budget_seconds},
              {"budget_exhausted", rep.budget_exhausted},
              {"max_micro_batch", rep.max_micro_batch},
              {"interrupted", o.interrupted}};
  if (!o.budget_spent.is_null()) search["budget_spent"] = json::parse(o.budget_spent.dump());
  return search;
}

// The configurations within noise of the choice, each with what it measured.
static json runners_up_json(const TuneOutput& o) {
  json runners = json::array();
  for (const auto& r : o.report.runners_up)
    runners.push_back({{"config", chosen_json(r.candidate, o.ranks)}, {"measured", measured(r.result)}});
  return runners;
}

static json failed_trials_json(const SearchReport& rep) {
  json failed = json::array();
  for (const auto& t : rep.trials)
    if (!t.result.ok())
      failed.push_back({{"config", t.candidate.key()}, {"class", to_string(t.result.cls)}, {"message", t.result.message}});
  return failed;
}

// In the order a reader wants: the choice and its numbers first, provenance after.
static json ordered(const TuneOutput& o) {
  json doc{{"trainbench_autotune", json::object()}};
  json& t = doc["trainbench_autotune"];
  add_choice(t, o);
  if (o.baseline) add_baseline(t, o);
  if (!o.prediction.is_null()) t["prediction"] = json::parse(o.prediction.dump());
  if (!o.global_batches.batches.empty()) t["global_batches"] = global_batches_json(o);
  t["search"] = search_json(o);
  if (o.ranks > 1) t["ranks"] = o.ranks;  // the race's and failed trials' config keys are one rank's share (g=)
  if (o.race)
    t["race"] = race_json(*o.race, o.baseline ? o.baseline->candidate.key() : "", o.noise_margin,
                          o.versus.is_null() ? "workload_config" : "versus");
  t["runners_up_within_noise"] = runners_up_json(o);
  t["failed_trials"] = failed_trials_json(o.report);
  t["executor"] = json::parse(o.executor.dump());
  t["device"] = json::parse(o.device.dump());
  t["workload"] = {{"name", o.workload_name},
                   {"path", o.workload_path},
                   {"digest", o.workload_digest},
                   {"source", o.workload_source},
                   {"grad_clip", o.grad_clip}};
  if (!o.command.empty()) t["command"] = o.command;
  if (!o.journal_path.empty()) t["journal"] = o.journal_path;
  t["version"] = build::version;
  t["git_commit"] = build::git_commit;
  return doc;
}

// YAML 1.1's booleans and nulls (PyYAML's resolver), and anything that starts like a number.
static bool plain_scalar_would_change_type(const std::string& text) {
  static const char* const words[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", ""};
  std::string lower;
  for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* w : words)
    if (lower == w) return true;
  const char first = text.empty() ? ' ' : text.front();
  return std::isdigit(static_cast<unsigned char>(first)) || first == '.' || first == '-' || first == '+';
}

// JSON -> YAML, keeping the key order of the JSON object.
static void emit_yaml(YAML::Emitter& out, const json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit_yaml(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& v : j) emit_yaml(out, v);
    out << YAML::EndSeq;
  } else if (j.is_null()) {
    out << YAML::Null;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number()) {
    std::ostringstream s;
    s.precision(6);
    s << j.get<double>();
    out << s.str();
  } else {
    // Quoted where a YAML 1.1 reader (PyYAML) would read the plain word as another type: `off`,
    // `on`, `yes`, `no` as booleans, `null` or `~` as null, digits as numbers. Every switch value
    // then loads as the string it is.
    const std::string text = j.get<std::string>();
    if (plain_scalar_would_change_type(text)) out << YAML::DoubleQuoted << text;
    else out << text;
  }
}

// "# TITLE:" and a "#   - NOTE" line for each note; "" without notes.
static std::string comment_lines(const std::string& title, const std::vector<std::string>& notes) {
  if (notes.empty()) return "";
  std::string text = "# " + title + ":\n";
  for (const auto& note : notes) text += "#   - " + note + "\n";
  return text;
}

static std::string yaml_text(const json& j, const std::string& comment) {
  YAML::Emitter out;
  emit_yaml(out, j);
  return comment + out.c_str() + "\n";
}

std::string emit(const TuneOutput& o, OutFormat format) {
  const json doc = ordered(o);
  std::ostringstream comment;
  comment << "# autotune: " << o.workload_name << " on " << o.device.value("name", std::string("?"));
  if (o.report.found) comment << ", " << o.report.best.result.samples_per_s << " samples/s";
  if (o.executor.value("name", std::string()) == "torch")
    comment << ", measured in the PyTorch twin of the step (torch " << o.executor.value("torch", std::string("?")) << ")";
  comment << "\n";
  if (const json& t = doc["trainbench_autotune"]; t.contains("speedup_note"))
    comment << "# " << t["speedup_note"].get<std::string>() << "\n";
  else if (t.contains("versus") && t["versus"].contains("note"))
    comment << "# " << t["versus"]["note"].get<std::string>() << "\n";
  const Candidate* c = o.report.found ? &o.report.best.candidate : nullptr;
  switch (format) {
    case OutFormat::json:
      return doc.dump(2) + "\n";
    case OutFormat::yaml:
      return yaml_text(doc, comment.str());
    case OutFormat::deepspeed: {
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as a DeepSpeed config");
      // DeepSpeed checks train_batch_size = micro x accumulation x world size.
      json ds{{"train_batch_size", c->global_batch * o.ranks},
              {"train_micro_batch_size_per_gpu", c->micro_batch},
              {"gradient_accumulation_steps", c->accumulation()}};
      if (o.grad_clip > 0) ds["gradient_clipping"] = o.grad_clip;
      const auto bf16 = c->switches.find("bf16_matmuls");
      if (bf16 != c->switches.end()) ds["bf16"] = {{"enabled", bf16->second == "on"}};
      return ds.dump(2) + "\n";
    }
    case OutFormat::lightning: {
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as a Lightning config");
      const FrameworkSettings pl = lightning_settings(o, *c);
      return yaml_text(pl.doc, comment.str() + comment_lines("a Lightning configuration cannot hold", pl.not_held));
    }
    case OutFormat::hf: {
      // Keyword arguments of transformers.TrainingArguments, loadable as
      // `TrainingArguments(output_dir=..., **json.load(f))`. It refuses keywords that are not its fields
      // and JSON has no comments, so the provenance is left out, as in the DeepSpeed config: it is in
      // --format yaml or json, with what TrainingArguments cannot hold (chosen.format_notes.hf).
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as Hugging Face TrainingArguments");
      return hf_settings(o, *c).doc.dump(2) + "\n";
    }
    case OutFormat::accelerate: {
      if (!c) throw UsageError("no configuration ran successfully: nothing to write as an Accelerate config");
      const FrameworkSettings a = accelerate_settings(o, *c);
      return yaml_text(a.doc, comment.str() + "# accelerate launch --config_file THIS_FILE YOUR_TRAINING_SCRIPT.py\n" +
                                  comment_lines("an Accelerate config file cannot hold; the script sets", a.not_held));
    }
  }
  return "";
}

bool CompareOutput::within_noise() const {
  if (!race) return true;  // one configuration
  for (std::size_t f = 1; f < files.size(); ++f) {
    if (raced[f] == raced[0]) continue;
    const PairedRounds p = race->compare(raced[f], raced[0], level);
    if (!p.decides() || p.faster_beyond(noise_margin) || p.slower_beyond(noise_margin)) return false;
  }
  return true;
}

static json ordered(const CompareOutput& o) {
  json configs = json::array(), comparisons = json::array();
  for (std::size_t f = 0; f < o.files.size(); ++f)
    configs.push_back({{"file", o.files[f]}, {"config", to_json(o.configs[f])}});
  for (std::size_t f = 1; f < o.files.size(); ++f) {
    json c{{"of", o.files[f]}, {"against", o.files[0]}};
    if (!o.race || o.raced[f] == o.raced[0]) {
      c["verdict"] = "same_configuration";
    } else {
      const PairedRounds p = o.race->compare(o.raced[f], o.raced[0], o.level);
      c["ratio"] = p.ratio;
      if (p.rounds >= 2) {
        c["ci_low"] = p.ci_low;
        c["ci_high"] = p.ci_high;
        c["level"] = p.level;
      }
      c["interleaved_rounds"] = p.rounds;
      c["verdict"] = !p.decides()                      ? "too_few_rounds"
                     : p.faster_beyond(o.noise_margin) ? "faster"
                     : p.slower_beyond(o.noise_margin) ? "slower"
                                                       : "within_noise";
      c["note"] = o.files[f] + "'s configuration at " + ratio_text(p.ratio, p.ci_low, p.ci_high, p.level, p.rounds) +
                  " the throughput of " + o.files[0] + "'s";
    }
    comparisons.push_back(c);
  }
  json doc{{"trainbench_autotune_compare", json::object()}};
  json& t = doc["trainbench_autotune_compare"];
  t["within_noise"] = o.within_noise();
  t["comparisons"] = comparisons;
  t["configs"] = configs;
  if (o.race) t["race"] = race_json(*o.race, "", o.noise_margin);
  t["interrupted"] = o.interrupted;
  t["executor"] = json::parse(o.executor.dump());
  t["device"] = json::parse(o.device.dump());
  t["workload"] = {{"name", o.workload_name}, {"path", o.workload_path}, {"digest", o.workload_digest}};
  t["version"] = build::version;
  t["git_commit"] = build::git_commit;
  return doc;
}

nlohmann::json to_json(const CompareOutput& o) { return nlohmann::json::parse(ordered(o).dump()); }

std::string emit(const CompareOutput& o, OutFormat format) {
  const json doc = ordered(o);
  switch (format) {
    case OutFormat::json:
      return doc.dump(2) + "\n";
    case OutFormat::yaml:
      return yaml_text(doc, "# autotune --compare: " + o.workload_name + " on " + o.device.value("name", std::string("?")) +
                                "\n");
    default:
      throw UsageError("--compare writes yaml or json");
  }
}

}  // namespace tb::tune
