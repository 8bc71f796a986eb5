// Ranks that work together: MPI's world, for the CPU backend's all-reduce and as the bootstrap of
// NCCL's communicators (one process per GPU under mpirun). MPI is loaded at run time from a plugin
// built beside this library (libtrainbench_mpi.so, linked to the MPI found at build time), so that a
// machine without MPI (a GPU node) still runs every other stage, and a build without MPI lists the
// collective variants with the reason. MPI itself is started on first use and finalised at exit.
#pragma once

#include <cstdint>
#include <string>

#include "timing.h"

namespace tb::comm {

enum class Elem { f32, bf16, f64 };  // bf16: summed in float by a user-defined MPI operation
enum class Reduce { sum, max, min };

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks on this host (which GPU a rank drives)
  // Host memory; `send == recv` reduces in place.
  virtual void allreduce(const void* send, void* recv, int64_t count, Elem elem, Reduce op) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  virtual double local_sum(double value) = 0;  // over the ranks on this host
  virtual bool threads_may_call() const = 0;   // from any thread, one at a time (MPI_THREAD_SERIALIZED)
  virtual std::string library() const = 0;     // "Open MPI v4.1.4, ..."
};

// The world, MPI started on the first call. Throws CallError saying why when MPI cannot be used:
// built without it, or the plugin or the MPI library could not be loaded.
Group& world();
// Why world() would fail, without starting MPI; "" when the plugin loads.
std::string world_unavailable_reason();
// The ranks this process was started with: MPI's world size once MPI is running, else what the
// launcher put in the environment (Open MPI, MPICH/Hydra, Slurm's PMI), else 1. Never starts MPI.
int launched_ranks();
int launched_rank();  // this process's rank by the same rules; 0 when not launched by one

// One value agreed by every rank: the largest (a collective's time is its slowest rank's). The
// value itself with one rank or without MPI running.
double agree_max(double value);
inline double agree_min(double value) { return -agree_max(-value); }

// A collective's sample timer: every rank starts together (a barrier, outside the timed region) and
// the sample is the slowest rank's time, as the step that waits for the all-reduce sees it. Every
// rank's loop then takes the same decisions (warm-up, batch, iteration counts, when to stop) and calls
// the collective equally often, which it must, or the ranks would wait on each other forever.
class AgreedTimer final : public SampleTimer {
 public:
  explicit AgreedTimer(SampleTimer& local) : local_(local) {}
  void start() override;
  double stop() override;

 private:
  SampleTimer& local_;
};

// The data-parallel step's buckets over a flat gradient buffer of `n` elements: `bucket` elements at a
// time from the end (the order the backward finishes gradients), f(begin, length) for each.
template <class F>
void for_each_bucket_from_end(int64_t n, int64_t bucket, F&& f) {
  for (int64_t end = n; end > 0; end -= bucket) {
    const int64_t begin = end > bucket ? end - bucket : 0;
    f(begin, end - begin);
  }
}

// nccl-tests' bus bandwidth factor: a ring all-reduce moves 2(n-1)/n of the buffer through each link.
inline double ring_bus_factor(int ranks) { return ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0; }

}  // namespace tb::comm
