// The public C++ API (include/shoal/shoal.h) over the library's layers: it
// turns absl::Status into shoal::Error and keeps every internal type out of
// the header.
#include "shoal/shoal.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <filesystem>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/client/client.h"
#include "shoal/config/config.h"
#include "shoal/core/dtype.h"
#include "shoal/core/file.h"
#include "shoal/core/status.h"
#include "shoal/data/npy.h"
#include "shoal/hooks/standard_hooks.h"
#include "shoal/model/model.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/task_runner.h"
#include "shoal/strategy/train_report.h"
#include "shoal/transport/local_first_transport.h"

namespace shoal {
namespace {

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw Error(std::string(absl::StatusCodeToString(status.code())), std::string(status.message()));
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return std::move(value).value();
}

Step ToStep(const StepInfo& info, int worker, bool chief) {
  Step step;
  step.worker = worker;
  step.chief = chief;
  step.local_step = info.local_step;
  step.global_step = info.global_step;
  step.loss = info.loss;
  step.accuracy = info.accuracy;
  step.examples = info.examples;
  step.examples_per_second = info.examples_per_second;
  return step;
}

// A program's Hook as one worker's TrainingHook.
class ProgramHook : public TrainingHook {
 public:
  ProgramHook(std::shared_ptr<Hook> hook, int worker, bool chief)
      : hook_(std::move(hook)), worker_(worker), chief_(chief) {}

  absl::Status AfterStep(const StepInfo& info, StopRequest* stop) override {
    std::string reason;
    try {
      if (hook_->AfterStep(ToStep(info, worker_, chief_), &reason)) {
        stop->Request(reason.empty() ? "a hook asked to stop" : reason);
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("a hook threw after step ", info.local_step, ": ", e.what()));
    }
    return absl::OkStatus();
  }
  void End(const StepInfo& last, const absl::Status& status) override {
    try {
      hook_->End(ToStep(last, worker_, chief_), status.ok() ? "" : status.ToString());
    } catch (const std::exception&) {
      // The worker has ended already; nothing is left to fail.
    }
  }

 private:
  std::shared_ptr<Hook> hook_;
  int worker_;
  bool chief_;
};

Report ToReport(const TrainReport& internal) {
  Report report;
  report.test_accuracy = internal.test_accuracy;
  report.test_loss = internal.test_loss;
  report.test_auc = internal.test_auc;
  report.row_cache_hit_rate = internal.row_cache_hit_rate;
  report.table_rows_held = internal.table_rows_held;
  report.table_ids_refused = internal.table_ids_refused;
  report.table_rows_evicted = internal.table_rows_evicted;
  report.global_step = internal.global_step;
  report.seconds = internal.seconds;
  report.examples_per_second = internal.examples_per_second;
  report.last_loss = internal.last_loss;
  report.stop_reason = internal.stop_reason;
  report.json = ReportToJson(internal).dump();
  for (size_t i = 0; i < internal.trained_names.size(); ++i) {
    report.variables[internal.trained_names[i]] = internal.trained_values[i];
  }
  report.member = internal.trained_member;
  report.run_dir = internal.run_dir;
  report.model_file = internal.model_file;
  return report;
}

// The report, with the trained values written into the program's module
// when it gave one to train in place (Module::Of(name, net)).
Report ReportAndTrainedModule(const TrainReport& internal, const Module* module) {
  Report report = ToReport(internal);
  if (module != nullptr && module->trained != nullptr) report.LoadInto(*module->trained);
  return report;
}

// The `shoal` executable beside libshoal.so (the build folder), or in the
// install prefix's bin/.
std::string DefaultShoalBinary() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&DefaultShoalBinary), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::filesystem::path library_dir = std::filesystem::path(info.dli_fname).parent_path();
  for (const auto& candidate : {library_dir / "shoal", library_dir / ".." / "bin" / "shoal"}) {
    std::error_code error;
    if (std::filesystem::is_regular_file(candidate, error)) return candidate.lexically_normal().string();
  }
  return "";
}

