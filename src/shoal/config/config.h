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
#include "shoal/hooks/standard_hooks.h"
#include "shoal/placement/placement.h"
#include "shoal/strategy/strategy_config.h"

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

// The strategies' sections (StrategyConfig: model, training, local,
// population, gated, checkpoint, transport) and those the session reads.
struct JobConfig : StrategyConfig {
  ClusterConfig cluster;
  DataConfig data;
  HooksConfig hooks;
  SecurityConfig security;
  PlacementOptions placement;
};

JobConfig DefaultJobConfig();
// `overrides` are `key.path=value` settings applied over the file's
// ("training.optimizer.learning_rate=0.01", "model.hidden=[512, 256]"),
// in order, each as if the file said so: the value is read as YAML and
// the key checked as the file's keys are.
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::vector<std::string>& overrides = {});
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides = {});
// `yaml_text` with `key` ("training.epochs") set to the YAML `yaml_value`
// ("2"), the mappings on the way made; checked when parsed.
absl::StatusOr<std::string> SetConfigKey(const std::string& yaml_text, const std::string& key,
                                         const std::string& yaml_value);
// An optimizer from a YAML mapping of training.optimizer's keys
// ("{kind: adagrad, learning_rate: 0.05}"), checked as strictly, with
// `where` naming it in errors; keys it does not give stay unset.
absl::StatusOr<wire::OptimizerConfig> ParseOptimizerYaml(const std::string& yaml_text, const std::string& where);
// Checks cross-field consistency (also done by the parsers).
absl::Status ValidateJobConfig(const JobConfig& config);

// One line for logs naming what the job trains: ModelSummary, or a gated
// ensemble's networks and master.
std::string JobModelSummary(const JobConfig& config);

// YAML that ParseJobConfig reads back to the same config.
std::string JobConfigToYaml(const JobConfig& config);

}  // namespace shoal

#endif  // SHOAL_CONFIG_CONFIG_H_
