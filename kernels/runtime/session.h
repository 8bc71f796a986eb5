// What the harness needs from a backend to time one benchmark: the context a variant launches into,
// a timer, a cache flusher for cold mode, and the shortest sample worth timing.
#pragma once

#include <memory>

#include "registry.h"
#include "timing.h"

namespace tb {

class BackendSession {
 public:
  virtual ~BackendSession() = default;
  virtual const RunContext& context() const = 0;
  virtual SampleTimer& timer() = 0;
  virtual CacheFlusher& flusher() = 0;
  virtual double min_sample_s() const = 0;
};

// Throws CallError when the backend is not built or has no device.
std::unique_ptr<BackendSession> make_session(Backend backend, int cuda_device);

#ifdef TRAINBENCH_HAVE_CUDA
std::unique_ptr<BackendSession> make_cuda_session(int cuda_device);  // cuda_session.cpp
#endif

}  // namespace tb
