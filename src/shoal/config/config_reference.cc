#include "shoal/config/config_reference.h"

#include <yaml-cpp/yaml.h>

#include <regex>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

struct KeyDoc {
  const char* key;
  const char* meaning;
};

// In the order the page lists them. A section's line ("local.optimizer")
// stands for all of its keys.
constexpr KeyDoc kKeyDocs[] = {
    {"cluster.ps", "Parameter-server tasks of the local cluster."},
    {"cluster.workers", "Worker tasks (worker 0 is the chief unless a cluster names one)."},
    {"cluster.processes", "Run every task as its own process on this host (`--processes`); otherwise threads of one process."},
    {"cluster.cluster_file", "A real cluster's task addresses (JSON, as TF_CONFIG's `cluster`), for `shoal server` and `shoal worker`."},
    {"cluster.max_restarts", "Failed processes the local launcher restarts, all together, before it stops the job; a ps task only when the job keeps checkpoints."},
    {"cluster.threads_per_task", "BLAS threads per task; 0 derives them: `OPENBLAS_NUM_THREADS` if set, else a training task's share of its host's cores, 1 for a ps task."},

    {"model.kind", "`mlp`, `cnn`, `torchscript` (a saved module at `path`) or `click` (embedding tables and a dense part)."},
    {"model.path", "torchscript: the saved module (`torch.jit.save`); click with `arch: torchscript`: its dense part."},
    {"model.layers", "mlp: the dense sizes, input first and classes last."},
    {"model.activation", "mlp: `relu`, `tanh` or `sigmoid`."},
    {"model.seed", "Seed of the initial values (the chief draws them)."},
    {"model.loss", "`cross_entropy` or `mse`; a click model's is `logistic`."},
    {"model.input_shape", "cnn: one example's shape, channels first."},
    {"model.conv", "cnn: the convolution layers, in order."},
    {"model.conv[].channels", "cnn layer: output channels."},
    {"model.conv[].kernel", "cnn layer: square kernel size."},
    {"model.conv[].stride", "cnn layer: stride."},
    {"model.conv[].padding", "cnn layer: zero padding on each side (-1: kernel / 2)."},
    {"model.conv[].pool", "cnn layer: max-pooling window after it (0 or 1: none)."},
    {"model.batch_norm", "cnn: BatchNorm after every convolution; its moving statistics are published by the chief."},
    {"model.batch_norm_momentum", "cnn: BatchNorm's momentum for the moving statistics."},
    {"model.dense", "cnn: hidden dense sizes after the convolutions."},
    {"model.dropout", "cnn: dropout before each hidden dense layer (training only)."},
    {"model.classes", "cnn: output classes."},
    {"model.click.arch", "The dense part: `wide_deep`, `dlrm` or `torchscript` (`model.path`)."},
    {"model.click.integer_features", "Integer columns of an example (Criteo: 13)."},
    {"model.click.categorical_features", "Categorical columns (Criteo: 26)."},
    {"model.click.bag_size", "Ids per categorical feature (multi-hot; `-1` marks an empty slot)."},
    {"model.click.pooling", "How a feature's ids pool: `sum` or `mean`."},
    {"model.click.rows", "Rows of the shared table `embeddings`; an id is taken modulo it. 0 makes the table dynamic (any int64 id)."},
    {"model.click.dim", "Embedding width."},
    {"model.click.init_scale", "A row starts uniform in [-init_scale, init_scale], drawn from (seed, id) on the ps."},
    {"model.click.min_count", "Dynamic table: pushes of an id before it gets a row (until then its gradients are dropped)."},
    {"model.click.steps_to_live", "Dynamic table: a row untouched for this many of its shard's pushes is dropped (0: never)."},
    {"model.click.max_rows", "Dynamic table: rows over all ps tasks (0: bounded by the ps tasks' memory)."},
    {"model.click.evict_when_full", "Dynamic table: a full shard drops its least recently pushed rows to admit new ids, instead of refusing them."},
    {"model.click.eviction", "What a full shard drops first: `lru` or `lfu`."},
    {"model.click.cache_rows", "Worker-side cache of hot rows (0: off)."},
    {"model.click.cache_staleness", "Steps a cached row serves before it is pulled again."},
    {"model.click.hidden", "The deep part's hidden sizes (wide_deep) or the top MLP's (dlrm)."},
    {"model.click.bottom", "dlrm: the bottom MLP's hidden sizes (it ends at `dim`)."},
    {"model.click.optimizer", "The table's optimizer (same keys as `training.optimizer`; `sgd`, `adagrad`, `lazy_adam` or `ftrl`)."},

    {"data.format", "`idx` (MNIST-format files), `npy` (NumPy arrays) or `criteo` (tab-separated click logs)."},
    {"data.dir", "idx: the folder of the four MNIST-format files, gzipped or not."},
    {"data.train_features", "npy: training features, float32 or uint8, one example per row."},
    {"data.train_labels", "npy: training labels, integers."},
    {"data.test_features", "npy: test features."},
    {"data.test_labels", "npy: test labels."},
    {"data.train_file", "criteo: the training log."},
    {"data.test_file", "criteo: the test log."},
    {"data.normalize.scale", "Features are multiplied by this first (0: 1/255 for uint8 features, 1 for float32)."},
    {"data.normalize.mean", "Then this is subtracted (absent: Fashion-MNIST's mean for idx, 0 for npy)."},
    {"data.normalize.std", "Then they are divided by this (absent: Fashion-MNIST's for idx, 1 for npy)."},
    {"data.train_examples", "Use only the first N training examples (0: all)."},
    {"data.test_examples", "Use only the first N test examples (0: all)."},
    {"data.leases", "Lease the data: workers take shards of each epoch from ps:0 as they go, so that workers can "
                    "join, leave or die mid-job and every example is trained exactly once (async, sync, "
                    "downpour, model_average, easgd; any data format, embedding tables included). Off: each "
                    "worker reads its own slice."},
    {"data.lease_shard_examples", "Examples in a leased shard (0: about 1/16 of an epoch, a whole number of "
                                  "batches, at most 32)."},
    {"data.lease_timeout_s", "A lease whose holder sent no update for this long goes back to the queue, from "
                             "where every ps task applied it to."},

    {"training.mode", "`async`, `sync`, `ssp`, `downpour`, `model_average`, `easgd`, `population` or `gated`."},
    {"training.epochs", "Passes over the training set, all workers together."},
    {"training.max_steps", "Global steps to train; 0 derives them from `epochs`."},
    {"training.batch_size", "Examples per worker and step."},
    {"training.use_locking", "Plain SGD only: apply updates under the variable's lock (optimizers with slots always do)."},
    {"training.seed", "Seed of the data order and of each worker's shuffles."},
    {"training.replicas_to_aggregate", "sync: gradients averaged per step (0: every worker; fewer: the rest are backup workers)."},
    {"training.sync_timeout_s", "How long a barrier (sync, model averaging, gated, a population's rounds) waits before it names who is missing."},
    {"training.buffer_publish_steps", "How often the chief publishes BatchNorm's moving statistics."},
    {"training.staleness", "ssp: how many steps a worker may run ahead of the slowest."},
    {"training.optimizer.kind", "What the ps applies: `sgd`, `momentum`, `adagrad`, `adam` or `rmsprop` (a table's: `sgd`, `adagrad`, `lazy_adam` or `ftrl`). A named kind starts from its own defaults."},
    {"training.optimizer.learning_rate", "Learning rate (0: the kind's default)."},
    {"training.optimizer.momentum", "momentum, rmsprop: momentum."},
    {"training.optimizer.nesterov", "momentum: Nesterov's form."},
    {"training.optimizer.beta1", "adam: first-moment decay."},
    {"training.optimizer.beta2", "adam: second-moment decay."},
    {"training.optimizer.epsilon", "adam, adagrad, rmsprop: epsilon."},
    {"training.optimizer.initial_accumulator_value", "adagrad, ftrl: the accumulator's initial value."},
    {"training.optimizer.decay", "rmsprop: the square average's decay (rho)."},
    {"training.optimizer.centered", "rmsprop: centred form."},
    {"training.optimizer.weight_decay", "L2 weight decay added to the gradient."},
    {"training.optimizer.lr_decay_rate", "The learning rate decays as `lr_decay_rate^(applies / lr_decay_steps)` (0: no decay)."},
    {"training.optimizer.lr_decay_steps", "Period of the learning-rate decay."},
    {"training.optimizer.l1", "ftrl: L1 strength."},
    {"training.optimizer.l2", "ftrl: L2 strength."},
    {"training.optimizer.learning_rate_power", "ftrl: the learning rate's power."},

    {"local.optimizer", "Local replicas: trains each worker's own copy between exchanges (same keys as `training.optimizer`)."},
    {"local.n_fetch", "downpour: fetch the global values every N steps."},
    {"local.n_push", "downpour: push the accumulated updates every N steps."},
    {"local.interval_steps", "model_average: average every N local steps."},
    {"local.warmup_steps", "model_average: average every step for the first N steps."},
    {"local.block_momentum", "model_average: BMUF's block momentum (0: plain averaging)."},
    {"local.block_learning_rate", "model_average: BMUF's block learning rate."},
    {"local.tau", "easgd: exchange with the centre every N steps."},
    {"local.alpha", "easgd: moving rate (0: 0.9 / workers)."},
    {"local.rho", "easgd: the elastic penalty added to each local gradient (0: none)."},

    {"population.workers_per_member", "Workers training each member, data-parallel (more than 1 needs `variables_on: ps`)."},
    {"population.variables_on", "Where a member's variables live: `member` (its own task) or `ps`."},
    {"population.policy", "`none`, `random`, `loss_threshold`, `truncation` or `tournament`."},
    {"population.ready_steps", "Member steps between the policy's decisions."},
    {"population.eval_steps", "Member steps between fitness measurements."},
    {"population.probability", "random: the chance of copying a random member at a decision."},
    {"population.loss_threshold", "loss_threshold: copy the best member when the validation loss is above this."},
    {"population.loss_margin", "loss_threshold: or when it is worse than the best member's by more than this."},
    {"population.fraction", "truncation: the bottom share that copies the top share (at most 0.5)."},
    {"population.explore", "Hyper-parameters perturbed after a copy: any of `learning_rate`, `momentum`, `weight_decay`, `batch_size`."},
    {"population.resample_probability", "Chance that explore draws a hyper-parameter afresh from its range instead of scaling it by 0.8 or 1.2."},
    {"population.explore_clamp", "Keep perturbed values inside their ranges."},
    {"population.draw_initial", "Each member starts from hyper-parameters drawn from the ranges."},
    {"population.learning_rate_range", "Prior of the learning rate, log-uniform."},
    {"population.momentum_range", "Prior of the momentum, uniform."},
    {"population.weight_decay_range", "Prior of the weight decay, log-uniform."},
    {"population.batch_size_range", "Prior of the batch size, log-uniform."},
    {"population.inherit_slots", "A copy takes the donor's optimizer slots and step count too."},
    {"population.validation_examples", "Examples carved from the end of the training set to measure fitness (nobody trains on them)."},
    {"population.peer_cache_steps", "Reuse another member's weights read within this many steps."},
    {"population.peer_timeout_s", "Deadline of a read of another member; one that misses it is skipped."},
    {"population.lineage_dir", "Where each member's decisions (`member_<m>.jsonl`) and the family tree (`lineage.svg`) go."},

    {"gated.networks", "The worker networks: each a list of hidden sizes, or a model's keys (`{kind: torchscript, path: a.pt}`). Empty: one of `model.layers`' shape per worker task."},
    {"gated.master", "The master network, as a model's keys (absent: an MLP of `master_hidden`)."},
    {"gated.trunk", "Hidden sizes of a trunk the networks share (MLP networks only)."},
    {"gated.master_hidden", "The default master's hidden sizes."},
    {"gated.output", "The master's weights: `softmax` (summing to 1) or `sigmoid` (each in [0, 1])."},
    {"gated.scale", "How a weight scales a network's loss: `batch_mean` or `per_sample`."},
    {"gated.master_loss", "The master's loss against the networks' correctness: `mse` or `cross_entropy` (softmax only)."},
    {"gated.master_sees_input", "The master sees the input features beside the networks' logits."},
    {"gated.master_loss_to_workers", "The master's loss also flows back into the networks through their logits."},

    {"hooks.log_every_steps", "A line per worker every N local steps (0: none)."},
    {"hooks.nan_guard", "A non-finite loss or update: `fail` the job, `stop` it cleanly, or `off` (the servers still refuse it)."},
    {"hooks.stop_at_step", "Stop the job at this global step (0: never)."},
    {"hooks.metrics_dir", "Write each worker's metrics file here (`shoal plot` draws them)."},
    {"hooks.metrics_format", "`jsonl` or `csv`."},
    {"hooks.metrics_every_steps", "Local steps between metrics records (files, TensorBoard)."},
    {"hooks.run_dir", "The chief writes `<run_dir>/<run>/model.pt`, `weights.pt` and `report.json` (empty: none)."},
    {"hooks.run_name", "The run folder's name (empty: the start time)."},
    {"hooks.logdir", "TensorBoard event files go here (empty: none)."},
    {"hooks.metrics_port", "Serve Prometheus's `/metrics` on this port (0: off; `--processes`: task k on port + k)."},
    {"hooks.trace", "Write a Chrome trace to this file (empty: none)."},
    {"hooks.trace_steps", "The steps the trace keeps: `A:B`, or `N` for the last N."},

    {"checkpoint.dir", "Save checkpoints here and resume from the newest (empty: none)."},
    {"checkpoint.every_steps", "Save every N global steps (0: not by steps)."},
    {"checkpoint.every_seconds", "Save every N seconds (0: not by time)."},
    {"checkpoint.keep", "Checkpoints kept; older ones are deleted."},
    {"checkpoint.restore", "`if_lost` (restore a ps that lost its variables) or `always` (at every start)."},
    {"checkpoint.on_corrupt", "A checkpoint whose index cannot be read: `fail`, or `fall_back` to the one before."},
    {"checkpoint.background", "Train on while a checkpoint is written: `auto`, `true` or `false`."},
    {"checkpoint.timeout_s", "How long a task may take to write or read its shard."},

    {"security.token_file", "A file holding the job's shared token (or `SHOAL_TOKEN`); every call must carry it."},
    {"security.tls_ca_file", "TLS: the CA that verifies servers (and clients, with `mutual_tls`)."},
    {"security.tls_cert_file", "TLS: this task's certificate."},
    {"security.tls_key_file", "TLS: this task's private key."},
    {"security.mutual_tls", "Servers require client certificates signed by the CA."},
    {"security.insecure", "Allow listening beyond loopback without a token."},

    {"placement.strategy", "How variables go to ps tasks: `round_robin` (as `replica_device_setter`) or `greedy` by bytes."},
    {"placement.min_partition_bytes", "Split variables larger than this into row slices over the ps tasks (0: never)."},
    {"placement.max_partitions", "At most this many slices a variable."},
    {"placement.scope_rules", "Pin variables by name pattern: `\"worker_3/*=/job:worker/task:3\"`."},

    {"transport.kind", "`auto` (tensors over UCX, everything else over gRPC; gRPC only under TLS), `grpc` or `ucx`."},
    {"transport.rpc_timeout_s", "Every call's deadline."},
    {"transport.startup_timeout_s", "How long a task waits for the others (and for the chief's variables) at start."},
    {"transport.max_message_mb", "The largest message a task accepts."},
    {"transport.connections_per_peer", "gRPC: TCP connections to each task; UCX: lanes, each on its own loop thread."},
};

