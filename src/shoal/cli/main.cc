// shoal: the command line.
//
//   shoal train   [--config FILE] [--set KEY=VALUE ...] [--processes] [--ps N] [--workers N] ...
//   shoal server  --cluster FILE --task ps:0 [--config FILE]     (or TF_CONFIG)
//   shoal worker  --cluster FILE --task worker:1 [--config FILE] (or TF_CONFIG, WORKER_ID, --slurm)
//
// This is the only place that reads the environment: flags, TF_CONFIG,
// WORKER_ID and SLURM's variables become a JobConfig, a ClusterSpec and a
// TaskId for the library.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "shoal/cluster/slurm.h"
#include "shoal/config/config_reference.h"
#include "shoal/core/nearest_word.h"
#include "shoal/core/status.h"
#include "shoal/report/metrics_plot.h"
#include "shoal/hooks/standard_hooks.h"
#include "shoal/session/local_cluster.h"
#include "shoal/strategy/training_mode.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/export/export.h"
#include "shoal/export/model_files.h"
#include "shoal/session/run_folder.h"
#include "shoal/session/task_runner.h"
#include "shoal/transport/grpc/grpc_transport.h"

namespace shoal {
namespace {

constexpr char kUsage[] = R"(shoal: parameter-server training in C++

usage:
  shoal train  [--config FILE] [--mode MODE] [--processes] [--ps N] [--workers N]
               [--epochs N] [--batch_size N] [--max_steps N] [--data_dir DIR]
               [--metrics_dir DIR] [--checkpoint_dir DIR] [--max_restarts N]
               [--logdir DIR] [--metrics_port P] [--trace FILE [--trace_steps A:B|N]]
               [--threads_per_task N] [--transport auto|grpc|ucx]
               [--set KEY=VALUE ...] [--result_file FILE] [--quiet] [--print_config]
      Runs a job on a local cluster (default: 2 ps, 2 workers, async, the
      784-256-128-10 MLP on Fashion-MNIST for 5 epochs). --processes runs each
      task as its own process, tensors over UCX's shared memory (--transport
      grpc: everything over gRPC on loopback). MODE: async, sync,
      ssp, downpour, model_average, easgd, population, gated. With
      --checkpoint_dir the chief saves checkpoints there and resumes from the
      newest when the job starts again. --set (repeatable) sets any config
      key over the file's, as if the file said so, the value read as YAML:
      --set training.optimizer.learning_rate=0.01 --set model.layers=[784,64,10];
      the named flags above are applied after it. server, worker, evaluator
      and resolve take --set too. --print_config prints the config that all
      of these make, as YAML that --config reads, and exits. Watching a run:
      --logdir writes TensorBoard event files (the chief's evaluations in
      DIR, each worker's steps in DIR/worker_<i>); --metrics_port serves
      Prometheus's /metrics (on loopback; --processes: task k on P+k);
      --trace writes a Chrome trace of each worker's last 100 steps (or
      --trace_steps) for ui.perfetto.dev.
  shoal server --task ps:0 [--cluster FILE] [--config FILE] [--bind ADDR]
      Serves one task of a real cluster until the chief shuts it down.
  shoal worker --task worker:1 [--cluster FILE] [--config FILE] [--bind ADDR]
               [--result_file FILE] [--quiet]
      Trains as one worker of a real cluster.
  shoal evaluator --task evaluator:0 [--cluster FILE] [--config FILE]
      Evaluates each new checkpoint under checkpoint.dir on the test set,
      writing evaluator_0.jsonl to hooks.metrics_dir, until the chief ends
      the job. (An evaluator task in TF_CONFIG does so under any command.)
  shoal plot   --metrics_dir DIR [--out FILE.png]
      Draws the loss and batch-accuracy curves of every task's metrics file
      (hooks.metrics_dir) into one PNG.
  shoal export --checkpoint DIR [--step N] [--member K] --out model.pt
               [--tables_dir DIR] [--config FILE] [--set KEY=VALUE ...]
      Writes a checkpoint's trained model as TorchScript, which
      torch.jit.load (Python) and torch::jit::load (C++) run without shoal:
      the config's model (a population's fittest member, or --member K; a
      gated ensemble whole, giving the weighted vote; a click model's dense
      part). A click model's tables go to --tables_dir (default: tables/
      beside --out) as NumPy ids and rows per shard, with manifest.json.
      Give the config the job trained with.
  shoal config --reference
      Prints the configuration reference (every key, its default and what
      it does, as Markdown; docs/reference/configuration.md is this output).
  shoal checkpoint list DIR | inspect PATH | verify PATH
      Lists the checkpoints under DIR; shows what a checkpoint (a ckpt-<step>
      folder, or DIR for its newest) holds; reads every tensor of it and
      checks its CRC32C (a corrupt byte is DATA_LOSS naming file and variable).
  shoal resolve [--cluster FILE --task T | --slurm JOBS] [--config FILE] [--bind ADDR]
      Prints the task this process would run, its role and address, and the
      cluster (from the same flags and environment as server and worker),
      then exits.
  Without --cluster/--task, server and worker read TF_CONFIG
  ({"cluster": {...}, "task": {"type": "worker", "index": 1}}); WORKER_ID
  overrides a worker's index. Jobs: chief (or master), ps, worker,
  evaluator; a job may list only some tasks ({"1": "host:port"}).
  Under SLURM, `srun shoal worker --slurm ps:2,worker:8 [--port_base 8888]`
  maps the step's ranks to jobs in that order (SLURM_PROCID,
  SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE);
  each task listens on port_base plus its place on its node, and a ps
  task serves while the others train.
)";