// A folder of its own for the data a processes job reads, removed with it.
class DataFolder {
 public:
  DataFolder() {
    char name[] = "/tmp/shoal-data-XXXXXX";
    if (mkdtemp(name) != nullptr) path_ = name;
  }
  ~DataFolder() {
    std::error_code error;
    if (!path_.empty()) std::filesystem::remove_all(path_, error);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes in-memory data as NPY files for task processes to read.
absl::Status WriteDataFiles(const TensorData& data, const std::string& dir, DataConfig* config) {
  if (dir.empty()) return absl::InternalError("cannot make a folder under /tmp for the job's data");
  const std::vector<std::pair<std::string*, const torch::Tensor*>> files = {
      {&config->train_features, &data.train_features},
      {&config->train_labels, &data.train_labels},
      {&config->test_features, &data.test_features},
      {&config->test_labels, &data.test_labels}};
  const char* names[] = {"train_features.npy", "train_labels.npy", "test_features.npy", "test_labels.npy"};
  for (size_t i = 0; i < files.size(); ++i) {
    *files[i].first = (std::filesystem::path(dir) / names[i]).string();
    SHOAL_RETURN_IF_ERROR(WriteNpy(*files[i].first, *files[i].second));
  }
  config->format = "npy";
  config->tensors = nullptr;
  return absl::OkStatus();
}

// Every tensor a program hands over, checked before anything is sent, so
// that the error names the variable: `what` says what they are
// ("the gradient"), `int64_too` whether int64 (buffers) is allowed.
void CheckTensors(const char* what, const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                  bool int64_too) {
  if (names.size() != tensors.size()) {
    throw Error("INVALID_ARGUMENT", absl::StrCat(names.size(), " names but ", tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!t.defined()) throw Error("INVALID_ARGUMENT", absl::StrCat(what, " for '", names[i], "' is undefined"));
    const bool dtype_ok = t.scalar_type() == torch::kFloat32 || (int64_too && t.scalar_type() == torch::kInt64);
    if (!dtype_ok || !t.device().is_cpu()) {
      throw Error("INVALID_ARGUMENT",
                  absl::StrCat(what, " for '", names[i], "' is a ", DTypeName(t.scalar_type()), " tensor on ",
                               t.device().str(), "; shoal takes float32", int64_too ? " (or int64)" : "",
                               " CPU tensors"));
    }
  }
}

// Where this process's VariableServers register besides serving over gRPC,
// so that a ClusterClient of the same process calls them directly.
InProcNetwork& ProcessNetwork() {
  static auto* network = new InProcNetwork;
  return *network;
}

}  // namespace

struct Job::State {
  std::string yaml = "{}";
  std::shared_ptr<const Module> module;
  std::shared_ptr<const TensorData> data;
  std::vector<std::shared_ptr<Hook>> hooks;

  // The config with what the program added, checked as a whole.
  absl::StatusOr<JobConfig> Resolve() const {
    SHOAL_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfig(yaml));
    if (module != nullptr) {
      config.model.kind = "module";
      config.model.module = module;
    }
    if (data != nullptr) {
      config.data.format = "tensors";
      config.data.tensors = data;
    }
    SHOAL_RETURN_IF_ERROR(ValidateJobConfig(config));
    return config;
  }

  // The program's hooks, for the training task with this worker index and role.
  std::vector<std::shared_ptr<TrainingHook>> TaskHooks(int worker, bool chief) const {
    std::vector<std::shared_ptr<TrainingHook>> task_hooks;
    for (const auto& hook : hooks) task_hooks.push_back(std::make_shared<ProgramHook>(hook, worker, chief));
    return task_hooks;
  }
};

Job::Job() : state_(std::make_shared<State>()) {}

Job Job::FromYaml(const std::string& yaml) {
  ThrowIfError(ParseJobConfig(yaml).status());
  auto state = std::make_shared<State>();
  state->yaml = yaml;
  Job job;
  job.state_ = std::move(state);
  return job;
}

Job Job::FromFile(const std::string& path) {
  const std::string text = ValueOrThrow(ReadTextFile(path, "config file"));
  ThrowIfError(LoadJobConfig(path).status());
  return FromYaml(text);
}

Job& Job::Set(const std::string& key, const std::string& yaml_value) {
  auto state = std::make_shared<State>(*state_);
  state->yaml = ValueOrThrow(SetConfigKey(state->yaml, key, yaml_value));
  ThrowIfError(state->Resolve().status());
  state_ = std::move(state);
  return *this;
}

Job& Job::SetModule(Module module) {
  auto state = std::make_shared<State>(*state_);
  state->module = std::make_shared<const Module>(std::move(module));
  state_ = std::move(state);
  return *this;
}

Job& Job::SetData(torch::Tensor train_features, torch::Tensor train_labels, torch::Tensor test_features,
                  torch::Tensor test_labels) {
  auto state = std::make_shared<State>(*state_);
  state->data = std::make_shared<const TensorData>(
      TensorData{std::move(train_features), std::move(train_labels), std::move(test_features), std::move(test_labels)});
  state_ = std::move(state);
  return *this;
}

Job& Job::AddHook(std::shared_ptr<Hook> hook) {
  if (hook == nullptr) throw Error("INVALID_ARGUMENT", "AddHook: the hook is null");
  auto state = std::make_shared<State>(*state_);
  state->hooks.push_back(std::move(hook));
  state_ = std::move(state);
  return *this;
}

void Report::LoadInto(torch::nn::Module& module) const {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (destination, value), all checked first
  auto check = [&](const std::string& name, const torch::Tensor& destination) {
    auto it = variables.find(name);
    if (it == variables.end()) {
      throw Error("NOT_FOUND", absl::StrCat("the trained model has no variable '", name,
                                            "', which the module has: it is another model (trained: ",
                                            variables.size(), " variables)"));
    }
    if (!it->second.sizes().equals(destination.sizes())) {
      throw Error("INVALID_ARGUMENT", absl::StrCat("trained variable '", name, "' is ", ShapeString(it->second.sizes()),
                                                   ", the module's ", ShapeString(destination.sizes())));
    }
    copies.emplace_back(destination, it->second);
  };
  for (const auto& p : module.named_parameters()) check(p.key(), p.value());
  for (const auto& b : module.named_buffers()) check(b.key(), b.value());
  torch::NoGradGuard no_grad;
  for (auto& [destination, value] : copies) destination.copy_(value);
}

std::string Job::ToYaml() const { return JobConfigToYaml(ValueOrThrow(state_->Resolve())); }

torch::Tensor Job::TrainingFeatures(int64_t n) const {
  const DataSplits data = ValueOrThrow(LoadData(ValueOrThrow(state_->Resolve())));
  return data.train.images.narrow(0, 0, std::clamp<int64_t>(n, 0, data.train.size())).clone();
}

Report Job::Train(const RunOptions& options) const {
  JobConfig config = ValueOrThrow(state_->Resolve());
  std::shared_ptr<const State> state = state_;
  if (!config.cluster.processes) {
    const std::atomic<int>* stop = options.stop;
    const TrainReport report = ValueOrThrow(TrainInProcess(
        config, InProcOptions{}, options.progress ? stderr : nullptr, [state, stop](WorkerContext& context) {
          if (stop != nullptr) context.extra_hooks.push_back(std::make_shared<StopOnSignalHook>(stop));
          for (auto& hook : state->TaskHooks(context.worker_index, context.is_chief)) {
            context.extra_hooks.push_back(std::move(hook));
          }
        }));
    return ReportAndTrainedModule(report, state->module.get());
  }
  // Each task process runs the shoal binary on the config written out: it
  // can build neither the program's module nor call its hooks.
  if (state->module != nullptr) {
    throw Error("FAILED_PRECONDITION",
                absl::StrCat("cluster.processes: module '", state->module->name,
                             "' lives in this program, and task processes run the shoal binary; train it in-process, "
                             "or run each task of the cluster in a process of this program (Job::RunTask)"));
  }
  if (!state->hooks.empty()) {
    throw Error("FAILED_PRECONDITION",
                "cluster.processes: hooks run in this program, and task processes run the shoal binary; train "
                "in-process, or run each task in a process of this program (Job::RunTask)");
  }
  DataFolder folder;
  if (state->data != nullptr) ThrowIfError(WriteDataFiles(*state->data, folder.path(), &config.data));
  const std::string binary = options.shoal_binary.empty() ? DefaultShoalBinary() : options.shoal_binary;
  if (binary.empty()) {
    throw Error("NOT_FOUND",
                "cluster.processes: no shoal executable beside libshoal.so or in its prefix's bin/; give "
                "RunOptions::shoal_binary");
  }
  return ToReport(ValueOrThrow(TrainInLocalProcesses(config, binary, options.progress, options.stop)));
}

Report Job::RunTask(const std::string& cluster_json, const std::string& task_name,
                    const RunOptions& options) const {
  const JobConfig config = ValueOrThrow(state_->Resolve());
  const ClusterSpec cluster = ValueOrThrow(ClusterSpec::FromJson(cluster_json));
  const TaskId task = ValueOrThrow(ParseTaskId(task_name));
  const bool unlisted_evaluator = task.job == "evaluator" && cluster.NumTasks("evaluator") == 0;
  if (!cluster.HasTask(task) && !unlisted_evaluator) {
    throw Error("INVALID_ARGUMENT", absl::StrCat(task.ToString(), " is not in the cluster: job '", task.job, "' has ",
                                                 cluster.NumTasks(task.job), " tasks"));
  }
  TaskOptions task_options;
  task_options.signal = options.stop;
  if (task.job == "ps") {
    ThrowIfError(RunServerTask(config, cluster, task, task_options));
    return Report{};
  }
  if (task.job == "evaluator") {
    ThrowIfError(RunEvaluatorTask(config, cluster, task, task_options));
    return Report{};
  }
  const std::vector<TaskId> workers = cluster.TrainingTasks();
  const int worker = static_cast<int>(std::find(workers.begin(), workers.end(), task) - workers.begin());
  task_options.extra_hooks = state_->TaskHooks(worker, worker == 0);
  TrainReport report;
  ThrowIfError(RunWorkerTask(config, cluster, task, task_options, options.progress ? stderr : nullptr, &report));
  return worker == 0 ? ReportAndTrainedModule(report, state_->module.get()) : Report{};
}

// The client's connections and where each variable lives.
struct ClusterClient::State {
  std::unique_ptr<LocalFirstTransport> transport;
  std::unique_ptr<Client> client;
  std::vector<TaskId> ps_tasks;
  std::vector<VariableShape> variables;  // in the order given: what Save and Restore cover
  // A ps of this process answers reads with its own memory: the caller
  // gets copies, as from any other ps.
  bool copy_reads = false;
};

ClusterClient::ClusterClient(const std::string& cluster_json, const std::vector<VariableShape>& variables,
                             const ClusterClientOptions& options)
    : state_(std::make_unique<State>()) {
  const ClusterSpec cluster = ValueOrThrow(ClusterSpec::FromJson(cluster_json, ClusterUse::kPsClient));
  std::vector<VariableSpec> specs;
  for (const VariableShape& variable : variables) specs.push_back(VariableSpec{variable.name, variable.shape});
  auto placement = std::make_shared<const Placement>(ValueOrThrow(Placement::Create(specs, cluster, PlacementOptions{})));
  JobConfig config = DefaultJobConfig();
  config.security.token = options.token;
  config.security.tls_ca_file = options.tls_ca_file;
  config.security.tls_cert_file = options.tls_cert_file;
  config.security.tls_key_file = options.tls_key_file;
  config.security.mutual_tls = !options.tls_cert_file.empty();
  if (!(options.rpc_timeout_s > 0)) throw Error("INVALID_ARGUMENT", "rpc_timeout_s must be positive");
  state_->transport = std::make_unique<LocalFirstTransport>(
      &ProcessNetwork(), ValueOrThrow(MakeTransport(config)));
  for (const TaskId& task : cluster.Tasks("ps")) {
    if (state_->transport->IsLocal(ValueOrThrow(cluster.AddressOf(task)))) state_->copy_reads = true;
  }
  state_->client = ValueOrThrow(
      Client::Create(cluster, state_->transport.get(), placement, ClientOptions{absl::Seconds(options.rpc_timeout_s)}));
  state_->ps_tasks = cluster.Tasks("ps");
  state_->variables = variables;
}

ClusterClient::~ClusterClient() = default;

void ClusterClient::Create(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
                           const std::string& optimizer_yaml) {
  CheckTensors("the initial value", names, values, /*int64_too=*/false);
  // The keys of training.optimizer, but without the main job's learning-rate
  // decay unless asked for: a client's applies are no job's steps.
  YAML::Node optimizer;
  try {
    optimizer = YAML::Load(optimizer_yaml);
  } catch (const YAML::Exception& e) {
    throw Error("INVALID_ARGUMENT", absl::StrCat("optimizer: '", optimizer_yaml, "' is not YAML: ", e.what()));
  }
  if (!optimizer.IsMap()) throw Error("INVALID_ARGUMENT", "optimizer: expected a mapping such as {kind: sgd}");
  if (!optimizer["lr_decay_rate"]) optimizer["lr_decay_rate"] = 0;
  if (!optimizer["lr_decay_steps"]) optimizer["lr_decay_steps"] = 0;
  YAML::Node document;
  document["training"]["optimizer"] = optimizer;
  YAML::Emitter out;
  out << document;
  const JobConfig parsed = ValueOrThrow(ParseJobConfig(out.c_str()));
  std::vector<VariableInit> inits;
  for (size_t i = 0; i < names.size(); ++i) {
    inits.push_back(VariableInit{names[i], values[i], parsed.training.optimizer});
  }
  ThrowIfError(state_->client->CreateVariables(inits));
}

void ClusterClient::WaitFor(const std::vector<std::string>& names, double timeout_s) {
  ThrowIfError(state_->client->WaitForVariables(names, absl::Seconds(timeout_s)));
}

std::vector<torch::Tensor> ClusterClient::Read(const std::vector<std::string>& names) {
  std::vector<torch::Tensor> values = ValueOrThrow(state_->client->Read(names));
  if (state_->copy_reads) {
    for (torch::Tensor& value : values) value = value.clone();
  }
  return values;
}

namespace {

// Throws unless each destination has the shape and dtype of its value.
void CheckDestinations(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
                       const std::vector<torch::Tensor>& destinations, absl::string_view values_are) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (!destinations[i].sizes().equals(values[i].sizes()) || destinations[i].scalar_type() != values[i].scalar_type()) {
      throw Error("INVALID_ARGUMENT", absl::StrCat("the destination for '", names[i], "' is ",
                                                   DTypeName(destinations[i].scalar_type()), " ",
                                                   ShapeString(destinations[i].sizes()), "; ", values_are, " ",
                                                   DTypeName(values[i].scalar_type()), " ",
                                                   ShapeString(values[i].sizes())));
    }
  }
}

