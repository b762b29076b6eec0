#include "dist/collective.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace dflash::dist {
namespace {

class Alone final : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::unique_ptr<Pending> all_reduce_sum_async(at::Tensor, const std::string&) override {
    struct Done final : Pending {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  void all_gather(std::vector<at::Tensor>& out, const at::Tensor& mine, const std::string&) override { out = {mine.clone()}; }
  void broadcast(at::Tensor, int, const std::string&) override {}
  void barrier(const std::string&) override {}
};

}  // namespace

std::unique_ptr<Collective> single_process() { return std::make_unique<Alone>(); }

std::string heartbeat_key(int rank, const std::string& scope) { return "dflash/" + scope + "heartbeat/" + std::to_string(rank); }
std::string failure_key(int world_rank) { return "dflash/failed/" + std::to_string(world_rank); }

std::unique_ptr<Pending> Collective::send_async(at::Tensor, int to, int, const std::string& what) {
  throw std::logic_error("send " + what + " to rank " + std::to_string(to) + ": this group of " +
                         std::to_string(world_size()) + " has no point-to-point transport");
}

std::unique_ptr<Pending> Collective::recv_async(at::Tensor, int from, int, const std::string& what) {
  throw std::logic_error("receive " + what + " from rank " + std::to_string(from) + ": this group of " +
                         std::to_string(world_size()) + " has no point-to-point transport");
}

std::unique_ptr<KeyValue> Collective::key_value() {
  throw std::logic_error("this group of " + std::to_string(world_size()) + " has no key-value store");
}

std::unique_ptr<Collective> Collective::subgroup(const std::vector<int>& members, const std::string& name) {
  if (members.size() == 1 && members[0] == rank()) return single_process();
  throw std::logic_error("subgroup '" + name + "' of " + std::to_string(members.size()) + " ranks: this group of " +
                         std::to_string(world_size()) + " cannot make one");
}

// Two rounds: the lengths, then every text padded to the longest.
std::vector<std::string> Collective::all_gather_text(const std::string& mine, const std::string& what) {
  std::vector<at::Tensor> lengths;
  all_gather(lengths, at::tensor({static_cast<int64_t>(mine.size())}, at::kLong), what + " (lengths)");
  int64_t longest = 0;
  for (const at::Tensor& l : lengths) longest = std::max(longest, l.to(at::kCPU).item<int64_t>());
  at::Tensor bytes = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  std::vector<at::Tensor> all;
  all_gather(all, bytes, what);
  std::vector<std::string> texts;
  for (size_t r = 0; r < all.size(); ++r) {
    const at::Tensor b = all[r].to(at::kCPU).contiguous();
    const int64_t n = lengths[r].to(at::kCPU).item<int64_t>();
    texts.emplace_back(reinterpret_cast<const char*>(b.data_ptr<uint8_t>()), static_cast<size_t>(n));
  }
  return texts;
}

}  // namespace dflash::dist