// Configs that between them take the parser through every branch. Those
// that give only a kind or a format also give that kind's defaults; the
// others set values of their own, so they only name keys.
struct Sample {
  const char* yaml;
  bool gives_defaults;
};
constexpr Sample kConfigsReachingEveryKey[] = {
    {"", true},
    {"model: {kind: click}", true},
    {"model: {kind: cnn}", true},
    {"data: {format: npy}", true},
    {"data: {format: criteo}", true},
    {"model: {kind: cnn, conv: [{}]}", false},
    {"data: {normalize: {mean: 0, std: 1}}", false},
    {"gated: {networks: [[8], {kind: mlp}], master: {}}", false},
};

std::string WithoutItemIndices(const std::string& key) {
  static const std::regex kIndex(R"(\[[0-9]+\])");
  return std::regex_replace(key, kIndex, "[]");
}

// A gated network or master given as a model has a model's keys, which
// `model.*` describes; the reference lists the two keys whole.
bool DescribedAsAWhole(const std::string& key) {
  return key.rfind("gated.master.", 0) == 0 || key.rfind("gated.networks[", 0) == 0;
}

absl::StatusOr<std::vector<ConfigKeysRead>> ReadEveryBranch() {
  std::vector<ConfigKeysRead> reads;
  for (const Sample& sample : kConfigsReachingEveryKey) {
    auto read = TraceConfigKeys(sample.yaml);
    if (!read.ok()) return Annotate(read.status(), absl::StrCat("config reference: parsing '", sample.yaml, "'"));
    if (!sample.gives_defaults) read->yaml.clear();
    reads.push_back(*std::move(read));
  }
  return reads;
}