// What an apply adds to `global_step` (nothing for an increment of 0).
std::vector<CounterDelta> GlobalStepCounters(int64_t increment) {
  if (increment == 0) return {};
  return {CounterDelta{"global_step", increment}};
}

void CopyInto(const std::vector<torch::Tensor>& values, const std::vector<torch::Tensor>& destinations) {
  torch::NoGradGuard no_grad;  // a destination may be a parameter that requires a gradient
  for (size_t i = 0; i < values.size(); ++i) destinations[i].copy_(values[i]);
}

}  // namespace

void ClusterClient::ReadInto(const std::vector<std::string>& names, const std::vector<torch::Tensor>& destinations) {
  CheckTensors("the destination", names, destinations, /*int64_too=*/true);
  const std::vector<torch::Tensor> values = ValueOrThrow(state_->client->Read(names));
  CheckDestinations(names, values, destinations, "the variable is");
  CopyInto(values, destinations);
}

int64_t ClusterClient::ApplyAndReadInto(const std::vector<std::string>& names,
                                        const std::vector<torch::Tensor>& gradients,
                                        const std::vector<torch::Tensor>& destinations,
                                        int64_t global_step_increment) {
  CheckTensors("the gradient", names, gradients, /*int64_too=*/false);
  CheckTensors("the destination", names, destinations, /*int64_too=*/false);
  // Before anything is applied: a gradient has its variable's shape and
  // dtype (the ps refuses it otherwise), so the destination must have the
  // gradient's.
  CheckDestinations(names, gradients, destinations, "the gradient is");
  Client::AppliedValues applied =
      ValueOrThrow(state_->client->ApplyGradientsAndRead(names, gradients, GlobalStepCounters(global_step_increment)));
  CopyInto(applied.values, destinations);
  return applied.counters.empty() ? 0 : applied.counters.front();
}