// `shoal COMMAND --help`: the command's part of kUsage (and, for the
// commands that run a cluster's task, how a task learns who it is); empty
// for a command kUsage does not name.
std::string CommandUsage(const std::string& command) {
  const std::string usage = kUsage;
  const size_t start = usage.find("\n  shoal " + command + " ");
  if (start == std::string::npos) return "";
  const size_t notes = usage.find("\n  Without --cluster");
  const size_t end = std::min(usage.find("\n  shoal ", start + 1), notes);
  std::string text = "usage:" + usage.substr(start, end - start) + "\n";
  if (command == "server" || command == "worker" || command == "evaluator" || command == "resolve") {
    text += usage.substr(notes + 1);
  }
  return text;
}

// The first SIGINT or SIGTERM (what Kubernetes sends a pod it deletes) stops
// the job after the step in progress, with a final checkpoint and a report;
// a second SIGINT exits at once.
std::atomic<int> g_signal{0};
void OnSignal(int signal) {
  if (g_signal.load() != 0 && signal == SIGINT) _exit(128 + SIGINT);
  g_signal.store(signal);
  static const char kNote[] = "shoal: stopping after the current step (Ctrl-C again to exit now)\n";
  (void)!write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
}

struct Flags {
  std::map<std::string, std::string> values;
  std::set<std::string> used;
  std::vector<std::string> config_overrides;  // every --set KEY=VALUE, in order

  bool Has(const std::string& key) {
    used.insert(key);
    return values.count(key) > 0;
  }
  std::string Get(const std::string& key, const std::string& fallback = "") {
    used.insert(key);
    auto it = values.find(key);
    return it == values.end() ? fallback : it->second;
  }
  absl::Status GetInt(const std::string& key, int64_t* out) {
    if (!Has(key)) return absl::OkStatus();
    if (!absl::SimpleAtoi(values[key], out)) {
      return absl::InvalidArgumentError(absl::StrCat("--", key, " needs an integer, got '", values[key], "'"));
    }
    return absl::OkStatus();
  }
  absl::Status CheckAllUsed() const {
    for (const auto& [key, value] : values) {
      if (!used.count(key)) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key, DidYouMean(key, used, "--")));
      }
    }
    return absl::OkStatus();
  }
};