// `key`'s node in `root`, walking its path ("training.optimizer.kind").
YAML::Node Find(const YAML::Node& root, const std::string& key) {
  // reset(), not operator=, which would overwrite the node walked from.
  YAML::Node node;
  node.reset(root);
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(key, '.'))) {
    if (!node.IsMap() || !node[part]) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node child = node[part];
    node.reset(child);
  }
  return node;
}

// A value as one short line: `[784, 256]`, `{kind: adam, learning_rate: 0.001}`;
// a mapping leaves out its fields at 0, false or empty (their defaults).
std::string Compact(const YAML::Node& node) {
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    double number = 0;
    if (text.find_first_of(".e") != std::string::npos && absl::SimpleAtod(text, &number)) return absl::StrCat(number);
    return text.empty() ? "\"\"" : text;
  }
  std::vector<std::string> parts;
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) parts.push_back(Compact(item));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  }
  if (node.IsMap()) {
    for (const auto& field : node) {
      const YAML::Node& value = field.second;
      if (value.IsScalar() && (value.Scalar() == "0" || value.Scalar() == "false" || value.Scalar().empty())) continue;
      parts.push_back(absl::StrCat(field.first.Scalar(), ": ", Compact(value)));
    }
    return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
  }
  return "";
}

// The default of `key`: its value in the first config that writes it (the
// one with no keys given, then those naming a kind or a format); "—" where
// none does (a key whose absence means something, such as
// data.normalize.mean).
std::string DefaultOf(const std::string& key, const std::vector<YAML::Node>& defaults) {
  if (key.find('[') == std::string::npos) {
    for (const YAML::Node& root : defaults) {
      const YAML::Node node = Find(root, key);
      if (node.IsDefined()) return absl::StrCat("`", Compact(node), "`");
    }
  }
  return "—";
}