void ClusterClient::Assign(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values) {
  CheckTensors("the value", names, values, /*int64_too=*/true);
  ThrowIfError(state_->client->Assign(names, values));
}

int64_t ClusterClient::Apply(const std::vector<std::string>& names, const std::vector<torch::Tensor>& gradients,
                             int64_t global_step_increment) {
  CheckTensors("the gradient", names, gradients, /*int64_too=*/false);
  const std::vector<int64_t> values =
      ValueOrThrow(state_->client->ApplyGradients(names, gradients, GlobalStepCounters(global_step_increment)));
  return values.empty() ? 0 : values.front();
}

void ClusterClient::CreateTable(const std::string& name, const TableOptions& options) {
  const std::string where = absl::StrCat("table '", name, "'");
  wire::TableDef table;
  table.set_name(name);
  table.set_rows(options.rows);
  table.set_dim(options.dim);
  table.set_seed(options.seed);
  table.set_init_scale(options.init_scale);
  table.set_min_count(options.min_count);
  table.set_steps_to_live(options.steps_to_live);
  table.set_max_rows(options.max_rows);
  table.set_evict_when_full(options.evict_when_full);
  table.set_eviction(options.eviction);
  *table.mutable_optimizer() = ValueOrThrow(ParseOptimizerYaml(options.optimizer_yaml, where + " optimizer"));
  ThrowIfError(state_->client->CreateTables({table}));
}

