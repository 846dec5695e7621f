// JobConfig: everything a training job needs, from a YAML file, flags, or
// defaults (the defaults are the main job: 2 ps, 2 workers, async, the
// 784-256-128-10 MLP on Fashion-MNIST for 5 epochs).
//
// Parsing is strict: an unknown key, a value of the wrong type or out of
// range is an error naming the key path ("training.batch_size"), so a typo
// never silently falls back to a default. The library never reads the
// environment; the CLI folds flags and TF_CONFIG into a JobConfig.
#ifndef SHOAL_CONFIG_CONFIG_H_
#define SHOAL_CONFIG_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/data/data_source.h"
#include "shoal/model/gated_ensemble.h"
#include "shoal/model/model_factory.h"
#include "shoal/placement/placement.h"
#include "shoal/wire.pb.h"

namespace shoal {

struct ClusterConfig {
  int ps = 2;
  int workers = 2;
  bool processes = false;    // separate processes over gRPC on loopback
  std::string cluster_file;  // a real cluster (shoal server / worker)
  // processes: how many times the launcher restarts tasks that fail, all
  // together, before it stops the job. A ps task is restarted only when the
  // job keeps checkpoints (it comes back empty; the chief restores it), and
  // only asynchronous training recovers from that so far.
  int max_restarts = 0;
  // Compute threads (BLAS and libtorch intra-op) per task; 0: OPENBLAS_NUM_THREADS
  // if set, else a training task's share of this host's cores, 1 for a ps task.
  int threads_per_task = 0;
};

struct TrainingConfig {
  // async | sync | ssp, a local-replica mode (downpour | model_average |
  // easgd), population, or gated (a master network weighing K networks)
  std::string mode = "async";
  int epochs = 5;
  int64_t max_steps = 0;  // 0: epochs * train_examples / batch_size
  int64_t batch_size = 64;
  wire::OptimizerConfig optimizer;  // default adam, learning_rate 0.001
  bool use_locking = false;
  uint64_t seed = 1;
  // sync (SyncReplicas): gradients averaged per step; 0 = every worker. Fewer
  // than the workers leaves the rest as backups, whose late gradients are
  // dropped. More than the workers is refused.
  int replicas_to_aggregate = 0;
  double sync_timeout_s = 60;  // a step that cannot complete in this time fails, naming who is missing
  // async, sync, ssp: the chief publishes the model's buffers (BatchNorm
  // statistics) to the ps every this many of its steps, and at its last.
  int64_t buffer_publish_steps = 50;
  // ssp (stale synchronous parallel): a worker runs at most `staleness` steps
  // ahead of the slowest; 0 is bulk-synchronous, negative is unbounded (async).
  int staleness = 2;
};

// Local replicas (DistBelief): each worker trains its own copy of the model
// with `optimizer` and exchanges with the ps only now and then.
struct LocalReplicaConfig {
  wire::OptimizerConfig optimizer;  // trains the local copy; default: adam 0.001
  // downpour: fetch the global values every n_fetch steps; push the summed
  // gradients every n_push steps (the ps applies training.optimizer, adagrad
  // unless the config names one).
  int n_fetch = 4;
  int n_push = 4;
  // model_average: after warmup_steps (averaged every step), average the
  // local copies every interval_steps at a barrier. block_momentum > 0 turns
  // on BMUF: bg = m*bg + block_learning_rate*(global - average); global -= bg.
  int interval_steps = 8;
  int warmup_steps = 0;
  double block_momentum = 0;
  double block_learning_rate = 1;
  // easgd: every tau steps, d = alpha*(x - centre); x -= d; centre += d.
  // alpha 0 means 0.9 / workers. rho > 0 adds rho*(x - centre) to each local
  // gradient (the elastic penalty, with the last centre read).
  int tau = 8;
  double alpha = 0;
  double rho = 0;
};

// Populations (mode population): every member trains its own model under its
// own scope (worker_<m>/...), readable by every task; a policy decides when a
// member copies another's weights (exploit) and perturbs its hyper-parameters
// (explore), as population-based training does.
struct PopulationConfig {
  int workers_per_member = 1;          // > 1: data-parallel members (asynchronous within a member)
  std::string variables_on = "member";  // member: on the member's first worker task; ps: on the ps tasks
  // none | random | loss_threshold | truncation | tournament
  std::string policy = "truncation";
  int64_t ready_steps = 0;       // consult the policy every N member steps; 0: 1 for random, else eval_steps
  int64_t eval_steps = 100;      // measure fitness on the validation split every N member steps
  double probability = 0.15;     // random: chance per step of copying a uniformly chosen other member
  double loss_threshold = 0;     // loss_threshold: copy the best when own validation loss exceeds this (0: off)
  double loss_margin = 0.1;      // ... or exceeds the best member's by this margin
  double fraction = 0.25;        // truncation: the bottom fraction copies from the top fraction
  std::vector<std::string> explore = {"learning_rate"};  // also momentum, weight_decay, batch_size
  double resample_probability = 0.25;
  // Whether a perturbed value (x0.8 or x1.2) is clamped to its prior's range.
  // false, the PBT paper's: perturbations go past the prior; momentum stays
  // below 1 either way.
  bool explore_clamp = false;
  bool draw_initial = true;      // each member draws its explored hyper-parameters from the priors
  // Priors: log-uniform for learning_rate, weight_decay, batch_size; uniform for momentum.
  std::vector<double> learning_rate_range = {1e-4, 1e-1};
  std::vector<double> momentum_range = {0.5, 0.99};
  std::vector<double> weight_decay_range = {1e-6, 1e-2};
  std::vector<double> batch_size_range = {16, 256};
  bool inherit_slots = false;    // exploit also copies the optimizer slots, bit for bit
  int64_t validation_examples = 5000;  // carved from the end of the training set, never trained on
  int64_t peer_cache_steps = 0;  // reuse a peer's values read within this many member steps (0: always read)
  double peer_timeout_s = 5;     // a peer that does not answer in this time is skipped, with a warning
  std::string lineage_dir = "population";  // member_<m>.jsonl lineage logs and lineage.svg
};

// Hooks every worker runs (session/hooks.h).
struct HooksConfig {
  int64_t log_every_steps = 0;      // a log line per worker every N local steps; 0: off
  std::string nan_guard = "fail";   // non-finite loss or update: fail | stop | off
  int64_t stop_at_step = 0;         // the chief stops the job at this global step; 0: none
  std::string metrics_dir;          // per-task metrics files here; empty: none
  std::string metrics_format = "jsonl";  // jsonl | csv
  int64_t metrics_every_steps = 10;
};

// Checkpoints (checkpoint/checkpoint.h): the chief saves every variable
// with its optimizer slots under `dir` every `every_steps` global steps or
// `every_seconds` (whichever comes first; with neither set, every 60 s) and
// at the end, keeps the newest `keep`, and restores the newest when a job
// starts on ps tasks that do not hold the variables.
struct CheckpointConfig {
  std::string dir;  // empty: no checkpoints
  int64_t every_steps = 0;
  double every_seconds = 0;
  int keep = 5;
  // When a (re)starting chief restores the newest checkpoint: if_lost, only
  // when the ps tasks lack some variable (live values are newer: nothing is
  // thrown away); always, as TensorFlow's chief does, rolling live ps tasks
  // back to the checkpoint.
  std::string restore = "if_lost";
  // A checkpoint whose index is unreadable: fail (DATA_LOSS naming the file)
  // or fall_back (start from the newest intact one, with a warning).
  std::string on_corrupt = "fail";
};

// Securing a cluster on a network (gRPC only; in-process needs none).
struct SecurityConfig {
  // A file holding a shared token that every call carries and every server
  // checks. The CLI also takes it from the environment (SHOAL_TOKEN) into
  // `token`, which is never written out with the config.
  std::string token_file;
  std::string token;
  // TLS from PEM files: servers present cert_file/key_file, clients verify
  // them against ca_file; with mutual_tls servers require client
  // certificates signed by ca_file, and clients present theirs.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  bool mutual_tls = false;
  // A server that listens beyond loopback without a token refuses to start
  // (anyone who reached its port could overwrite the model or stop the job)
  // unless this says so explicitly.
  bool insecure = false;
};

struct TransportConfig {
  double rpc_timeout_s = 60;
  double startup_timeout_s = 120;  // how long tasks wait for each other at start
  int64_t max_message_mb = 512;
  int connections_per_peer = 2;
};

struct JobConfig {
  ClusterConfig cluster;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  LocalReplicaConfig local;
  PopulationConfig population;
  GatedModelConfig gated;  // mode gated (model/gated_ensemble.h)
  HooksConfig hooks;
  CheckpointConfig checkpoint;
  SecurityConfig security;
  PlacementOptions placement;
  TransportConfig transport;
};

JobConfig DefaultJobConfig();
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text);
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);
// Checks cross-field consistency (also done by the parsers).
absl::Status ValidateJobConfig(const JobConfig& config);
// True for the modes where workers train local replicas.
bool IsLocalReplicaMode(const std::string& mode);
// The optimizer a mode's ps applies when the config names none (downpour:
// adagrad, as DistBelief; otherwise adam with decay).
wire::OptimizerConfig DefaultOptimizer(const std::string& mode);

// One line for logs naming what the job trains: ModelSummary, or a gated
// ensemble's networks and master.
std::string JobModelSummary(const JobConfig& config);

// YAML that ParseJobConfig reads back to the same config.
std::string JobConfigToYaml(const JobConfig& config);

}  // namespace shoal

#endif  // SHOAL_CONFIG_CONFIG_H_
