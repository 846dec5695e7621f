// shoal's public C++ API: what a program builds against after
// `find_package(shoal)` (target shoal::shoal). It exposes torch and the
// standard library only; every failure is a shoal::Error carrying shoal's
// message, which names what is wrong and where.
//
//   shoal::Job job = shoal::Job::FromFile("configs/async_fashion_mnist.yaml");
//   job.Set("training.epochs", "2").SetModule(shoal::Module::Of<Net>("net"));
//   shoal::Report report = job.Train();          // a whole local cluster
//   std::cout << report.test_accuracy << "\n";
//
// A Job is a value: copies are independent, and a Job may be trained several
// times. Train and RunTask block until the job (or the task) ends; calling
// them from several threads at once on different Jobs is safe.
#ifndef SHOAL_SHOAL_H_
#define SHOAL_SHOAL_H_

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shoal/module.h"

namespace shoal {

// A failure, with its status code's name ("INVALID_ARGUMENT", "UNAVAILABLE",
// "DEADLINE_EXCEEDED", ...) and shoal's message.
class Error : public std::runtime_error {
 public:
  Error(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

// What one worker's step did, as a hook sees it.
struct Step {
  int worker = 0;          // the worker's index among the training tasks
  bool chief = false;
  int64_t local_step = 0;  // steps this worker has taken, this one included
  int64_t global_step = 0;
  double loss = 0;
  double accuracy = 0;  // on the step's batch
  int64_t examples = 0;
  double examples_per_second = 0;  // this worker's, over the last few seconds
};

// Code that runs after every step of every worker. In-process the workers
// are threads: AfterStep may be called from several threads at once.
class Hook {
 public:
  virtual ~Hook() = default;
  // Returns true to stop the whole job after this step (every worker ends
  // cleanly, the chief evaluates); the report's stop_reason is `reason`
  // when the chief's hook stopped the job, and says a worker's hook did
  // otherwise.
  virtual bool AfterStep(const Step& step, std::string* reason) { return false; }
  // Once per worker, when it ends: its last step, and an empty `error` if it
  // ended well.
  virtual void End(const Step& last, const std::string& error) {}
};

// What the chief reports at the end of a job.
struct Report {
  double test_accuracy = 0;  // classification
  double test_loss = 0;      // the mean loss on the test set (click models: log loss)
  double test_auc = 0;       // click models (model.kind click): the AUC on the test set
  double row_cache_hit_rate = 0;  // click models with model.click.cache_rows
  // Models with embedding tables, at the end: rows held over all shards,
  // new ids a full dynamic table turned away, rows evicted to make room.
  int64_t table_rows_held = 0;
  int64_t table_ids_refused = 0;
  int64_t table_rows_evicted = 0;
  int64_t global_step = 0;
  double seconds = 0;
  double examples_per_second = 0;
  double last_loss = 0;
  std::string stop_reason;  // why a hook or a signal stopped the job early; empty if it ran to the end
  std::string json;         // every figure, as `shoal worker --result_file` writes them

  // The trained model: every variable and buffer by name, the ps's values
  // at the end. A module's names are its own (named_parameters(),
  // named_buffers()); the built-in models' are shoal's ("dense_1/kernel").
  // population: the fittest member's (`member`), its scope left off; gated:
  // every network's and the master's ("net_0/...", "master/...").
  std::map<std::string, torch::Tensor> variables;
  int member = -1;
  // The run folder (hooks.run_dir): model.pt (TorchScript; empty for a C++
  // module, which has none), weights.pt and report.json. Empty: none.
  std::string run_dir;
  std::string model_file;

  // Copies `variables` into `module`'s parameters and buffers of the same
  // names (what Job::Train does for a Module made with Module::Of(name,
  // net)). Every one must be there with its shape, or nothing is copied
  // and shoal::Error names the first that is not.
  void LoadInto(torch::nn::Module& module) const;
};

struct RunOptions {
  bool progress = false;  // the progress line on stderr (redrawn in place on a terminal)
  // Not owned; may be null. Once set to non-zero (a signal handler's, with
  // the signal's number), the job stops after its step in progress: the
  // chief saves, evaluates and reports, as the shoal binary does on Ctrl-C.
  const std::atomic<int>* stop = nullptr;
  // cluster.processes: the `shoal` executable that runs each task. Empty:
  // the one beside libshoal.so (the build folder) or in the prefix's bin/.
  std::string shoal_binary;
};

// A training job: its configuration (the YAML of configs/*.yaml, every key
// optional; the defaults are the main job), and what a program adds that no
// file can hold: its own module, data in memory, hooks.
class Job {
 public:
  Job();  // the main job: 2 ps, 2 workers, async, the MLP on Fashion-MNIST
  static Job FromYaml(const std::string& yaml);
  static Job FromFile(const std::string& path);

  // Sets one key, named by its path ("training.mode", "cluster.workers"),
  // to a YAML value ("sync", "4", "[784, 64, 10]"). The whole config is
  // checked; on an error (an unknown key, a value out of range) the job is
  // left as it was.
  Job& Set(const std::string& key, const std::string& yaml_value);
  // Trains `module` in place of `model:` (in-process, or as tasks of a
  // cluster this program runs with RunTask; processes would not know it).
  Job& SetModule(Module module);
  // Trains on these tensors in place of `data:`: features [N, ...] float32
  // or uint8, labels [N] int64 classes (or float32 targets for model.loss
  // mse). They are checked when the job starts, like files.
  Job& SetData(torch::Tensor train_features, torch::Tensor train_labels, torch::Tensor test_features,
               torch::Tensor test_labels);
  Job& AddHook(std::shared_ptr<Hook> hook);

  // The config as YAML (what a task process would read).
  std::string ToYaml() const;
  // The first `n` training examples' features as the model receives them
  // (data.normalize applied): to trace a module on, or to check its input.
  torch::Tensor TrainingFeatures(int64_t n) const;

  // Runs the whole job on this machine: every task in this process, or with
  // cluster.processes each its own process over gRPC.
  Report Train(const RunOptions& options = {}) const;

  // Runs one task of a real cluster and returns when it ends: `cluster_json`
  // as in a cluster file ({"ps": ["h1:2222"], "worker": ["h2:2222", ...]}),
  // `task` as "ps:0", "worker:1", "chief:0" or "evaluator:0". A ps serves
  // until the chief shuts it down; the chief's report is returned (other
  // tasks return an empty one).
  Report RunTask(const std::string& cluster_json, const std::string& task, const RunOptions& options = {}) const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

// Where to reach a cluster's servers and how.
struct ClusterClientOptions {
  std::string token;         // the job's shared token, if its servers want one
  double rpc_timeout_s = 60;  // every call's deadline (unreachable tasks are retried until then)
  std::string tls_ca_file;   // TLS: the CA that signed the servers' certificates
  std::string tls_cert_file, tls_key_file;  // mutual TLS: this client's
};

// A variable a ClusterClient places: its name and shape.
struct VariableShape {
  std::string name;
  std::vector<int64_t> shape;
};

// An embedding table a ClusterClient creates: split by row over every ps
// task (row id mod the ps count), each row made on its ps from (seed, id).
struct TableOptions {
  int64_t rows = 0;  // 0: a dynamic table, keyed by any int64 id, rows made on first push
  int64_t dim = 16;
  uint64_t seed = 1;
  double init_scale = 0.05;  // rows start uniform in [-init_scale, init_scale]
  // A sparse optimizer, in training.optimizer's keys: sgd, adagrad,
  // lazy_adam or ftrl (with l1, l2, learning_rate_power).
  std::string optimizer_yaml = "{kind: adagrad, learning_rate: 0.05}";
  int64_t min_count = 0;      // dynamic: a row is made once its id was pushed this often
  int64_t steps_to_live = 0;  // dynamic: a row untouched for this many of its shard's pushes goes (0: never)
  // Dynamic: at most this many rows over all ps tasks (0: as many as fit in
  // what their variables and other tables leave of their memory); a full
  // table admits no new id, or with evict_when_full drops the rows no push
  // touched for longest to make room.
  int64_t max_rows = 0;
  bool evict_when_full = false;
  // With evict_when_full, which rows go: "lru" (those no push touched for
  // longest) or "lfu" (those pushes touched least often, the oldest among
  // equals; for ids whose popularity holds).
  std::string eviction = "lru";
};

// A parameter-server client: reads, assigns and applies gradients to
// variables by name on a cluster's ps tasks, with torch tensors.
// Thread-safe.
class ClusterClient {
 public:
  // `variables`: every variable the job's clients will use, in one order.
  // Each is placed on a ps task round robin in that order, so every client
  // given the same list finds each variable on the same task (as
  // TensorFlow's replica_device_setter).
  ClusterClient(const std::string& cluster_json, const std::vector<VariableShape>& variables,
                const ClusterClientOptions& options = {});
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Creates the variables with these initial values, trained on the ps by
  // the optimizer `optimizer_yaml` describes (the keys of
  // training.optimizer: "{kind: adam, learning_rate: 0.001}"; no
  // learning-rate decay unless it says so). Variables that exist already
  // keep their values.
  void Create(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
              const std::string& optimizer_yaml = "{kind: sgd, learning_rate: 0.01}");
  // Waits until every named variable exists (another client creates them).
  void WaitFor(const std::vector<std::string>& names, double timeout_s);
  std::vector<torch::Tensor> Read(const std::vector<std::string>& names);
  // Reads the named variables straight into `destinations` (same shapes
  // and dtypes: a model's parameters, for a pull), with one copy each.
  void ReadInto(const std::vector<std::string>& names, const std::vector<torch::Tensor>& destinations);
  void Assign(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values);
  // Applies gradients (float32, each its variable's shape) with each
  // variable's optimizer and adds `global_step_increment` to the counter
  // `global_step`; returns its new value.
  int64_t Apply(const std::vector<std::string>& names, const std::vector<torch::Tensor>& gradients,
                int64_t global_step_increment = 1);
  // Apply, then the variables' values right after it straight into
  // `destinations` (ReadInto): a push and the next pull in one round trip.
  int64_t ApplyAndReadInto(const std::vector<std::string>& names, const std::vector<torch::Tensor>& gradients,
                           const std::vector<torch::Tensor>& destinations, int64_t global_step_increment = 1);
  // Creates an embedding table on every ps task; one that exists with the
  // same definition is left alone, one with another is refused.
  void CreateTable(const std::string& name, const TableOptions& options);
  // Whether the ids of a pull or push may repeat (kAny: the client finds
  // the distinct ones) or are distinct already (kDistinct: found by the
  // caller, as shoal::Embedding finds them with UniqueIds; not looked over
  // again, and a push whose ids repeat anyway is refused, naming the id).
  enum class RowIds { kAny, kDistinct };
  // The rows of `ids` (int64 [n]) as float32 [n, dim]: each distinct id is
  // pulled once, from its ps task.
  torch::Tensor PullRows(const std::string& table, const torch::Tensor& ids, RowIds ids_are = RowIds::kAny);
  // Pushes gradient rows (float32 [n, dim], one per id; with kAny the rows
  // of repeated ids are summed here) to the table's optimizer on the ps tasks.
  void PushRows(const std::string& table, const torch::Tensor& ids, const torch::Tensor& gradients,
                RowIds ids_are = RowIds::kAny);
  // How full a table is, over all its ps tasks: rows held, new ids a full
  // dynamic table turned away, rows evicted to make room (evict_when_full).
  struct TableStats {
    int64_t rows_held = 0;
    int64_t ids_refused = 0;
    int64_t rows_evicted = 0;
  };
  TableStats GetTableStats(const std::string& table);
  // Saves every variable of this client (values and optimizer slots) and
  // every table of the ps tasks as the checkpoint `dir`/ckpt-`step` (step
  // < 0: the global_step counter's value), then keeps the newest `keep`
  // (0: all). Each ps writes its own shard into the same folder of its own
  // checkpoint directory (VariableServer's, or `shoal server
  // --checkpoint_dir`), which must be `dir`, on a file system this client
  // reads. Returns the checkpoint's path.
  std::string Save(const std::string& dir, int64_t step = -1, int keep = 5);
  // Puts the newest complete checkpoint under `dir` back: the tables first
  // (they must exist, as create_table made them), then this client's
  // variables (which must exist too) with their slots, then global_step.
  // Onto any number of ps tasks. Returns its step, or -1 if `dir` holds no
  // checkpoint. A checkpoint that lacks a variable, or holds another shape,
  // is refused before anything changes.
  int64_t Restore(const std::string& dir);
  // Adds `delta` to a named counter (on the first ps task); returns its value.
  int64_t AddToCounter(const std::string& name, int64_t delta);
  // Asks every ps task to shut down (ends `shoal server` and VariableServer::Wait).
  void ShutdownServers();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A ps task's server in this process, over gRPC: what `shoal server` runs.
// A ClusterClient of the same process that names this address calls it
// directly, without sockets (its reads are still copies).
class VariableServer {
 public:
  // Listens on `address` ("127.0.0.1:2222"; port 0: one the system picks,
  // which address() then names). Without a token it serves
  // only a loopback address, as every shoal server does. With a
  // `checkpoint_dir` it writes and reads checkpoints there
  // (ClusterClient::Save and Restore); without one it refuses them.
  explicit VariableServer(const std::string& address, const std::string& token = "",
                          const std::string& checkpoint_dir = "");
  ~VariableServer();  // stops serving
  VariableServer(const VariableServer&) = delete;
  VariableServer& operator=(const VariableServer&) = delete;

  // Waits until a client asks this server to shut down, at most
  // `timeout_s`; returns whether one did.
  bool Wait(double timeout_s);
  // Where clients reach it: the address it was given, its port as bound.
  std::string address() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace shoal

#endif  // SHOAL_SHOAL_H_