const std::set<std::string>& BooleanFlags() {
  static const auto* flags = new std::set<std::string>{"processes", "quiet", "help", "print_config", "reference"};
  return *flags;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv, int first) {
  Flags flags;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    arg = arg.substr(2);
    if (arg == "set" || arg.rfind("set=", 0) == 0) {  // repeatable, unlike the others
      if (arg == "set" && i + 1 == argc) return absl::InvalidArgumentError("--set needs KEY=VALUE");
      flags.config_overrides.push_back(arg == "set" ? argv[++i] : arg.substr(4));
      continue;
    }
    if (auto eq = arg.find('='); eq != std::string::npos) {
      flags.values[arg.substr(0, eq)] = arg.substr(eq + 1);
    } else if (BooleanFlags().count(arg)) {
      flags.values[arg] = "true";
    } else if (i + 1 < argc) {
      flags.values[arg] = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", arg, " needs a value"));
    }
  }
  return flags;
}

absl::StatusOr<JobConfig> ConfigFromFlags(Flags& flags) {
  // --mode is training.mode set last, so that the config's optimizer
  // settings go over the mode's default optimizer as in a file.
  std::vector<std::string> overrides = flags.config_overrides;
  if (flags.Has("mode")) overrides.push_back("training.mode=" + flags.Get("mode"));
  SHOAL_ASSIGN_OR_RETURN(JobConfig config, flags.Has("config") ? LoadJobConfig(flags.Get("config"), overrides)
                                                                 : ParseJobConfig("", overrides));
  int64_t value = 0;
  auto override_int = [&](const char* key, auto* field) -> absl::Status {
    if (!flags.Has(key)) return absl::OkStatus();
    SHOAL_RETURN_IF_ERROR(flags.GetInt(key, &value));
    using Field = std::remove_pointer_t<decltype(field)>;
    if (value < std::numeric_limits<Field>::min() || value > std::numeric_limits<Field>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("--", key, " ", value, " is out of range (at most ",
                                                     std::numeric_limits<Field>::max(), ")"));
    }
    *field = static_cast<Field>(value);
    return absl::OkStatus();
  };
  if (flags.Has("metrics_dir")) config.hooks.metrics_dir = flags.Get("metrics_dir");
  if (flags.Has("logdir")) config.hooks.logdir = flags.Get("logdir");
  if (flags.Has("trace")) config.hooks.trace = flags.Get("trace");
  if (flags.Has("trace_steps")) config.hooks.trace_steps = flags.Get("trace_steps");
  if (flags.Has("checkpoint_dir")) config.checkpoint.dir = flags.Get("checkpoint_dir");
  // A token in the environment wins over the config's token file; it stays
  // out of every file the launcher writes (its children inherit it).
  if (const char* token = std::getenv("SHOAL_TOKEN"); token != nullptr && *token != '\0') config.security.token = token;
  SHOAL_RETURN_IF_ERROR(override_int("ps", &config.cluster.ps));
  SHOAL_RETURN_IF_ERROR(override_int("workers", &config.cluster.workers));
  SHOAL_RETURN_IF_ERROR(override_int("max_restarts", &config.cluster.max_restarts));
  SHOAL_RETURN_IF_ERROR(override_int("metrics_port", &config.hooks.metrics_port));
  SHOAL_RETURN_IF_ERROR(override_int("threads_per_task", &config.cluster.threads_per_task));
  SHOAL_RETURN_IF_ERROR(override_int("epochs", &config.training.epochs));
  SHOAL_RETURN_IF_ERROR(override_int("batch_size", &config.training.batch_size));
  SHOAL_RETURN_IF_ERROR(override_int("max_steps", &config.training.max_steps));
  SHOAL_RETURN_IF_ERROR(override_int("train_examples", &config.data.train_examples));
  if (flags.Has("processes")) config.cluster.processes = flags.Get("processes") != "false";
  if (flags.Has("data_dir")) config.data.dir = flags.Get("data_dir");
  if (flags.Has("transport")) config.transport.kind = flags.Get("transport");
  SHOAL_RETURN_IF_ERROR(ValidateJobConfig(config));
  return config;
}

