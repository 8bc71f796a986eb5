// RAII host memory for the CPU backend: 64-byte aligned (whole cache lines, full-width vector
// loads), left uninitialised so that the owner can first-touch it from the threads that use it.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace tb {

template <class T>
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(std::size_t count) : count_(count) {
    const std::size_t bytes = ((count * sizeof(T) + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (!p) throw std::bad_alloc();
    data_.reset(static_cast<T*>(p));
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data_;
  std::size_t count_ = 0;
};

}  // namespace tb
