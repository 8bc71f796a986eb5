// Memory the training step allocates, counted: the high-water mark is the peak-memory figure the
// step reports and the tuner fits its memory model to.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

namespace tb::step {

// Bytes currently allocated through a backend and the high-water mark.
struct MemoryMeter {
  int64_t current = 0, peak = 0;
  void add(int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
  }
};

// An owning buffer (HostBuffer<U> or cuda::DeviceBuffer<U>) whose bytes a MemoryMeter counts for as
// long as it lives.
template <class Storage>
class TrackedBuffer {
 public:
  TrackedBuffer() = default;
  TrackedBuffer(int64_t n, std::shared_ptr<MemoryMeter> meter)
      : data_(static_cast<std::size_t>(n)), meter_(std::move(meter)), bytes_(static_cast<int64_t>(data_.bytes())) {
    meter_->add(bytes_);
  }
  TrackedBuffer(TrackedBuffer&& o) noexcept { swap(o); }
  TrackedBuffer& operator=(TrackedBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~TrackedBuffer() {
    if (meter_) meter_->add(-bytes_);
  }
  auto data() { return data_.data(); }
  auto data() const { return data_.data(); }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }

 private:
  void swap(TrackedBuffer& o) {
    std::swap(data_, o.data_);
    std::swap(meter_, o.meter_);
    std::swap(bytes_, o.bytes_);
  }
  Storage data_;
  std::shared_ptr<MemoryMeter> meter_;
  int64_t bytes_ = 0;
};

// Bytes that something the meter cannot see allocates itself (a stage's workspace), counted for as
// long as this lives.
class MeteredBytes {
 public:
  MeteredBytes() = default;
  MeteredBytes(int64_t bytes, std::shared_ptr<MemoryMeter> meter) : meter_(std::move(meter)), bytes_(bytes) {
    meter_->add(bytes_);
  }
  MeteredBytes(MeteredBytes&& o) noexcept { swap(o); }
  MeteredBytes& operator=(MeteredBytes&& o) noexcept {
    swap(o);
    return *this;
  }
  ~MeteredBytes() {
    if (meter_) meter_->add(-bytes_);
  }

 private:
  void swap(MeteredBytes& o) {
    std::swap(meter_, o.meter_);
    std::swap(bytes_, o.bytes_);
  }
  std::shared_ptr<MemoryMeter> meter_;
  int64_t bytes_ = 0;
};

}  // namespace tb::step
