// Benchmark (b) and the compute ceiling.
//
// (b): training examples/s of one worker through shoal (one ps task,
// in-process transport, the real AsyncStrategy: pull, compute, push,
// server-side Adam) against a plain libtorch loop with the same model, batch,
// data, optimizer and threads. Runs alternate to share the machine's noise;
// medians.
//
// The ceiling: the single-core GEMM rate of this machine, measured in the
// same run, times its cores, over the model's FLOPs per training example,
// is the examples/s its cores could reach if every cycle went to the
// model's matrix products. The main job (2 ps, 2 workers in one process) and
// both sides of (b) are reported as fractions of it; bench/report.py does
// the same for (c) and (d). A second ceiling times the model's own products
// (batch 64 through 784-256-128-10), which run well below the peak rate.
//
// Watching: the main job again with TensorBoard files, Prometheus's
// endpoint and the trace all on (docs/watching.md), alternated with the
// plain main job, as a ratio; and the nanoseconds of one phase timer, the
// one piece of watching that runs when all are off (the job's summary).
//
// Leased data: the main job again with data.leases (every step's places
// ride with its update, a lease a shard), alternated with the plain main
// job, as a ratio (ratio_leased_vs_owned).
//
//   build/bench/train_bench [--steps N] [--repeats R]   -> one JSON line
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/strings/str_format.h"
#include "bench_run.h"
#include "shoal/compute/compute_threads.h"
#include "shoal/server/optimizer.h"
#include "shoal/session/local_cluster.h"
#include "shoal/telemetry/phase.h"
#include "shoal/transport/grpc/grpc_transport.h"

namespace shoal {
namespace {

// Single-thread float32 GEMM rate, GFLOP/s: the best of several
// [64, 2048] x [2048, 2048] products (a batch through a wide layer).
double SingleCoreGemmGflops() {
  SetComputeThreads(1);
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::randn({64, 2048}), b = torch::randn({2048, 2048});
  torch::Tensor c = torch::mm(a, b);
  double best = 1e30;
  for (int i = 0; i < 30; ++i) {
    const auto start = std::chrono::steady_clock::now();
    c = torch::mm(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * 64 * 2048 * 2048 / best / 1e9;
}

// Single-thread GEMM rate, GFLOP/s, at the model's own shapes: one batch's
// forward products, weight gradients and input gradients (but the first
// layer's), timed alone, best of several. Products this small run well below
// the peak, so this ceiling is the one a step's matrix work could reach.
double ModelShapeGemmGflops(const std::vector<int64_t>& layers, int64_t batch, double flops_per_example) {
  SetComputeThreads(1);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> weights, activations, output_grads;
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    weights.push_back(torch::randn({layers[i + 1], layers[i]}));
    activations.push_back(torch::randn({batch, layers[i]}));
    output_grads.push_back(torch::randn({batch, layers[i + 1]}));
  }
  auto one_step = [&] {
    for (size_t i = 0; i < weights.size(); ++i) {
      torch::Tensor out = torch::mm(activations[i], weights[i].t());           // forward
      torch::Tensor weight_grad = torch::mm(output_grads[i].t(), activations[i]);  // weight gradient
      if (i > 0) torch::Tensor input_grad = torch::mm(output_grads[i], weights[i]);  // input gradient
    }
  };
  one_step();
  double best = 1e30;
  for (int r = 0; r < 20; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < 10; ++k) one_step();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 10);
  }
  return flops_per_example * batch / best / 1e9;
}

// Matrix-product FLOPs of one training example through the dense layers:
// forward (2 * in * out per layer), the weight gradients (as many), and the
// input gradients of every layer but the first (the data needs none).
double TrainingFlopsPerExample(const std::vector<int64_t>& layers) {
  double forward = 0, input_gradients = 0;
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    const double product = 2.0 * layers[i] * layers[i + 1];
    forward += product;
    if (i > 0) input_gradients += product;
  }
  return 2 * forward + input_gradients;
}

// The plain loop's update: torch::optim::Adam (what a libtorch user writes),
// or shoal's own server-side Adam applied in place, which isolates what
// shoal's pull, push and checks cost beside its faster update.
enum class PlainUpdate { kTorchAdam, kShoalAdam };

