// The loader of MPI's world (comm.h): dlopen of the plugin beside this library, once.
#include "comm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "error.h"

extern "C" {
// The plugin's one entry point (mpi/mpi_world.cpp): starts MPI and returns its world, or null with
// why in `error`.
using TrainbenchMpiWorld = tb::comm::Group* (*)(char* error, std::size_t error_size);
}

namespace tb::comm {

namespace {

std::string plugin_path() {
  if (const char* path = std::getenv("TRAINBENCH_MPI_PLUGIN"); path && *path) return path;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&world_unavailable_reason), &info) == 0 || !info.dli_fname)
    return "libtrainbench_mpi.so";
  std::string self = info.dli_fname;
  const auto slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + "libtrainbench_mpi.so";
}

struct Plugin {
  void* handle = nullptr;
  TrainbenchMpiWorld start = nullptr;
  std::string reason;  // why it cannot be used
};

Plugin& plugin() {
  static Plugin p = [] {
    Plugin loaded;
#ifndef TRAINBENCH_HAVE_MPI
    loaded.reason = "built without MPI (install Open MPI, e.g. scripts/install-deps, and rebuild)";
#else
    const std::string path = plugin_path();
    // RTLD_GLOBAL: Open MPI's own components are loaded later and resolve libmpi's symbols globally.
    loaded.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!loaded.handle) {
      const char* why = dlerror();
      loaded.reason = "MPI cannot be loaded (" + path + "): " + (why ? why : "unknown error") +
                      "; install Open MPI (libopenmpi3) on this machine";
    } else if (!(loaded.start = reinterpret_cast<TrainbenchMpiWorld>(dlsym(loaded.handle, "trainbench_mpi_world")))) {
      loaded.reason = path + " has no trainbench_mpi_world: a plugin from another build";
    }
#endif
    return loaded;
  }();
  return p;
}

Group* started = nullptr;
std::string start_failure;

int env_int(const char* const* names, int fallback) {
  for (const char* const* n = names; *n; ++n)
    if (const char* v = std::getenv(*n); v && *v) return std::atoi(v);
  return fallback;
}

}  // namespace

std::string world_unavailable_reason() { return plugin().reason; }

Group& world() {
  static std::once_flag once;
  std::call_once(once, [] {
    Plugin& p = plugin();
    if (!p.reason.empty()) {
      start_failure = p.reason;
      return;
    }
    char error[512] = {0};
    started = p.start(error, sizeof error);
    if (!started) start_failure = std::string("MPI could not be started: ") + error;
  });
  if (!started) throw CallError(__FILE__, __LINE__, "comm::world()", start_failure);
  return *started;
}

int launched_ranks() {
  if (started) return started->size();
  static const char* const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", nullptr};
  const int n = env_int(names, 1);
  return n > 0 ? n : 1;
}

int launched_rank() {
  if (started) return started->rank();
  static const char* const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", nullptr};
  const int r = env_int(names, 0);
  return r >= 0 ? r : 0;
}

void AgreedTimer::start() {
  world().barrier();
  local_.start();
}
double AgreedTimer::stop() { return agree_max(local_.stop()); }

double agree_max(double value) {
  if (launched_ranks() <= 1) return value;
  world().allreduce(&value, &value, 1, Elem::f64, Reduce::max);
  return value;
}

}  // namespace tb::comm