// The cluster and this task, from flags or TF_CONFIG (and WORKER_ID).
absl::Status ClusterAndTask(Flags& flags, const JobConfig& config, ClusterSpec* cluster, TaskId* task) {
  std::string cluster_file = flags.Get("cluster", config.cluster.cluster_file);
  const char* tf_config = std::getenv("TF_CONFIG");
  if (flags.Has("slurm")) {
    int port_base = 8888;
    if (flags.Has("port_base") && (!absl::SimpleAtoi(flags.Get("port_base"), &port_base) || port_base < 1 ||
                                   port_base > 65535)) {
      return absl::InvalidArgumentError(absl::StrCat("--port_base '", flags.Get("port_base"), "' is not a port"));
    }
    auto env = [](const char* name) {
      const char* value = std::getenv(name);
      return std::string(value ? value : "");
    };
    const SlurmEnvironment slurm{env("SLURM_PROCID"), env("SLURM_STEP_NUM_TASKS"), env("SLURM_STEP_NODELIST"),
                                 env("SLURM_STEP_TASKS_PER_NODE")};
    SHOAL_ASSIGN_OR_RETURN(SlurmTask resolved, ResolveSlurmCluster(slurm, flags.Get("slurm"), port_base));
    *cluster = resolved.cluster;
    *task = resolved.task;
    return absl::OkStatus();
  }
  if (!cluster_file.empty()) {
    SHOAL_ASSIGN_OR_RETURN(*cluster, ClusterSpec::FromJsonFile(cluster_file));
    if (!flags.Has("task")) return absl::InvalidArgumentError("--task is required with --cluster (e.g. --task worker:1)");
    SHOAL_ASSIGN_OR_RETURN(*task, ParseTaskId(flags.Get("task")));
  } else if (tf_config != nullptr) {
    SHOAL_ASSIGN_OR_RETURN(TfConfig parsed, ParseTfConfig(tf_config));
    *cluster = parsed.cluster;
    *task = parsed.task;
    if (flags.Has("task")) {
      SHOAL_ASSIGN_OR_RETURN(*task, ParseTaskId(flags.Get("task")));
    }
  } else {
    return absl::InvalidArgumentError("no cluster: pass --cluster FILE --task JOB:INDEX, or set TF_CONFIG");
  }
  if (const char* worker_id = std::getenv("WORKER_ID"); worker_id != nullptr && task->job == "worker") {
    if (!absl::SimpleAtoi(worker_id, &task->index)) {
      return absl::InvalidArgumentError(absl::StrCat("WORKER_ID='", worker_id, "' is not an integer"));
    }
  }
  // An evaluator may be left out of the cluster, as the training operator
  // leaves it (ParseTfConfig).
  const bool unlisted_evaluator = task->job == "evaluator" && cluster->NumTasks("evaluator") == 0;
  // On leased data a worker past the listed ones joins the running job.
  const bool joining_worker = task->job == "worker" && config.data.leases;
  if (!cluster->HasTask(*task) && !unlisted_evaluator && !joining_worker) {
    return absl::InvalidArgumentError(absl::StrCat(task->ToString(), " is out of range: job '", task->job, "' has ",
                                                   cluster->NumTasks(task->job), " tasks",
                                                   task->job == "worker" ? " (with data.leases it would join the job)"
                                                                         : ""));
  }
  return absl::OkStatus();
}

