#include "ab/ab_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace dflash::ab {
namespace {

// The figures compared between arms: each from the last tenth of the steps
// (at least one), so one noisy step does not decide.
struct Figure {
  const char* key;
  const char* label;
  bool higher_is_better;
};
constexpr Figure kFigures[] = {
    {"final_loss", "loss, each arm's own objective (last 10 %)", false},
    {"final_acc1", "slot-1 accuracy (last 10 %)", true},
    {"final_tau_sim", "simulated acceptance Σ Π acc (last 10 %)", true},
    {"eval_tau", "real τ, speculative decoding at the end", true},
    {"step_seconds", "step time, s (mean after step 0)", false},
    {"tokens_per_s", "target tokens/s (mean after step 0)", true},
    {"peak_memory_bytes", "peak memory, bytes", false},
};

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / static_cast<double>(v.size());
}
double spread_of(const std::vector<double>& v) {  // sample standard deviation
  if (v.size() < 2) return NAN;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// One run's figures.
std::map<std::string, double> figures_of(const ArmRun& run) {
  std::map<std::string, double> f;
  const auto& m = run.metrics;
  if (m.empty()) return f;
  const size_t tail = std::max<size_t>(1, m.size() / 10);
  double loss = 0, acc1 = 0, tau = 0;
  for (size_t i = m.size() - tail; i < m.size(); ++i) {
    loss += m[i].value("loss", NAN);
    const auto& acc = m[i].value("slot_accuracy", nlohmann::json::array());
    acc1 += acc.empty() ? NAN : acc[0].get<double>();
    tau += m[i].value("acceptance_length_sim", NAN);
  }
  f["final_loss"] = loss / static_cast<double>(tail);
  f["final_acc1"] = acc1 / static_cast<double>(tail);
  f["final_tau_sim"] = tau / static_cast<double>(tail);
  double seconds = 0, tokens = 0, peak = 0;
  size_t timed = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    peak = std::max(peak, m[i].value("memory_peak_bytes", 0.0));
    if (i == 0 && m.size() > 1) continue;  // the first step pays for warm-up
    seconds += m[i].value("step_seconds", 0.0);
    tokens += m[i].value("tokens_per_s", 0.0);
    ++timed;
  }
  f["step_seconds"] = seconds / static_cast<double>(timed);
  f["tokens_per_s"] = tokens / static_cast<double>(timed);
  f["peak_memory_bytes"] = peak;
  if (run.final_eval.is_object() && run.final_eval.contains("tau_mean")) f["eval_tau"] = run.final_eval["tau_mean"].get<double>();
  return f;
}

std::string padded(const std::string& text, size_t width) {
  const size_t have = display_width(text);
  return have >= width ? text : text + std::string(width - have, ' ');
}

// The loss metrics of a metrics record, flattened to "<plugin>.<metric>".
std::map<std::string, double> loss_metrics_of(const nlohmann::json& record) {
  std::map<std::string, double> out;
  if (!record.contains("loss_metrics") || !record["loss_metrics"].is_object()) return out;
  for (const auto& [plugin, metrics] : record["loss_metrics"].items())
    if (metrics.is_object())
      for (const auto& [name, value] : metrics.items())
        if (value.is_number()) out[plugin + "." + name] = value.get<double>();
  return out;
}

std::string number(double x, int digits = 4) {
  if (std::isnan(x)) return "–";
  std::ostringstream o;
  if (std::fabs(x) >= 1e6) o << std::setprecision(3) << std::scientific << x;
  else o << std::setprecision(digits) << std::fixed << x;
  return o.str();
}