const KeyDoc* DocOf(const std::string& key) {
  for (const KeyDoc& doc : kKeyDocs) {
    if (key == doc.key) return &doc;
  }
  return nullptr;
}

// The documented section that stands for `key`, if any ("local.optimizer"
// for "local.optimizer.kind").
const KeyDoc* SectionDocOf(const std::string& key) {
  for (const KeyDoc& doc : kKeyDocs) {
    const std::string section = doc.key;
    if (key.size() > section.size() && key.rfind(section, 0) == 0 &&
        (key[section.size()] == '.' || key[section.size()] == '[')) {
      return &doc;
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::set<std::string>> AllConfigKeys() {
  SHOAL_ASSIGN_OR_RETURN(const std::vector<ConfigKeysRead> reads, ReadEveryBranch());
  std::set<std::string> keys;
  for (const ConfigKeysRead& read : reads) {
    for (const std::string& key : read.keys) {
      if (!DescribedAsAWhole(key)) keys.insert(WithoutItemIndices(key));
    }
  }
  return keys;
}

absl::Status CheckConfigReference() {
  SHOAL_ASSIGN_OR_RETURN(const std::set<std::string> keys, AllConfigKeys());
  for (const std::string& key : keys) {
    const bool is_section = absl::c_any_of(keys, [&](const std::string& other) {
      return other.size() > key.size() && other.rfind(key + ".", 0) == 0;
    });
    if (is_section || DocOf(key) != nullptr || SectionDocOf(key) != nullptr) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "config reference: the parser reads '", key, "', which has no line in kKeyDocs (config/config_reference.cc)"));
  }
  for (const KeyDoc& doc : kKeyDocs) {
    if (!keys.count(doc.key)) {
      return absl::FailedPreconditionError(absl::StrCat("config reference: kKeyDocs describes '", doc.key,
                                                        "', which the parser does not read"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ConfigReferenceMarkdown() {
  SHOAL_ASSIGN_OR_RETURN(const std::vector<ConfigKeysRead> reads, ReadEveryBranch());
  std::vector<YAML::Node> defaults;  // parsed once, not once a key
  for (const ConfigKeysRead& read : reads) {
    if (!read.yaml.empty()) defaults.push_back(YAML::Load(read.yaml));
  }
  std::string page =
      "# Configuration reference\n\n"
      "Every key a job's YAML file (or `--set KEY=VALUE`) may give, with its default and what it does. Every key is "
      "optional; an unknown key, a value of the wrong type or out of range is refused with the key's path.\n\n"
      "This page is generated from the parser's own keys by `shoal config --reference`, and a test fails when it "
      "differs from what that prints, so it cannot drift from the code. To change it, change the parser and "
      "`src/shoal/config/config_reference.cc`, then run `build/shoal config --reference > "
      "docs/reference/configuration.md`.\n\n"
      "`shoal train --print_config` prints the config that a file, `--set` and the flags make together. A default "
      "of 0 for an optimizer field means the kind's own default; with no `training.optimizer`, each mode has its "
      "own (Adam 0.001 in most, Adagrad in downpour, momentum SGD in population).\n";
  std::string section;
  for (const KeyDoc& doc : kKeyDocs) {
    const std::string key = doc.key;
    const std::string top = key.substr(0, key.find('.'));
    if (top != section) {
      section = top;
      absl::StrAppend(&page, "\n## ", section, "\n\n| key | default | what it does |\n|---|---|---|\n");
    }
    absl::StrAppend(&page, "| `", key, "` | ", DefaultOf(key, defaults), " | ",
                    absl::StrReplaceAll(doc.meaning, {{"|", "\\|"}}), " |\n");
  }
  return page;
}

}  // namespace shoal
