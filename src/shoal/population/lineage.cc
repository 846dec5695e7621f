#include "shoal/population/lineage.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

nlohmann::json ToJson(const LineageEvent& e) {
  nlohmann::json j = {{"member", e.member},
                      {"step", e.step},
                      {"event", e.event},
                      {"fitness", e.fitness},
                      {"loss", e.loss},
                      {"learning_rate", e.hyperparameters.learning_rate},
                      {"momentum", e.hyperparameters.momentum},
                      {"weight_decay", e.hyperparameters.weight_decay},
                      {"batch_size", e.hyperparameters.batch_size}};
  if (e.source >= 0 || !e.reason.empty()) {
    j["source"] = e.source;
    j["reason"] = e.reason;
  }
  if (!e.seen.empty()) {
    j["seen"] = e.seen;
    j["seen_steps"] = e.seen_steps;
  }
  return j;
}

LineageEvent FromJson(const nlohmann::json& j) {
  LineageEvent e;
  e.member = j.at("member").get<int>();
  e.step = j.at("step").get<int64_t>();
  e.event = j.at("event").get<std::string>();
  e.fitness = j.at("fitness").get<double>();
  e.loss = j.at("loss").get<double>();
  e.hyperparameters.learning_rate = j.at("learning_rate").get<double>();
  e.hyperparameters.momentum = j.at("momentum").get<double>();
  e.hyperparameters.weight_decay = j.at("weight_decay").get<double>();
  e.hyperparameters.batch_size = j.at("batch_size").get<int64_t>();
  if (j.contains("source")) {
    e.source = j.at("source").get<int>();
    e.reason = j.at("reason").get<std::string>();
  }
  if (j.contains("seen")) {
    e.seen = j.at("seen").get<std::vector<double>>();
    e.seen_steps = j.at("seen_steps").get<std::vector<int64_t>>();
    if (e.seen.size() != e.seen_steps.size()) throw nlohmann::json::other_error::create(501, "seen and seen_steps differ in length", &j);
  }
  return e;
}