namespace {

Client::Ids InternalIds(ClusterClient::RowIds ids_are) {
  return ids_are == ClusterClient::RowIds::kDistinct ? Client::Ids::kDistinct : Client::Ids::kAny;
}

}  // namespace

torch::Tensor ClusterClient::PullRows(const std::string& table, const torch::Tensor& ids, RowIds ids_are) {
  torch::Tensor rows = ValueOrThrow(state_->client->PullRows(table, ids, InternalIds(ids_are)));
  return state_->copy_reads ? rows.clone() : rows;
}

void ClusterClient::PushRows(const std::string& table, const torch::Tensor& ids, const torch::Tensor& gradients,
                             RowIds ids_are) {
  ThrowIfError(state_->client->PushRows(table, ids, gradients, InternalIds(ids_are)));
}

ClusterClient::TableStats ClusterClient::GetTableStats(const std::string& table) {
  const Client::TableOccupancy occupancy = ValueOrThrow(state_->client->Occupancy(table));
  return TableStats{occupancy.rows_held, occupancy.ids_refused, occupancy.rows_evicted};
}

std::string ClusterClient::Save(const std::string& dir, int64_t step, int keep) {
  if (dir.empty()) throw Error("INVALID_ARGUMENT", "save: no checkpoint directory given");
  if (keep < 0) throw Error("INVALID_ARGUMENT", absl::StrCat("save: keep is ", keep, ", must be >= 0"));
  if (step < 0) step = ValueOrThrow(state_->client->AddToCounter("global_step", 0));
  const std::string path = ValueOrThrow(SaveCheckpoint(*state_->client, dir, step));
  if (keep > 0) ThrowIfError(PruneCheckpoints(dir, keep));
  return path;
}