void PrintReport(const TrainReport& report, bool clicks) {
  if (clicks) {
    absl::PrintF("trained %d steps in %.1f s (%.0f examples/s); test AUC %.4f, log loss %.4f\n", report.global_step,
                 report.seconds, report.examples_per_second, report.test_auc, report.test_loss);
    if (report.row_cache_hit_rate > 0) {
      absl::PrintF("row cache: %.1f%% of the distinct ids served without a pull\n", 100 * report.row_cache_hit_rate);
    }
    if (report.table_ids_refused > 0 || report.table_rows_evicted > 0) {
      absl::PrintF("tables: %d rows held; %d new ids turned away by full shards, %d rows evicted to make room\n",
                   report.table_rows_held, report.table_ids_refused, report.table_rows_evicted);
    }
  } else {
    absl::PrintF("trained %d steps in %.1f s (%.0f examples/s); test accuracy %.2f%%, test loss %.4f\n",
                 report.global_step, report.seconds, report.examples_per_second, 100 * report.test_accuracy,
                 report.test_loss);
  }
  if (report.compute_threads > 0) {
    absl::PrintF("compute: %d BLAS thread(s) per worker (%s), %d libtorch intra-op; BLAS %s\n",
                 report.compute_threads, report.compute_threads_source, report.intra_op_threads, report.blas);
  }
  if (const std::string time = TimeSummary(report); !time.empty()) absl::PrintF("%s\n", time);
  if (report.stale_gradients_dropped > 0) {
    absl::PrintF("stale gradients dropped (late backup workers): %d\n", report.stale_gradients_dropped);
  }
  if (!report.ssp_gap_histogram.empty()) {
    absl::PrintF("steps by clock gap to the slowest worker: [%s]\n", absl::StrJoin(report.ssp_gap_histogram, ", "));
  }
  if (report.epochs_trained > 0) {
    absl::PrintF("workers sent %.1f MB and received %.1f MB per epoch\n", report.bytes_sent / 1e6 / report.epochs_trained,
                 report.bytes_received / 1e6 / report.epochs_trained);
  }
  if (!report.stop_reason.empty()) absl::PrintF("stopped early: %s\n", report.stop_reason);
  if (!report.run_dir.empty()) {
    absl::PrintF("trained model: %s\n", report.model_file.empty()
                                            ? absl::StrCat(report.run_dir, "/weights.pt (no model.pt: ",
                                                           report.no_model_file, ")")
                                            : report.model_file);
  }
  for (const std::string& restart : report.restarts) absl::PrintF("restart: %s\n", restart);
  for (const std::string& recovery : report.recoveries) absl::PrintF("recovery: %s\n", recovery);
  if (report.restores > 0) absl::PrintF("checkpoints restored onto the job: %d\n", report.restores);
  if (report.checkpoints_saved > 0 && report.checkpoints_in_background) {
    absl::PrintF("checkpoints: %d saved before the end in the background, in %.1f s; the chief's training waited "
                 "%.1f s for them\n",
                 report.checkpoints_saved, report.checkpoint_save_seconds, report.checkpoint_seconds);
  } else if (report.checkpoints_saved > 0) {
    absl::PrintF("checkpoints: %d saved before the end, in %.1f s of the chief's time (it trains nothing while one "
                 "is written)\n",
                 report.checkpoints_saved, report.checkpoint_seconds);
  }
  if (const DataLedgerReport& ledger = report.data_ledger; ledger.leased) {
    absl::PrintF("leased data: %d epochs finished; every ps task applied %d examples%s, %d missing, %d twice%s\n",
                 ledger.epochs_finished, ledger.places_applied,
                 ledger.table_ledgers > 0 ? " to its variables and to each table's rows" : "", ledger.places_missing,
                 ledger.places_repeated,
                 ledger.places_missing == 0 && ledger.places_repeated == 0 ? " (exactly once)" : "");
  }
  if (report.unfinished_workers > 0) {
    absl::PrintF("%d worker(s) had not finished when the chief evaluated\n", report.unfinished_workers);
  }
  if (report.calls_retried > 0) {
    absl::PrintF("calls sent again after a task was briefly unreachable: %d (each applied once)\n",
                 report.calls_retried);
  }
  if (!report.members.empty()) {
    absl::PrintF("population (test accuracy above is member %d's, the fittest on validation):\n%s",
                 report.best_member, report.population_summary);
    for (const MemberReport& m : report.members) {
      absl::PrintF("  member %d: validation %.4f, test %.2f%%, %s\n", m.member, m.fitness, 100 * m.test_accuracy,
                   m.hyperparameters);
    }
    absl::PrintF("bytes moved reading other members: %.1f MB\n", report.peer_bytes_read / 1e6);
  }
  if (!report.network_test_accuracies.empty()) {
    absl::PrintF("gated ensemble (test accuracy above is the master-weighted vote's):\n");
    for (size_t k = 0; k < report.network_test_accuracies.size(); ++k) {
      absl::PrintF("  network %d alone: %.2f%%, mean master weight %.3f\n", k, 100 * report.network_test_accuracies[k],
                   k < report.network_mean_weights.size() ? report.network_mean_weights[k] : 0.0);
    }
    absl::PrintF("  uniform average of the networks: %.2f%%\n", 100 * report.uniform_average_accuracy);
    absl::PrintF("  some network right (a perfect gate's ceiling): %.2f%%\n", 100 * report.any_network_right);
  }
}

