#include "shoal/report/metrics_plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

absl::Status BadRecord(const std::string& path, int line, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("metrics file '", path, "' line ", line, ": ", why));
}

absl::StatusOr<MetricsPoint> ParseJsonRecord(const std::string& text, std::string* task) {
  nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded() || !record.is_object()) return absl::InvalidArgumentError("not a JSON object");
  MetricsPoint p;
  try {
    *task = record.at("task").get<std::string>();
    p.time_s = record.at("time_s").get<double>();
    p.local_step = record.at("local_step").get<int64_t>();
    p.global_step = record.at("global_step").get<int64_t>();
    p.loss = record.at("loss").get<double>();
    p.accuracy = record.at("accuracy").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return p;
}

absl::StatusOr<MetricsPoint> ParseCsvRecord(const std::string& text, std::string* task) {
  std::vector<std::string> fields = absl::StrSplit(text, ',');
  // 8 since the auc column (empty but for click models); 7 in older files.
  if (fields.size() != 7 && fields.size() != 8) {
    return absl::InvalidArgumentError(absl::StrCat(fields.size(), " fields, expected 8"));
  }
  MetricsPoint p;
  *task = fields[0];
  if (!absl::SimpleAtod(fields[1], &p.time_s) || !absl::SimpleAtoi(fields[2], &p.local_step) ||
      !absl::SimpleAtoi(fields[3], &p.global_step) || !absl::SimpleAtod(fields[4], &p.loss) ||
      !absl::SimpleAtod(fields[5], &p.accuracy)) {
    return absl::InvalidArgumentError("a field is not a number");
  }
  return p;
}

// The colours of the task lines, in turn.
constexpr double kPalette[][3] = {{0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17}, {0.84, 0.15, 0.16},
                                  {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}};

// A "nice" tick step for a range: 1, 2 or 5 times a power of ten.
double TickStep(double range) {
  if (range <= 0) return 1;
  const double raw = range / 5, magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  return magnitude * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
}

struct Panel {
  double x, y, width, height;  // the plotting area, in pixels
  double x_min, x_max, y_min, y_max;
  double PixelX(double v) const { return x + (v - x_min) / (x_max - x_min) * width; }
  double PixelY(double v) const { return y + height - (v - y_min) / (y_max - y_min) * height; }
};

void DrawAxes(cairo_t* cr, const Panel& p, const std::string& title, const std::string& x_label) {
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, p.x, p.y, p.width, p.height);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 12);
  const double x_step = TickStep(p.x_max - p.x_min), y_step = TickStep(p.y_max - p.y_min);
  for (double v = std::ceil(p.x_min / x_step) * x_step; v <= p.x_max + 1e-9; v += x_step) {
    const double px = p.PixelX(v);
    cairo_move_to(cr, px, p.y + p.height);
    cairo_line_to(cr, px, p.y + p.height + 5);
    cairo_stroke(cr);
    const std::string label = absl::StrFormat("%g", v);
    cairo_move_to(cr, px - 3.5 * label.size(), p.y + p.height + 18);
    cairo_show_text(cr, label.c_str());
  }
  for (double v = std::ceil(p.y_min / y_step) * y_step; v <= p.y_max + 1e-9; v += y_step) {
    const double py = p.PixelY(v);
    cairo_move_to(cr, p.x - 5, py);
    cairo_line_to(cr, p.x, py);
    cairo_stroke(cr);
    const std::string label = absl::StrFormat("%g", std::abs(v) < 1e-12 ? 0.0 : v);
    cairo_move_to(cr, p.x - 8 - 7 * label.size(), py + 4);
    cairo_show_text(cr, label.c_str());
  }
  cairo_set_font_size(cr, 15);
  cairo_move_to(cr, p.x, p.y - 10);
  cairo_show_text(cr, title.c_str());
  cairo_set_font_size(cr, 12);
  cairo_move_to(cr, p.x + p.width / 2 - 30, p.y + p.height + 36);
  cairo_show_text(cr, x_label.c_str());
}

}  // namespace