std::string escape_html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A line chart of one metric against the step, one line per arm (mean over
// its seeds), as inline SVG.
std::string svg_chart(const std::string& title, const std::vector<std::string>& arms, const std::vector<ArmRun>& runs,
                      const std::string& key) {
  static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
  std::map<std::string, std::map<int64_t, std::vector<double>>> series;
  for (const ArmRun& r : runs)
    for (const auto& rec : r.metrics) {
      if (!rec.contains(key) || !rec[key].is_number()) continue;
      series[r.arm][rec.value("step", int64_t{0})].push_back(rec[key].get<double>());
    }
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const auto& [arm, points] : series)
    for (const auto& [step, values] : points) {
      const double y = mean_of(values);
      xmin = std::min(xmin, double(step)), xmax = std::max(xmax, double(step));
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  const double w = 640, h = 300, left = 60, right = 20, top = 30, bottom = 40;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-metric=\"" << escape_html(key) << "\" width=\"" << w
      << "\" height=\"" << h << "\" viewBox=\"0 0 " << w << " " << h << "\">\n";
  svg << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\" font-family=\"sans-serif\">" << escape_html(title) << "</text>\n";
  if (series.empty()) {
    svg << "<text x=\"" << left << "\" y=\"" << h / 2 << "\" font-family=\"sans-serif\">no data</text></svg>\n";
    return svg.str();
  }
  if (xmax == xmin) xmax = xmin + 1;
  if (ymax == ymin) ymax = ymin + 1;
  auto sx = [&](double x) { return left + (x - xmin) / (xmax - xmin) * (w - left - right); };
  auto sy = [&](double y) { return h - bottom - (y - ymin) / (ymax - ymin) * (h - top - bottom); };
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << w - left - right << "\" height=\"" << h - top - bottom
      << "\" fill=\"none\" stroke=\"#999\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = ymin + (ymax - ymin) * i / 4;
    svg << "<text x=\"" << left - 6 << "\" y=\"" << sy(y) + 4 << "\" font-size=\"10\" text-anchor=\"end\" font-family=\"sans-serif\">"
        << number(y, 3) << "</text>\n";
  }
  svg << "<text x=\"" << left << "\" y=\"" << h - 12 << "\" font-size=\"10\" font-family=\"sans-serif\">step " << xmin
      << "</text><text x=\"" << w - right << "\" y=\"" << h - 12
      << "\" font-size=\"10\" text-anchor=\"end\" font-family=\"sans-serif\">step " << xmax << "</text>\n";
  size_t color = 0;
  for (const std::string& arm : arms) {
    auto it = series.find(arm);
    if (it == series.end()) continue;
    // Each later arm is drawn thinner, so arms with the same curve (an A/A
    // check) stay visible as a line inside a line.
    const double width = std::max(1.0, 4.5 - 1.2 * static_cast<double>(color));
    const char* stroke = kColors[color++ % (sizeof kColors / sizeof *kColors)];
    svg << "<polyline class=\"series\" data-arm=\"" << escape_html(arm) << "\" fill=\"none\" stroke=\"" << stroke
        << "\" stroke-width=\"" << width << "\" points=\"";
    for (const auto& [step, values] : it->second) svg << sx(double(step)) << "," << sy(mean_of(values)) << " ";
    svg << "\"/>\n";
    if (it->second.size() == 1)
      svg << "<circle cx=\"" << sx(double(it->second.begin()->first)) << "\" cy=\"" << sy(mean_of(it->second.begin()->second))
          << "\" r=\"3\" fill=\"" << stroke << "\"/>\n";
    svg << "<text x=\"" << w - right - 4 << "\" y=\"" << top + 14 * color << "\" font-size=\"11\" text-anchor=\"end\" fill=\""
        << stroke << "\" font-family=\"sans-serif\">" << escape_html(arm) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace

// The labels hold Σ, Π, τ, ±, –: several bytes in UTF-8, one column wide.
size_t display_width(const std::string& text) {
  size_t width = 0;
  for (unsigned char c : text) width += (c & 0xC0) != 0x80;  // not a continuation byte
  return width;
}

nlohmann::json summarize(const std::vector<std::string>& arms, const std::vector<ArmRun>& runs,
                         const std::vector<GradientCheck>& checks, const nlohmann::json& settings) {
  nlohmann::json summary = {{"settings", settings}, {"arms", nlohmann::json::array()}};
  for (const std::string& arm : arms) {
    nlohmann::json a = {{"name", arm}, {"seeds", nlohmann::json::array()}, {"failed", nlohmann::json::array()}};
    std::map<std::string, std::vector<double>> values;
    for (const ArmRun& r : runs) {
      if (r.arm != arm) continue;
      if (r.failed) {
        a["failed"].push_back({{"seed", r.seed}, {"reason", r.failure}});
        continue;
      }
      a["seeds"].push_back(r.seed);
      for (const auto& [key, x] : figures_of(r))
        if (!std::isnan(x)) values[key].push_back(x);
    }
    for (const Figure& f : kFigures) {
      const auto& v = values[f.key];
      a[f.key] = v.empty() ? nlohmann::json(nullptr)
                           : nlohmann::json{{"mean", mean_of(v)}, {"spread", v.size() > 1 ? nlohmann::json(spread_of(v)) : nlohmann::json(nullptr)},
                                            {"values", v}};
    }
    a["status"] = a["seeds"].empty() ? "failed" : (a["failed"].empty() ? "ok" : "partly failed");
    summary["arms"].push_back(a);
  }
  // Verdicts: each arm against the first, on what speculative decoding
  // gains from — acceptance (real τ when measured, else simulated) and
  // slot-1 accuracy. Not on the loss: arms with different losses optimise
  // different objectives, whose values do not compare. With several seeds a
  // difference counts only beyond twice the standard error of the difference.
  nlohmann::json verdicts = nlohmann::json::array();
  const auto& arms_json = summary["arms"];
  for (size_t i = 1; i < arms_json.size(); ++i) {
    const auto& base = arms_json[0];
    const auto& other = arms_json[i];
    for (const char* key : {"eval_tau", "final_tau_sim", "final_acc1"}) {
      if (std::string(key) == "final_tau_sim" && !base["eval_tau"].is_null() && !other["eval_tau"].is_null()) continue;
      if (base[key].is_null() || other[key].is_null()) continue;
      const Figure& f = *std::find_if(std::begin(kFigures), std::end(kFigures), [&](const Figure& x) { return std::string(x.key) == key; });
      const double ma = base[key]["mean"], mb = other[key]["mean"], diff = mb - ma;
      const auto& va = base[key]["values"], &vb = other[key]["values"];
      std::string text;
      nlohmann::json v = {{"arm", other["name"]}, {"baseline", base["name"]}, {"figure", key}, {"difference", diff}};
      if (va.size() < 2 || vb.size() < 2) {
        v["verdict"] = "no noise estimate";
        text = "one seed per arm, so no noise estimate: run with --seeds 3 or more to judge";
      } else {
        const double sa = base[key]["spread"], sb = other[key]["spread"];
        const double noise = std::sqrt(sa * sa / double(va.size()) + sb * sb / double(vb.size()));
        v["noise"] = noise;
        if (std::fabs(diff) <= 2 * noise) {
          v["verdict"] = "within noise";
          text = "within noise: the difference " + number(diff) + " is no more than twice its standard error " + number(noise);
        } else {
          const bool better = f.higher_is_better ? diff > 0 : diff < 0;
          v["verdict"] = better ? "better" : "worse";
          text = std::string(better ? "better" : "worse") + " by " + number(std::fabs(diff)) + " (" +
                 number(std::fabs(diff) / noise, 1) + " standard errors)";
        }
      }
      v["text"] = std::string(other["name"]) + " vs " + std::string(base["name"]) + ", " + f.label + ": " + text;
      verdicts.push_back(v);
    }
  }
  summary["verdicts"] = verdicts;
  nlohmann::json check = nlohmann::json::array();
  for (const GradientCheck& c : checks)
    check.push_back({{"a", c.a}, {"b", c.b}, {"cosine", c.cosine}, {"max_relative_difference", c.max_relative_difference},
                     {"equal", c.equal}});
  summary["step0_gradients"] = check;
  return summary;
}

void write_report(const std::string& dir, const nlohmann::json& summary, const std::vector<ArmRun>& runs) {
  auto open = [&](const std::string& name) {
    std::ofstream out(dir + "/" + name);
    if (!out) throw std::runtime_error(dir + "/" + name + ": cannot write");
    return out;
  };
  {
    nlohmann::json results = summary;
    results["runs"] = nlohmann::json::array();
    for (const ArmRun& r : runs)
      results["runs"].push_back({{"arm", r.arm}, {"seed", r.seed}, {"failed", r.failed}, {"failure", r.failure},
                                 {"metrics", r.metrics}, {"final_eval", r.final_eval}});
    auto out = open("results.json");
    out << results.dump(2) << "\n";
  }
  {
    auto out = open("curves.csv");
    // Per-slot accuracy: one column per block slot 1 … K−1.
    size_t slots = 1;
    for (const ArmRun& r : runs)
      for (const auto& m : r.metrics) slots = std::max(slots, m.value("slot_accuracy", nlohmann::json::array()).size());
    // Every metric any arm's loss logged, "<plugin>.<metric>", after the host's own.
    std::set<std::string> loss_columns;
    for (const ArmRun& r : runs)
      for (const auto& m : r.metrics)
        for (const auto& [name, value] : loss_metrics_of(m)) loss_columns.insert(name);
    out << "arm,seed,step,loss";
    for (size_t k = 1; k <= slots; ++k) out << ",acc" << k;
    out << ",acceptance_length_sim,eval_tau,lr,grad_norm,tokens_per_s,step_seconds,memory_peak_bytes";
    for (const std::string& name : loss_columns) out << "," << name;
    out << "\n";
    out << std::setprecision(10);
    for (const ArmRun& r : runs)
      for (const auto& m : r.metrics) {
        auto field = [&](const char* key) {
          return m.contains(key) && m[key].is_number() ? number(m[key].get<double>(), 8) : std::string();
        };
        const auto& acc = m.value("slot_accuracy", nlohmann::json::array());
        out << '"' << r.arm << "\"," << r.seed << "," << m.value("step", int64_t{0}) << "," << field("loss");
        for (size_t k = 0; k < slots; ++k) out << "," << (k < acc.size() ? number(acc[k].get<double>(), 8) : std::string());
        out << "," << field("acceptance_length_sim") << ","
            << field("eval_tau") << "," << field("lr") << "," << field("grad_norm") << "," << field("tokens_per_s") << ","
            << field("step_seconds") << "," << field("memory_peak_bytes");
        const std::map<std::string, double> loss_values = loss_metrics_of(m);
        for (const std::string& name : loss_columns) {
          const auto it = loss_values.find(name);
          out << "," << (it == loss_values.end() ? std::string() : number(it->second, 8));
        }
        out << "\n";
      }
  }
  std::vector<std::string> arms;
  for (const auto& a : summary["arms"]) arms.push_back(a["name"]);
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>dflash-host A/B report</title>\n"
          "<style>body{font-family:sans-serif;margin:24px;max-width:1000px}table{border-collapse:collapse;margin:12px 0}"
          "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child{text-align:left}"
          ".failed{color:#b00}</style></head><body>\n<h1>A/B comparison of loss plugins</h1>\n";
  html << "<p>" << escape_html(summary["settings"].dump()) << "</p>\n";
  html << "<h2>Summary</h2>\n" << "<pre class=\"summary\">" << escape_html(format_summary(summary)) << "</pre>\n";
  html << "<h2>Verdicts</h2>\n<ul>\n";
  for (const auto& v : summary["verdicts"]) html << "<li>" << escape_html(v["text"].get<std::string>()) << "</li>\n";
  html << "</ul>\n<h2>Curves</h2>\n";
  html << svg_chart("training loss", arms, runs, "loss");
  html << svg_chart("simulated acceptance length Σ_k Π acc", arms, runs, "acceptance_length_sim");
  html << svg_chart("real τ (speculative decoding during training)", arms, runs, "eval_tau");
  html << "</body></html>\n";
  auto out = open("report.html");
  out << html.str();
}

std::string format_summary(const nlohmann::json& summary) {
  std::ostringstream out;
  const auto& arms = summary["arms"];
  // Every cell of the table, so each column is as wide as its widest cell:
  // an arm's name is never cut (a cut name can read as another valid arm).
  const std::string title = "figure (mean ± spread over seeds)";
  std::vector<std::vector<std::string>> rows;
  rows.push_back({title});
  for (const auto& a : arms) rows.back().push_back(a["name"].get<std::string>());
  for (const Figure& f : kFigures) {
    rows.push_back({f.label});
    for (const auto& a : arms) {
      std::string cell = "–";
      if (!a[f.key].is_null()) {
        cell = number(a[f.key]["mean"].get<double>());
        if (!a[f.key]["spread"].is_null()) cell += " ± " + number(a[f.key]["spread"].get<double>());
      }
      rows.back().push_back(cell);
    }
  }
  rows.push_back({"seeds completed"});
  for (const auto& a : arms)
    rows.back().push_back(std::to_string(a["seeds"].size()) +
                          (a["failed"].empty() ? "" : " (+" + std::to_string(a["failed"].size()) + " failed)"));
  std::vector<size_t> widths(arms.size() + 1, 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], display_width(row[c]));
  for (const auto& row : rows) {
    std::string line = padded(row[0], widths[0]);
    for (size_t c = 1; c < row.size(); ++c) line += "  " + padded(row[c], widths[c]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  for (const auto& a : arms)
    for (const auto& f : a["failed"])
      out << "FAILED: " << a["name"].get<std::string>() << " seed " << f["seed"] << ": " << f["reason"].get<std::string>() << "\n";
  if (!summary["step0_gradients"].empty()) {
    out << "\nstep-0 gradients (same batch, same initial drafter):\n";
    for (const auto& c : summary["step0_gradients"])
      out << "  " << c["a"].get<std::string>() << " vs " << c["b"].get<std::string>() << ": cosine "
          << number(c["cosine"].get<double>(), 8) << ", max relative difference "
          << number(c["max_relative_difference"].get<double>(), 8)
          << (c["equal"].get<bool>() ? "  → equal within tolerance" : "  → different") << "\n";
  }
  if (!summary["verdicts"].empty()) {
    out << "\n";
    for (const auto& v : summary["verdicts"]) out << v["text"].get<std::string>() << "\n";
  }
  return out.str();
}

}  // namespace dflash::ab
