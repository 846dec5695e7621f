// A Criteo-format click log with a planted model, for the tests that train
// click models.
#ifndef SHOAL_TESTS_PLANTED_CLICKS_H_
#define SHOAL_TESTS_PLANTED_CLICKS_H_

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/model/click_metrics.h"

namespace shoal {

// A Criteo-format log whose labels come from a planted logistic model:
// each categorical feature's ids (Zipf-like over 40 values) and each
// integer feature carry a hidden weight. Returns the planted model's AUC.
inline double WritePlantedClicks(const std::string& path, int examples, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::mt19937_64 weights_rng(17);  // the same hidden model for the training and the test log
  std::normal_distribution<double> normal(0, 0.7);
  std::vector<std::vector<double>> id_weight(26, std::vector<double>(40));
  for (auto& feature : id_weight) {
    for (double& w : feature) w = normal(weights_rng);
  }
  std::vector<double> coefficient(13);
  for (double& c : coefficient) c = normal(weights_rng) * 0.3;
  std::vector<double> zipf(40);
  for (int r = 0; r < 40; ++r) zipf[r] = 1.0 / (r + 1);
  std::discrete_distribution<int> rank(zipf.begin(), zipf.end());
  std::poisson_distribution<int> count(4);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::ofstream out(path);
  std::vector<float> probabilities, labels;
  for (int i = 0; i < examples; ++i) {
    double logit = -1.2;
    std::string line;
    std::string integers, categorical;
    for (int f = 0; f < 13; ++f) {
      const int x = count(rng);
      logit += coefficient[f] * std::log1p(x) / 2;
      absl::StrAppend(&integers, "\t", x);
    }
    for (int f = 0; f < 26; ++f) {
      const int r = rank(rng);
      logit += id_weight[f][r] / std::sqrt(26.0) * 2;
      absl::StrAppend(&categorical, "\t", absl::StrFormat("%08x", 0x1000 * (f + 1) + r));
    }
    const double p = 1 / (1 + std::exp(-logit));
    const bool click = uniform(rng) < p;
    probabilities.push_back(static_cast<float>(p));
    labels.push_back(click ? 1.0f : 0.0f);
    out << (click ? "1" : "0") << integers << categorical << "\n";
  }
  return ComputeClickMetrics(torch::tensor(probabilities), torch::tensor(labels)).value().auc;
}

}  // namespace shoal

#endif  // SHOAL_TESTS_PLANTED_CLICKS_H_
