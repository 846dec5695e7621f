// The default MLP as a TorchScript file against the built-in MLP: the main
// job (2 ps, 2 workers, in-process, async) trained once with each, with the
// same initial values, data, batches and optimizer; runs alternate so that
// both share the machine's noise; medians. The scripted module computes
// exactly what the built-in one does (addmm, then ReLU), so the ratio is what
// running the model through TorchScript's interpreter costs.
//
//   build/bench/torchscript_bench [--steps N] [--repeats R]   -> one JSON line
#include <torch/script.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_run.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/worker_session.h"

namespace shoal {
namespace {

// The built-in MLP of `config`, scripted with its own initial values:
// dense_k.kernel [in, out] and dense_k.bias, ReLU between layers.
void SaveScriptedCopy(const MlpConfig& config, const std::string& path) {
  Mlp built(config);
  torch::jit::Module net("Net");
  std::string forward = "def forward(self, x):\n    h = x.flatten(1)\n";
  const size_t layers = built.variables().size() / 2;
  for (size_t k = 0; k < layers; ++k) {
    const std::string name = absl::StrCat("dense_", k + 1);
    torch::jit::Module dense("Dense");
    dense.register_parameter("kernel", built.variables()[2 * k].detach().clone(), false);
    dense.register_parameter("bias", built.variables()[2 * k + 1].detach().clone(), false);
    dense.define("def forward(self, x):\n    return torch.addmm(self.bias, x, self.kernel)\n");
    net.register_module(name, dense);
    absl::StrAppend(&forward, "    h = self.", name, ".forward(h)\n");
    if (k + 1 < layers) absl::StrAppend(&forward, "    h = torch.relu(h)\n");
  }
  absl::StrAppend(&forward, "    return h\n");
  net.define(forward);
  net.save(path);
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  using namespace shoal;
  const auto [steps, repeats] = ParseRunFlags(argc, argv, {3000, 3});
  JobConfig builtin = DefaultJobConfig();  // 2 ps, 2 workers, in-process
  builtin.training.max_steps = steps;
  const std::string path = (std::filesystem::temp_directory_path() / "shoal_bench_mlp.pt").string();
  SaveScriptedCopy(builtin.model, path);
  JobConfig scripted = builtin;
  scripted.model.kind = "torchscript";
  scripted.model.path = path;
  std::vector<double> builtin_rate, scripted_rate, builtin_accuracy, scripted_accuracy;
  for (int64_t r = 0; r < repeats; ++r) {
    for (auto [config, rate, accuracy] : {std::tuple{&builtin, &builtin_rate, &builtin_accuracy},
                                          std::tuple{&scripted, &scripted_rate, &scripted_accuracy}}) {
      auto report = TrainInProcess(*config, InProcOptions{}, nullptr);
      if (!report.ok()) {
        absl::FPrintF(stderr, "torchscript_bench: %s\n", report.status().ToString());
        return 1;
      }
      rate->push_back(report->steady_examples_per_second);
      accuracy->push_back(report->test_accuracy);
    }
  }
  std::filesystem::remove(path);
  absl::PrintF(
      "{\"benchmark\": \"torchscript\", \"steps\": %d, \"repeats\": %d, \"batch_size\": %d, "
      "\"builtin_examples_per_second\": %.1f, \"torchscript_examples_per_second\": %.1f, "
      "\"ratio_torchscript_vs_builtin\": %.4f, \"builtin_test_accuracy\": %.4f, "
      "\"torchscript_test_accuracy\": %.4f, \"accuracy_points_difference\": %.2f}\n",
      steps, repeats, builtin.training.batch_size, Median(builtin_rate), Median(scripted_rate),
      Median(scripted_rate) / Median(builtin_rate), Median(builtin_accuracy), Median(scripted_accuracy),
      100 * (Median(scripted_accuracy) - Median(builtin_accuracy)));
  return 0;
}