absl::Status WriteResult(const std::string& path, const TrainReport& report) {
  return WriteTextFile(path, ReportToJson(report).dump(2) + "\n");
}

// How the processes of a local job talk, as MakeTransport decides.
std::string ProcessesTransportSummary(const JobConfig& config) {
  const bool tls = !config.security.tls_ca_file.empty() || !config.security.tls_cert_file.empty();
  if (config.transport.kind == "grpc" || (config.transport.kind == "auto" && tls)) return "separate processes over gRPC";
  return "separate processes, tensors over UCX";
}

absl::Status Train(Flags& flags) {
  SHOAL_ASSIGN_OR_RETURN(JobConfig config, ConfigFromFlags(flags));
  const bool quiet = flags.Has("quiet");
  const std::string result_file = flags.Get("result_file");
  const bool print_config = flags.Has("print_config");
  SHOAL_RETURN_IF_ERROR(flags.CheckAllUsed());
  if (print_config) {  // what --config, --set and the flags make, without training
    absl::PrintF("%s\n", JobConfigToYaml(config));
    return absl::OkStatus();
  }
  absl::PrintF("shoal train: %d ps, %d workers, %s, %s, %s, %d epochs, batch %d, %s\n", config.cluster.ps,
               config.cluster.workers, config.training.mode,
               config.cluster.processes ? ProcessesTransportSummary(config) : "in-process", JobModelSummary(config),
               config.training.epochs, config.training.batch_size, config.training.optimizer.kind());
  std::fflush(stdout);
  TrainReport report;
  if (config.cluster.processes) {
    SHOAL_ASSIGN_OR_RETURN(report, TrainInLocalProcesses(config, "/proc/self/exe", !quiet, &g_signal));
  } else {
    SHOAL_ASSIGN_OR_RETURN(report, TrainInProcess(config, InProcOptions{}, quiet ? nullptr : stderr,
                                                  [](WorkerContext& context) {
                                                    context.extra_hooks.push_back(
                                                        std::make_shared<StopOnSignalHook>(&g_signal));
                                                  }));
  }
  PrintReport(report, config.model.kind == "click");
  if (!result_file.empty()) SHOAL_RETURN_IF_ERROR(WriteResult(result_file, report));
  return absl::OkStatus();
}

absl::Status Export(Flags& flags) {
  SHOAL_ASSIGN_OR_RETURN(JobConfig config, ConfigFromFlags(flags));
  ExportOptions options;
  options.checkpoint = flags.Get("checkpoint");
  options.out = flags.Get("out");
  options.tables_dir = flags.Get("tables_dir");
  SHOAL_RETURN_IF_ERROR(flags.GetInt("step", &options.step));
  int64_t member = -1;
  SHOAL_RETURN_IF_ERROR(flags.GetInt("member", &member));
  if (member < -1 || member > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("--member ", member, " is not a member's number"));
  }
  options.member = static_cast<int>(member);
  SHOAL_RETURN_IF_ERROR(flags.CheckAllUsed());
  if (options.checkpoint.empty()) return absl::InvalidArgumentError("--checkpoint is required");
  if (options.out.empty()) return absl::InvalidArgumentError("--out is required (the model file to write)");
  SHOAL_ASSIGN_OR_RETURN(const ExportResult result, ExportCheckpoint(config, options));
  absl::PrintF("exported %s (global step %d%s) to %s\n", result.checkpoint, result.step,
               result.member >= 0 ? absl::StrCat(", population member ", result.member) : "", result.model_file);
  for (const ExportedTable& table : result.tables) {
    absl::PrintF("table %s: %d rows of width %d in %d shard(s) under %s\n", table.name, table.rows, table.width,
                 table.shards, result.tables_dir);
  }
  return absl::OkStatus();
}

