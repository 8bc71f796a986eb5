// The MPI plugin (libtrainbench_mpi.so): the only code that includes mpi.h. comm.cpp loads it at run
// time, so that nothing else links MPI. MPI is started with MPI_THREAD_MULTIPLE when granted (the
// all-reduce stage's overlap variant all-reduces from a thread of its own while the backward runs) and
// finalised when the process exits.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "runtime/comm.h"

namespace {

using tb::comm::Elem;
using tb::comm::Reduce;

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t float_to_bf16(float x) {  // round to nearest even, as the stages store bf16
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// MPI has no bf16: a user-defined sum over 16-bit words, each pair added in float and rounded.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

class MpiWorld final : public tb::comm::Group {
 public:
  MpiWorld(int provided) : threads_(provided >= MPI_THREAD_SERIALIZED) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_);
    MPI_Comm_rank(local_, &local_rank_);
    MPI_Op_create(bf16_sum, 1, &bf16_sum_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int length = 0;
    MPI_Get_library_version(version, &length);
    library_.assign(version, static_cast<std::size_t>(length));
    if (const auto nl = library_.find_first_of("\r\n"); nl != std::string::npos) library_.resize(nl);
    if (const auto comma = library_.find(','); comma != std::string::npos) library_.resize(comma);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  bool threads_may_call() const override { return threads_; }
  std::string library() const override { return library_; }

  void allreduce(const void* send, void* recv, int64_t count, Elem elem, Reduce op) override {
    const MPI_Datatype type = elem == Elem::f32 ? MPI_FLOAT : elem == Elem::f64 ? MPI_DOUBLE : MPI_UINT16_T;
    MPI_Op mpi_op = op == Reduce::sum ? MPI_SUM : op == Reduce::max ? MPI_MAX : MPI_MIN;
    if (elem == Elem::bf16) mpi_op = bf16_sum_;  // the stages sum bf16 gradients only
    // MPI counts are int: a buffer above 2^31 elements goes in pieces.
    constexpr int64_t piece = std::numeric_limits<int>::max() / 2;
    const std::size_t width = elem == Elem::f32 ? 4 : elem == Elem::f64 ? 8 : 2;
    int64_t done = 0;
    do {
      const int n = static_cast<int>(std::min(piece, count - done));
      auto* out = static_cast<char*>(recv) + done * width;
      const void* in = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + done * width;
      MPI_Allreduce(in, out, n, type, mpi_op, MPI_COMM_WORLD);
      done += n;
    } while (done < count);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double local_sum(double value) override {
    MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, local_);
    return value;
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Comm local_ = MPI_COMM_NULL;  // the ranks on this host
  bool threads_ = false;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  std::string library_;
};

// MPI_Finalize when the process exits, if this plugin started MPI.
struct Finalizer {
  bool armed = false;
  ~Finalizer() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (armed && !finalized) MPI_Finalize();
  }
};
Finalizer finalizer;

}  // namespace

extern "C" __attribute__((visibility("default"))) tb::comm::Group* trainbench_mpi_world(char* error, std::size_t size) {
  static MpiWorld* world = nullptr;
  if (world) return world;
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      std::snprintf(error, size, "MPI_Init_thread failed");
      return nullptr;
    }
    finalizer.armed = true;
  } else {
    MPI_Query_thread(&provided);
  }
  world = new MpiWorld(provided);  // lives until exit: MPI_Finalize needs no object
  return world;
}
