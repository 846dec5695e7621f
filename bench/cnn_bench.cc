// The built-in CNN (configs/cnn.yaml's) trained by one worker through shoal
// (1 ps, 1 worker, in-process, Adam on the ps) against a plain libtorch loop
// over the same model class, batches and optimizer (torch::optim::Adam with
// the same learning rate, no decay on either side), on the same number of
// threads. Runs alternate so that both share the machine's noise; medians.
// The ratio is what shoal's pull, push and bookkeeping cost a CNN step.
//
//   build/bench/cnn_bench [--steps N] [--repeats R]   -> one JSON line
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "bench_run.h"
#include "absl/time/clock.h"
#include "shoal/config/config.h"
#include "shoal/data/dataset.h"
#include "shoal/model/cnn.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/worker_session.h"

namespace shoal {
namespace {

// examples/s of `steps` Adam steps of the CNN in a plain libtorch loop,
// after the warm-up steps the report's steady rate skips too.
double PlainLoopRate(const JobConfig& config, const Dataset& train, int64_t steps) {
  Cnn model(config.model.cnn, config.model.seed, "");
  torch::optim::Adam adam(model.variables(), torch::optim::AdamOptions(config.training.optimizer.learning_rate()));
  BatchIterator batches(train, config.training.batch_size, config.training.seed);
  absl::Time start;
  int64_t examples = 0;
  for (int64_t step = 0; step < steps + kWarmupSteps; ++step) {
    if (step == kWarmupSteps) start = absl::Now();
    torch::Tensor images, labels;
    batches.Next(&images, &labels);
    adam.zero_grad();
    torch::Tensor loss = CrossEntropyLoss(model.Forward(images), labels);
    loss.backward();
    adam.step();
    (void)loss.item<double>();  // shoal reads the loss every step too
    if (step >= kWarmupSteps) examples += labels.size(0);
  }
  return examples / absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  using namespace shoal;
  const auto [steps, repeats] = ParseRunFlags(argc, argv, {400, 3});
  auto loaded = LoadJobConfig(std::string(SHOAL_SOURCE_DIR) + "/configs/cnn.yaml");
  if (!loaded.ok()) {
    absl::FPrintF(stderr, "cnn_bench: %s\n", loaded.status().ToString());
    return 1;
  }
  JobConfig config = *loaded;
  config.cluster.ps = 1;
  config.cluster.workers = 1;
  config.cluster.threads_per_task = 2;  // the plain loop's threads
  config.training.max_steps = steps + kWarmupSteps;
  config.training.optimizer.clear_lr_decay_rate();
  config.training.optimizer.clear_lr_decay_steps();
  config.data.test_examples = 1000;  // evaluation is not timed; keep it short
  auto data = LoadMnistFormat(config.data.dir, "train");
  if (!data.ok()) {
    absl::FPrintF(stderr, "cnn_bench: %s\n", data.status().ToString());
    return 1;
  }
  std::vector<double> shoal_rate, plain_rate;
  for (int64_t r = 0; r < repeats; ++r) {
    auto report = TrainInProcess(config, InProcOptions{}, nullptr);
    if (!report.ok()) {
      absl::FPrintF(stderr, "cnn_bench: %s\n", report.status().ToString());
      return 1;
    }
    shoal_rate.push_back(report->steady_examples_per_second);
    torch::set_num_threads(config.cluster.threads_per_task);
    plain_rate.push_back(PlainLoopRate(config, *data, steps));
  }
  absl::PrintF(
      "{\"benchmark\": \"cnn_one_worker\", \"steps\": %d, \"repeats\": %d, \"batch_size\": %d, \"threads\": %d, "
      "\"shoal_examples_per_second\": %.1f, \"libtorch_examples_per_second\": %.1f, "
      "\"ratio_shoal_vs_libtorch\": %.4f}\n",
      steps, repeats, config.training.batch_size, config.cluster.threads_per_task, Median(shoal_rate),
      Median(plain_rate), Median(shoal_rate) / Median(plain_rate));
  return 0;
}