// Red (worst) to green (best) over [lo, hi].
std::string FitnessColour(double fitness, double lo, double hi) {
  const double t = hi > lo ? std::clamp((fitness - lo) / (hi - lo), 0.0, 1.0) : 1.0;
  return absl::StrFormat("rgb(%d,%d,60)", static_cast<int>(220 * (1 - t)), static_cast<int>(60 + 140 * t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LineageLog>> LineageLog::Open(const std::string& dir, int member, bool append) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::FailedPreconditionError(absl::StrCat("cannot create lineage directory '", dir, "': ", error.message()));
  const std::string path = (std::filesystem::path(dir) / absl::StrCat("member_", member, ".jsonl")).string();
  auto log = std::unique_ptr<LineageLog>(new LineageLog(path, append));
  if (!log->out_) return absl::FailedPreconditionError(absl::StrCat("cannot write lineage file '", path, "'"));
  return log;
}

LineageLog::LineageLog(std::string path, bool append)
    : path_(std::move(path)), out_(path_, append ? std::ios::app : std::ios::trunc) {}

absl::Status LineageLog::Write(const LineageEvent& event) {
  out_ << ToJson(event).dump() << "\n";
  out_.flush();
  if (!out_) return absl::DataLossError(absl::StrCat("writing lineage file '", path_, "' failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LineageEvent>> ReadLineage(const std::string& dir) {
  std::error_code error;
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("member_", 0) == 0 && entry.path().extension() == ".jsonl") paths.push_back(entry.path());
  }
  if (error) return absl::NotFoundError(absl::StrCat("cannot list lineage directory '", dir, "': ", error.message()));
  if (paths.empty()) return absl::NotFoundError(absl::StrCat("no lineage files (member_*.jsonl) in '", dir, "'"));
  std::vector<LineageEvent> events;
  for (const auto& path : paths) {
    std::ifstream in(path);
    std::string text;
    for (int line = 1; std::getline(in, text); ++line) {
      if (text.empty()) continue;
      try {
        events.push_back(FromJson(nlohmann::json::parse(text)));
      } catch (const nlohmann::json::exception& e) {
        return absl::DataLossError(absl::StrCat("lineage file '", path.string(), "' line ", line, ": ", e.what()));
      }
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const LineageEvent& a, const LineageEvent& b) {
    return a.member != b.member ? a.member < b.member : a.step < b.step;
  });
  return events;
}

absl::Status DrawLineage(const std::vector<LineageEvent>& events, const std::string& svg_path) {
  if (events.empty()) return absl::InvalidArgumentError("no lineage events to draw");
  int members = 0;
  int64_t last_step = 1;
  double lo = 1, hi = 0;
  for (const auto& e : events) {
    members = std::max(members, e.member + 1);
    last_step = std::max(last_step, e.step);
    if (e.fitness >= 0) {
      lo = std::min(lo, e.fitness);
      hi = std::max(hi, e.fitness);
    }
  }
  constexpr double kLeft = 110, kWidth = 900, kLane = 70, kTop = 50;
  auto x = [&](int64_t step) { return kLeft + kWidth * static_cast<double>(step) / last_step; };
  auto y = [&](int member) { return kTop + kLane * (member + 0.5); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<defs><marker id=\"arrow\" markerWidth=\"8\" markerHeight=\"8\" refX=\"7\" refY=\"4\" orient=\"auto\">"
      "<path d=\"M0,0 L8,4 L0,8 z\" fill=\"#333\"/></marker></defs>\n"
      "<text x=\"%g\" y=\"22\" font-size=\"15\">population lineage: fitness (validation accuracy, red %.3f to green "
      "%.3f) by member step; arrows are copies</text>\n",
      static_cast<int>(kLeft + kWidth + 40), static_cast<int>(kTop + kLane * members + 40), kLeft, lo, hi);
  std::map<int, const LineageEvent*> previous;  // each member's last event with a fitness
  for (const auto& e : events) {
    if (!previous.count(e.member)) {
      svg += absl::StrFormat("<text x=\"10\" y=\"%g\">member %d</text>\n", y(e.member) + 4, e.member);
    }
    const LineageEvent* before = previous.count(e.member) ? previous[e.member] : nullptr;
    if (before != nullptr && e.step > before->step) {
      svg += absl::StrFormat("<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"8\"/>\n",
                             x(before->step), y(e.member), x(e.step), y(e.member),
                             FitnessColour(before->fitness < 0 ? lo : before->fitness, lo, hi));
    }
    if (e.event == "exploit" && e.source >= 0) {
      svg += absl::StrFormat(
          "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\" stroke-width=\"1.2\" "
          "marker-end=\"url(#arrow)\"><title>step %d: member %d copies member %d (%s)</title></line>\n",
          x(e.step), y(e.source), x(e.step), y(e.member) + (e.source < e.member ? -6 : 6), e.step, e.member, e.source,
          e.reason);
    }
    if (e.event == "start" || e.event == "exploit") {
      svg += absl::StrFormat("<text x=\"%g\" y=\"%g\" fill=\"#333\">lr %.2g</text>\n", x(e.step) + 2,
                             y(e.member) - 10, e.hyperparameters.learning_rate);
    }
    if (e.event == "end") {
      svg += absl::StrFormat("<text x=\"%g\" y=\"%g\">%.4f</text>\n", x(e.step) + 4, y(e.member) + 4, e.fitness);
    }
    if (e.fitness >= 0 || before == nullptr) previous[e.member] = &e;
  }
  svg += "</svg>\n";
  std::ofstream out(svg_path, std::ios::trunc);
  out << svg;
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write '", svg_path, "'"));
  return absl::OkStatus();
}

CopyStatistics CountCopies(const std::vector<LineageEvent>& events, int64_t ready_steps) {
  CopyStatistics stats;
  std::map<int64_t, int64_t> copies_in;  // interval -> copies; every interval with a decision is listed
  for (const auto& e : events) {
    if (e.event != "exploit" && e.event != "keep") continue;
    int64_t& copies = copies_in[std::llround(static_cast<double>(e.step) / std::max<int64_t>(1, ready_steps))];
    if (e.event != "exploit") continue;
    ++copies;
    ++stats.copies;
    if (e.member < static_cast<int>(e.seen.size())) {
      const double mine = e.seen[e.member];
      bool worst = true;
      for (double other : e.seen) worst = worst && (other < 0 || other >= mine);
      if (worst) ++stats.copies_by_the_worst;
    }
  }
  for (const auto& [interval, copies] : copies_in) {
    if (static_cast<int64_t>(stats.copies_per_interval.size()) <= copies) stats.copies_per_interval.resize(copies + 1);
    ++stats.copies_per_interval[copies];
  }
  return stats;
}

std::string PopulationSummary(const std::vector<LineageEvent>& events, int64_t ready_steps) {
  struct Row {
    const LineageEvent* last = nullptr;
    int copied = 0, copied_from = 0;
  };
  std::map<int, Row> rows;
  for (const auto& e : events) {
    Row& row = rows[e.member];
    if (e.fitness >= 0 || row.last == nullptr) row.last = &e;
    if (e.event == "exploit") {
      ++row.copied;
      ++rows[e.source].copied_from;
    }
  }
  std::string text;
  for (const auto& [member, row] : rows) {
    text += absl::StrFormat("member %d: fitness %.4f at step %d; %s; copied others %d times, was copied %d times\n",
                            member, row.last->fitness, row.last->step, row.last->hyperparameters.ToString(),
                            row.copied, row.copied_from);
  }
  const CopyStatistics stats = CountCopies(events, ready_steps);
  if (!stats.copies_per_interval.empty()) {
    std::vector<std::string> bins;
    for (size_t k = 0; k < stats.copies_per_interval.size(); ++k) {
      bins.push_back(absl::StrCat(k, ": ", stats.copies_per_interval[k]));
    }
    text += absl::StrFormat(
        "ready intervals by copies made in them: %s; the copier was the worst ranked in %d of %d copies\n",
        absl::StrJoin(bins, ", "), stats.copies_by_the_worst, stats.copies);
  }
  return text;
}

}  // namespace shoal