int64_t ClusterClient::Restore(const std::string& dir) {
  absl::StatusOr<std::string> latest = LatestCheckpoint(dir);
  if (absl::IsNotFound(latest.status())) return -1;
  const std::string checkpoint = ValueOrThrow(std::move(latest));
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const VariableShape& variable : state_->variables) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
  }
  // Everything is checked before anything is put back: the checkpoint holds
  // each variable in its shape, and each exists on the ps tasks.
  CheckpointIndex index;
  std::vector<CheckpointVariable> restored = ValueOrThrow(LoadVariables(checkpoint, names, shapes, &index));
  const std::vector<bool> exist = ValueOrThrow(state_->client->VariablesExist(names));
  for (size_t i = 0; i < names.size(); ++i) {
    if (!exist[i]) {
      throw Error("FAILED_PRECONDITION", absl::StrCat("restore from ", checkpoint, ": variable '", names[i],
                                                      "' does not exist on the ps tasks; create it first"));
    }
  }
  // A ps checks a table's whole file before it changes a row.
  if (!index.table_shards.empty()) ValueOrThrow(state_->client->RestoreTables(index.step, index.table_shards));
  ThrowIfError(RestoreVariables(*state_->client, restored, names));
  ThrowIfError(state_->client->SetCounter("global_step", index.step).status());
  return index.step;
}

