// The thread barrier both CPU kernel emulators use (mla_metadata_host_emu.cpp,
// mla_decode_amd_host_emu.cpp): n threads wait until all n arrived; reusable.
#pragma once
#include <condition_variable>
#include <mutex>

namespace emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    const long gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  const int n_;
  int count_ = 0;
  long gen_ = 0;
};

}  // namespace emu