absl::Status Plot(Flags& flags) {
  if (!flags.Has("metrics_dir")) return absl::InvalidArgumentError("--metrics_dir is required");
  const std::string dir = flags.Get("metrics_dir");
  const std::string out = flags.Get("out", (std::filesystem::path(dir) / "curves.png").string());
  SHOAL_RETURN_IF_ERROR(flags.CheckAllUsed());
  SHOAL_ASSIGN_OR_RETURN(std::vector<MetricsSeries> series, ReadMetricsDir(dir));
  SHOAL_RETURN_IF_ERROR(PlotMetrics(series, out));
  absl::PrintF("wrote %s (%d tasks)\n", out, static_cast<int>(series.size()));
  return absl::OkStatus();
}

absl::Status CheckpointTool(const std::string& action, const std::string& path) {
  if (action == "list") {
    const std::vector<CheckpointInfo> all = ListCheckpoints(path);
    if (all.empty()) return absl::NotFoundError(absl::StrCat("no checkpoints under '", path, "'"));
    for (const CheckpointInfo& c : all) {
      absl::PrintF("%-40s step %-8d %s\n", c.path, c.step, c.complete            ? "complete"
                   : c.corrupt.empty() ? "unfinished (no index)"
                                       : "DAMAGED: " + c.corrupt);
    }
    return absl::OkStatus();
  }
  if (action != "inspect" && action != "verify") {
    return absl::InvalidArgumentError(absl::StrCat("unknown checkpoint action '", action, "'; use list, inspect or verify"));
  }
  SHOAL_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointAt(path));
  CheckpointIndex index;
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> variables, LoadCheckpoint(checkpoint, &index));
  if (action == "verify") {
    absl::PrintF("%s: step %d, %d variables in %d shards; every checksum matches\n", checkpoint, index.step,
                 variables.size(), index.shards.size());
    return absl::OkStatus();
  }
  absl::PrintF("%s: step %d, format version %d\n", checkpoint, index.step, index.format_version);
  for (size_t i = 0; i < index.shards.size(); ++i) absl::PrintF("  %s  written by %s\n", index.shards[i], index.tasks[i]);
  for (size_t i = 0; i < variables.size(); ++i) {
    const CheckpointVariable& v = variables[i];
    absl::PrintF("  %-32s [%s]  %s, %d slots, step %d, %d part(s)\n", v.name, absl::StrJoin(v.shape, ","), v.optimizer,
                 v.slots.tensors.size(), v.slots.step, index.variables[i].parts.size());
  }
  return absl::OkStatus();
}

// What `shoal resolve` prints: the task, its role and address, the cluster.
absl::Status Resolve(Flags& flags) {
  SHOAL_ASSIGN_OR_RETURN(JobConfig config, ConfigFromFlags(flags));
  ClusterSpec cluster = ClusterSpec::Local(1, 1);
  TaskId task;
  SHOAL_RETURN_IF_ERROR(ClusterAndTask(flags, config, &cluster, &task));
  const std::string bind = flags.Get("bind");
  SHOAL_RETURN_IF_ERROR(flags.CheckAllUsed());
  const std::string role = task.job == "ps"          ? "serves variables"
                           : task.job == "evaluator" ? "evaluates checkpoints"
                           : cluster.IsChief(task)   ? "trains (the chief)"
                                                     : "trains";
  auto address = cluster.AddressOf(task);
  absl::PrintF("task %s %s at %s%s\ncluster %s\n", task.ToString(), role,
               address.ok() ? *address : "no address (not in the cluster)",
               bind.empty() ? "" : absl::StrCat(", listening on ", bind), cluster.ToJson());
  return absl::OkStatus();
}

absl::Status ConfigCommand(Flags& flags) {
  const bool reference = flags.Has("reference");
  SHOAL_RETURN_IF_ERROR(flags.CheckAllUsed());
  if (!reference) return absl::InvalidArgumentError("usage: shoal config --reference");
  SHOAL_RETURN_IF_ERROR(CheckConfigReference());
  SHOAL_ASSIGN_OR_RETURN(const std::string page, ConfigReferenceMarkdown());
  std::fputs(page.c_str(), stdout);
  return absl::OkStatus();
}