absl::StatusOr<MetricsSeries> ReadMetricsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open metrics file '", path, "'"));
  const bool csv = absl::EndsWith(path, ".csv");
  MetricsSeries series;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.empty() || (csv && line == 1 && absl::StartsWith(text, "task,"))) continue;
    std::string task;
    auto point = csv ? ParseCsvRecord(text, &task) : ParseJsonRecord(text, &task);
    if (!point.ok()) return BadRecord(path, line, point.status().message());
    if (series.task.empty()) series.task = task;
    series.points.push_back(*point);
  }
  if (series.points.empty()) return absl::DataLossError(absl::StrCat("metrics file '", path, "' has no records"));
  return series;
}

absl::StatusOr<std::vector<MetricsSeries>> ReadMetricsDir(const std::string& dir) {
  std::error_code error;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".jsonl" || ext == ".csv")) paths.push_back(entry.path().string());
  }
  if (error) return absl::NotFoundError(absl::StrCat("cannot list metrics directory '", dir, "': ", error.message()));
  if (paths.empty()) return absl::NotFoundError(absl::StrCat("no metrics files (*.jsonl, *.csv) in '", dir, "'"));
  std::sort(paths.begin(), paths.end());
  std::vector<MetricsSeries> all;
  for (const auto& path : paths) {
    SHOAL_ASSIGN_OR_RETURN(MetricsSeries series, ReadMetricsFile(path));
    all.push_back(std::move(series));
  }
  return all;
}

absl::Status PlotMetrics(const std::vector<MetricsSeries>& series, const std::string& path) {
  if (series.empty()) return absl::InvalidArgumentError("nothing to plot");
  constexpr int kWidth = 1200, kHeight = 520;
  double step_max = 1, loss_max = 0;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      step_max = std::max<double>(step_max, p.global_step);
      if (std::isfinite(p.loss)) loss_max = std::max(loss_max, p.loss);
    }
  }
  const Panel loss{80, 50, 460, 360, 0, step_max, 0, loss_max > 0 ? loss_max * 1.05 : 1};
  const Panel accuracy{680, 50, 460, 360, 0, step_max, 0, 1};

  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, kWidth, kHeight);
  cairo_t* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  DrawAxes(cr, loss, "training loss", "global step");
  DrawAxes(cr, accuracy, "batch accuracy", "global step");
  for (size_t k = 0; k < series.size(); ++k) {
    const double* colour = kPalette[k % (sizeof(kPalette) / sizeof(kPalette[0]))];
    cairo_set_source_rgb(cr, colour[0], colour[1], colour[2]);
    cairo_set_line_width(cr, 1.5);
    for (const Panel* panel : {&loss, &accuracy}) {
      bool first = true;
      for (const auto& p : series[k].points) {
        const double v = panel == &loss ? p.loss : p.accuracy;
        if (!std::isfinite(v)) continue;
        const double px = panel->PixelX(p.global_step), py = panel->PixelY(std::clamp(v, panel->y_min, panel->y_max));
        if (first) {
          cairo_move_to(cr, px, py);
        } else {
          cairo_line_to(cr, px, py);
        }
        first = false;
      }
      cairo_stroke(cr);
    }
    // The legend, under the panels.
    const double lx = 80 + 260.0 * (k % 4), ly = 475 + 20.0 * (k / 4);
    cairo_rectangle(cr, lx, ly - 9, 18, 10);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, lx + 24, ly);
    cairo_show_text(cr, series[k].task.c_str());
  }
  const cairo_status_t written = cairo_surface_write_to_png(surface, path.c_str());
  cairo_destroy(cr);
  cairo_surface_destroy(surface);
  if (written != CAIRO_STATUS_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", path, "': ", cairo_status_to_string(written)));
  }
  return absl::OkStatus();
}

}  // namespace shoal
