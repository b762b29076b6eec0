// The benchmarks' command lines: flags read in order, `--flag VALUE` pairs
// and bare switches. Each benchmark names its flags in one if-chain over a
// FlagReader; a missing or malformed value, or an unknown flag, is an error
// naming the flag.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dflash::bench {

class FlagReader {
 public:
  FlagReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next flag; false after the last.
  bool next() {
    if (++at_ >= argc_) return false;
    flag_ = argv_[at_];
    return true;
  }
  bool is(const char* name) const { return flag_ == name; }

  // The flag's value: the next word.
  std::string text() {
    if (at_ + 1 >= argc_) throw std::invalid_argument(flag_ + " needs a value");
    return argv_[++at_];
  }
  int64_t integer() {
    return whole_value<int64_t>("an integer", [](const std::string& v, size_t* used) { return std::stoll(v, used); });
  }
  double number() {
    return whole_value<double>("a number", [](const std::string& v, size_t* used) { return std::stod(v, used); });
  }
  // The flag's value as KEY=VALUE (--loss-set, --drafter-set), put in
  // `into`: VALUE as JSON where it parses (numbers, booleans), else as text.
  void setting(nlohmann::json& into) {
    const std::string pair = text();
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) throw std::invalid_argument(flag_ + " takes KEY=VALUE, not '" + pair + "'");
    const std::string value = pair.substr(eq + 1);
    nlohmann::json parsed = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    into[pair.substr(0, eq)] = parsed.is_discarded() ? nlohmann::json(value) : parsed;
  }
  [[noreturn]] void unknown() const { throw std::invalid_argument("unknown flag " + flag_); }

 private:
  // The flag's value parsed by `parse` (std::stoll, std::stod), which must
  // use all of it; `what` names the kind of value in the error.
  template <class T, class Parse>
  T whole_value(const char* what, Parse parse) {
    const std::string value = text();
    size_t used = 0;
    T parsed{};
    try {
      parsed = parse(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != value.size()) throw std::invalid_argument(flag_ + " takes " + what + ", not '" + value + "'");
    return parsed;
  }

  int argc_;
  char** argv_;
  int at_ = 0;
  std::string flag_;
};

}  // namespace dflash::bench