absl::Status RunTaskAsConfigured(Flags& flags, bool server) {
  const bool slurm = flags.Has("slurm");
  SHOAL_ASSIGN_OR_RETURN(JobConfig config, ConfigFromFlags(flags));
  ClusterSpec cluster = ClusterSpec::Local(1, 1);
  TaskId task;
  SHOAL_RETURN_IF_ERROR(ClusterAndTask(flags, config, &cluster, &task));
  TaskOptions options;
  options.bind_address = flags.Get("bind");
  options.signal = &g_signal;
  const bool quiet = flags.Has("quiet");
  const std::string result_file = flags.Get("result_file");
  const std::string trained_file = flags.Get("trained_file");  // the local launcher's: the trained tensors
  SHOAL_RETURN_IF_ERROR(flags.CheckAllUsed());
  // An evaluator in TF_CONFIG evaluates, whichever command the replica runs;
  // under SLURM every task runs the same command, and a ps task serves.
  if (task.job == "evaluator") return RunEvaluatorTask(config, cluster, task, options);
  if (server || (slurm && task.job == "ps")) return RunServerTask(config, cluster, task, options);
  TrainReport report;
  SHOAL_RETURN_IF_ERROR(RunWorkerTask(config, cluster, task, options, quiet ? nullptr : stderr, &report));
  if (cluster.IsChief(task)) {
    // The local launcher (which asks for trained_file) prints the job's
    // report itself, once.
    if (!quiet && trained_file.empty()) PrintReport(report, config.model.kind == "click");
    if (!result_file.empty()) SHOAL_RETURN_IF_ERROR(WriteResult(result_file, report));
    if (!trained_file.empty()) {
      SHOAL_RETURN_IF_ERROR(SaveWeightsFile({report.trained_names, report.trained_values}, trained_file));
    }
    WriteRunReport(report);
  }
  return absl::OkStatus();
}

// Runs one task; with --error_file (the local launcher's), a failure is
// also written there, for the job's own error message.
absl::Status RunTask(Flags& flags, bool server) {
  const std::string error_file = flags.Get("error_file");
  absl::Status status = RunTaskAsConfigured(flags, server);
  if (!status.ok() && !error_file.empty()) std::ofstream(error_file) << status.ToString() << "\n";
  return status;
}

int Main(int argc, char** argv) {
  KeepLargeAllocationsMapped();
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != "--help" && arg != "-h") continue;
    const std::string usage = CommandUsage(command);
    if (usage.empty()) break;  // an unknown command: said below
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  if (command == "checkpoint") {
    absl::Status status = argc == 4 ? CheckpointTool(argv[2], argv[3])
                                    : absl::InvalidArgumentError("usage: shoal checkpoint list|inspect|verify PATH");
    if (status.ok()) return 0;
    absl::FPrintF(stderr, "shoal checkpoint: error: %s\n", status.ToString());
    return 1;
  }
  auto flags = ParseFlags(argc, argv, 2);
  absl::Status status = flags.status();
  if (status.ok()) {
    if (command == "train") {
      status = Train(*flags);
    } else if (command == "server") {
      status = RunTask(*flags, /*server=*/true);
    } else if (command == "worker" || command == "evaluator") {
      status = RunTask(*flags, /*server=*/false);
    } else if (command == "resolve") {
      status = Resolve(*flags);
    } else if (command == "export") {
      status = Export(*flags);
    } else if (command == "plot") {
      status = Plot(*flags);
    } else if (command == "config") {
      status = ConfigCommand(*flags);
    } else {
      static const std::set<std::string> kCommands = {"train", "server", "worker", "evaluator", "resolve",
                                                       "export", "plot",  "config", "checkpoint"};
      status = absl::InvalidArgumentError(
          absl::StrCat("unknown command '", command, "'", DidYouMean(command, kCommands), "; see shoal --help"));
    }
  }
  if (!status.ok()) {
    absl::FPrintF(stderr, "shoal %s: error: %s\n", command, status.ToString());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) { return shoal::Main(argc, argv); }
