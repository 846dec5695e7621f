// Benchmark (b): training examples/s of one worker through shoal (one ps
// task, in-process transport, the real AsyncStrategy: pull, compute, push,
// server-side Adam) against a plain libtorch loop with the same model, batch,
// data and optimizer. Runs alternate to share the machine's noise; medians.
//
//   build/bench/train_bench [--steps N] [--repeats R]   -> one JSON line
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "shoal/session/local_cluster.h"
#include "shoal/transport/grpc/grpc_transport.h"

namespace shoal {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double PlainLibtorch(const JobConfig& config, const Dataset& train, int64_t steps) {
  Mlp model(config.model);
  torch::optim::Adam optimizer(model.variables(), torch::optim::AdamOptions(config.training.optimizer.learning_rate()));
  BatchIterator batches(train, config.training.batch_size, config.training.seed);
  torch::Tensor images, labels;
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < steps; ++step) {
    batches.Next(&images, &labels);
    optimizer.zero_grad();
    CrossEntropyLoss(model.Forward(images), labels).backward();
    optimizer.step();
  }
  return steps * config.training.batch_size / absl::ToDoubleSeconds(absl::Now() - start);
}

int Main(int argc, char** argv) {
  int64_t steps = 1500, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--steps") (void)absl::SimpleAtoi(argv[i + 1], &steps);
    if (flag == "--repeats") (void)absl::SimpleAtoi(argv[i + 1], &repeats);
  }
  JobConfig config = DefaultJobConfig();
  config.cluster.ps = 1;
  config.cluster.workers = 1;
  config.training.max_steps = steps;
  config.training.optimizer.set_lr_decay_rate(0);  // torch::optim::Adam has none
  config.data.test_examples = 1000;
  auto data = LoadData(config);
  if (!data.ok()) {
    absl::FPrintF(stderr, "train_bench: %s\n", data.status().ToString());
    return 1;
  }
  std::vector<double> plain, shoal;
  for (int64_t r = 0; r < repeats; ++r) {
    plain.push_back(PlainLibtorch(config, data->train, steps));
    auto report = TrainInProcess(config, InProcOptions{}, nullptr);
    if (!report.ok()) {
      absl::FPrintF(stderr, "train_bench: %s\n", report.status().ToString());
      return 1;
    }
    shoal.push_back(report->examples_per_second);
  }
  absl::PrintF(
      "{\"benchmark\": \"train_one_worker\", \"steps\": %d, \"batch_size\": %d, \"repeats\": %d, "
      "\"libtorch_examples_per_second\": %.1f, \"shoal_inproc_examples_per_second\": %.1f, "
      "\"ratio_shoal_vs_libtorch\": %.4f}\n",
      steps, config.training.batch_size, repeats, Median(plain), Median(shoal), Median(shoal) / Median(plain));
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) { return shoal::Main(argc, argv); }