int64_t ClusterClient::AddToCounter(const std::string& name, int64_t delta) {
  return ValueOrThrow(state_->client->AddToCounter(name, delta));
}

void ClusterClient::ShutdownServers() {
  for (const TaskId& task : state_->ps_tasks) ThrowIfError(state_->client->Shutdown(task));
}

struct VariableServer::State {
  TaskServer served;
  std::unique_ptr<ServerHandle> local;  // in ProcessNetwork(); declared last: stops first
};

VariableServer::VariableServer(const std::string& address, const std::string& token,
                               const std::string& checkpoint_dir)
    : state_(std::make_unique<State>()) {
  JobConfig config = DefaultJobConfig();
  config.security.token = token;
  if (!checkpoint_dir.empty()) config.checkpoint.dir = std::filesystem::absolute(checkpoint_dir).string();
  const ClusterSpec cluster =
      ValueOrThrow(ClusterSpec::FromJson(nlohmann::json{{"ps", {address}}}.dump(), ClusterUse::kPsClient));
  state_->served = ValueOrThrow(ServeTask(config, cluster, TaskId{"ps", 0}, TaskOptions{}));
  InProcTransport local(&ProcessNetwork());
  state_->local = ValueOrThrow(local.Serve(this->address(), state_->served.service.get()));
}

std::string VariableServer::address() const { return state_->served.server->address(); }

VariableServer::~VariableServer() = default;

bool VariableServer::Wait(double timeout_s) {
  return state_->served.service->shutdown_requested().WaitForNotificationWithTimeout(absl::Seconds(timeout_s));
}

}  // namespace shoal