double PlainLibtorch(const JobConfig& config, const Dataset& train, int64_t steps, PlainUpdate update) {
  Mlp model(config.model);
  torch::optim::Adam optimizer(model.variables(), torch::optim::AdamOptions(config.training.optimizer.learning_rate()));
  auto shoal_adam = Optimizer::Create(config.training.optimizer);
  if (!shoal_adam.ok()) return 0;
  std::vector<OptimizerSlots> slots;
  for (const auto& p : model.variables()) slots.push_back((*shoal_adam)->MakeSlots(p));
  BatchIterator batches(train, config.training.batch_size, config.training.seed);
  torch::Tensor images, labels;
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < steps; ++step) {
    batches.Next(&images, &labels);
    optimizer.zero_grad();
    CrossEntropyLoss(model.Forward(images), labels).backward();
    if (update == PlainUpdate::kTorchAdam) {
      optimizer.step();
      continue;
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < slots.size(); ++i) {
      torch::Tensor value = model.variables()[i];
      (*shoal_adam)->Apply(value, model.variables()[i].grad(), slots[i]);
    }
  }
  return steps * config.training.batch_size / absl::ToDoubleSeconds(absl::Now() - start);
}

// Microseconds of one Adam update of every variable of the model (best of
// many): torch::optim::Adam against shoal's server-side Adam.
std::pair<double, double> AdamUpdateMicros(const JobConfig& config) {
  Mlp model(config.model);
  for (const auto& p : model.variables()) p.mutable_grad() = torch::randn_like(p);
  torch::optim::Adam torch_adam(model.variables(), torch::optim::AdamOptions(1e-3));
  auto shoal_adam = Optimizer::Create(config.training.optimizer);
  std::vector<OptimizerSlots> slots;
  for (const auto& p : model.variables()) slots.push_back((*shoal_adam)->MakeSlots(p));
  auto best_of = [](const std::function<void()>& update) {
    double best = 1e30;
    for (int r = 0; r < 200; ++r) {
      const auto start = std::chrono::steady_clock::now();
      update();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best * 1e6;
  };
  torch::NoGradGuard no_grad;
  const double torch_us = best_of([&] { torch_adam.step(); });
  const double shoal_us = best_of([&] {
    for (size_t i = 0; i < slots.size(); ++i) {
      torch::Tensor value = model.variables()[i];
      (*shoal_adam)->Apply(value, model.variables()[i].grad(), slots[i]);
    }
  });
  return {torch_us, shoal_us};
}

// Nanoseconds one PhaseScope costs (best of several runs of many): with no
// recorder on the thread, and with one that sums (all watching off).
std::pair<double, double> PhaseScopeNanos() {
  auto best_of = [](int n) {
    double best = 1e30;
    for (int r = 0; r < 20; ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) PhaseScope timed(Phase::kCompute);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best / n * 1e9;
  };
  const double without = best_of(100000);
  PhaseRecorder recorder(nullptr, 0, nullptr);
  PhaseRecorder::Installed installed(&recorder);
  return {without, best_of(100000)};
}

int Main(int argc, char** argv) {
  const auto [steps, repeats] = ParseRunFlags(argc, argv, {1500, 3});
  JobConfig one_worker = DefaultJobConfig();
  one_worker.cluster.ps = 1;
  one_worker.cluster.workers = 1;
  one_worker.training.max_steps = steps;
  one_worker.training.optimizer.set_lr_decay_rate(0);  // torch::optim::Adam has none
  one_worker.data.test_examples = 1000;
  JobConfig main_job = DefaultJobConfig();  // 2 ps, 2 workers, in-process
  main_job.training.max_steps = 2 * steps;
  main_job.data.test_examples = 1000;
  main_job.hooks.run_dir = "";
  JobConfig watched_job = main_job;  // TensorBoard, Prometheus and the trace on
  const std::string watch_dir = absl::StrFormat("/tmp/shoal_train_bench_%d", getpid());
  watched_job.hooks.logdir = watch_dir + "/tb";
  watched_job.hooks.trace = watch_dir + "_trace.json";
  auto port = FreeLoopbackPorts(1);
  if (!port.ok()) {
    absl::FPrintF(stderr, "train_bench: %s\n", port.status().ToString());
    return 1;
  }
  watched_job.hooks.metrics_port = (*port)[0];
  JobConfig leased_job = main_job;  // the same job on leased data (elastic workers, exactly once)
  leased_job.data.leases = true;
  auto data = LoadData(one_worker);
  if (!data.ok()) {
    absl::FPrintF(stderr, "train_bench: %s\n", data.status().ToString());
    return 1;
  }
  const int cores = UsableCores();
  const double flops = TrainingFlopsPerExample(one_worker.model.layers);
  std::vector<double> gemm, model_gemm, plain, plain_shoal_adam, shoal, two_workers, two_workers_watched,
      two_workers_leased;
  for (int64_t r = 0; r < repeats; ++r) {
    gemm.push_back(SingleCoreGemmGflops());
    model_gemm.push_back(ModelShapeGemmGflops(one_worker.model.layers, one_worker.training.batch_size, flops));
    // The plain loop computes with what shoal gives its one worker: every core.
    SetComputeThreads(cores);
    plain.push_back(PlainLibtorch(one_worker, data->train, steps, PlainUpdate::kTorchAdam));
    plain_shoal_adam.push_back(PlainLibtorch(one_worker, data->train, steps, PlainUpdate::kShoalAdam));
    for (auto [config, into] : {std::pair{&one_worker, &shoal}, std::pair{&main_job, &two_workers},
                                std::pair{&watched_job, &two_workers_watched},
                                std::pair{&leased_job, &two_workers_leased}}) {
      auto report = TrainInProcess(*config, InProcOptions{}, nullptr);
      if (!report.ok()) {
        absl::FPrintF(stderr, "train_bench: %s\n", report.status().ToString());
        return 1;
      }
      into->push_back(config == &one_worker ? report->examples_per_second : report->steady_examples_per_second);
    }
  }
  std::filesystem::remove_all(watch_dir);
  std::filesystem::remove(watched_job.hooks.trace);
  const auto [scope_ns_unwatched, scope_ns_summed] = PhaseScopeNanos();
  SetComputeThreads(1);
  const auto [torch_adam_us, shoal_adam_us] = AdamUpdateMicros(one_worker);
  const double ceiling = Median(gemm) * 1e9 * cores / flops;
  const double model_ceiling = Median(model_gemm) * 1e9 * cores / flops;
  absl::PrintF(
      "{\"benchmark\": \"train\", \"steps\": %d, \"batch_size\": %d, \"repeats\": %d, \"cores\": %d, "
      "\"blas\": \"%s\", \"single_core_gemm_gflops\": %.2f, \"flops_per_example\": %.0f, "
      "\"ceiling_examples_per_second\": %.1f, "
      "\"libtorch_examples_per_second\": %.1f, \"shoal_inproc_examples_per_second\": %.1f, "
      "\"ratio_shoal_vs_libtorch\": %.4f, \"libtorch_vs_ceiling\": %.4f, \"shoal_one_worker_vs_ceiling\": %.4f, "
      "\"main_job_2_workers_examples_per_second\": %.1f, \"main_job_vs_ceiling\": %.4f, "
      "\"model_shape_gemm_gflops\": %.2f, \"model_shape_ceiling_examples_per_second\": %.1f, "
      "\"main_job_vs_model_shape_ceiling\": %.4f, \"libtorch_vs_model_shape_ceiling\": %.4f, "
      "\"libtorch_shoal_adam_examples_per_second\": %.1f, \"ratio_shoal_vs_libtorch_shoal_adam\": %.4f, "
      "\"torch_adam_update_us\": %.1f, \"shoal_adam_update_us\": %.1f, "
      "\"main_job_watched_examples_per_second\": %.1f, \"ratio_watched_vs_unwatched\": %.4f, "
      "\"phase_scope_ns_no_recorder\": %.1f, \"phase_scope_ns_summing\": %.1f, "
      "\"main_job_leased_examples_per_second\": %.1f, \"ratio_leased_vs_owned\": %.4f}\n",
      steps, one_worker.training.batch_size, repeats, cores, IdentifyBlas().name, Median(gemm), flops, ceiling,
      Median(plain), Median(shoal), Median(shoal) / Median(plain), Median(plain) / ceiling, Median(shoal) / ceiling,
      Median(two_workers), Median(two_workers) / ceiling, Median(model_gemm), model_ceiling,
      Median(two_workers) / model_ceiling, Median(plain) / model_ceiling, Median(plain_shoal_adam),
      Median(shoal) / Median(plain_shoal_adam), torch_adam_us, shoal_adam_us, Median(two_workers_watched),
      Median(two_workers_watched) / Median(two_workers), scope_ns_unwatched, scope_ns_summed,
      Median(two_workers_leased), Median(two_workers_leased) / Median(two_workers));
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  shoal::KeepLargeAllocationsMapped();  // as the shoal binary does: no page faults on every large tensor
  return shoal::Main(argc, argv);
}
