#include "tokenizer_fact.h"

#include <cstdlib>
#include <memory>

#include <sys/stat.h>

namespace dflash::hf {

nlohmann::json tokenizer_fact(const std::string& folder) {
  const auto regular = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  };
  std::string found;
  if (regular(folder + "/tokenizer.json"))
    found = folder + "/tokenizer.json";
  else if ((regular(folder + "/encoder.json") && regular(folder + "/vocab.bpe")) ||
           (regular(folder + "/vocab.json") && regular(folder + "/merges.txt")))
    found = folder;
  else
    return nullptr;
  std::unique_ptr<char, decltype(&std::free)> absolute(::realpath(found.c_str(), nullptr), &std::free);
  return {{"type", "huggingface"}, {"path", absolute ? std::string(absolute.get()) : found}};
}

}  // namespace dflash::hf
