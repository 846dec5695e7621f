#include "shoal/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "shoal/config/config_reference.h"
#include "shoal/core/file.h"
#include "shoal/core/nearest_word.h"
#include "shoal/core/status.h"
#include "shoal/data/dataset.h"
#include "shoal/server/optimizer.h"
#include "shoal/strategy/training_mode.h"
#include "shoal/telemetry/trace.h"

namespace shoal {
namespace {

// While TraceConfigKeys parses, every key path a Section is asked for.
thread_local std::set<std::string>* g_keys_read = nullptr;

// Reads one YAML mapping, remembering which keys were used so that the rest
// can be reported as unknown.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  absl::Status Check() const {
    if (node_ && !node_.IsNull() && !node_.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat("config: '", path_, "' must be a mapping"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Get(const std::string& key, T* out) {
    Use(key);
    if (!node_ || !node_.IsMap() || !node_[key]) return absl::OkStatus();
    try {
      *out = node_[key].as<T>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat("config: '", Key(key), "' has a value of the wrong type"));
    }
    return absl::OkStatus();
  }

  bool Has(const std::string& key) const { return node_ && node_.IsMap() && node_[key]; }

  // The mappings of a list (`key: [{...}, {...}]`), each a section of its
  // own ("model.conv[1]"); empty when the key is absent.
  // With mappings_only false, an item may be any node (As reads it).
  absl::StatusOr<std::vector<Section>> Items(const std::string& key, bool mappings_only = true) {
    Use(key);
    std::vector<Section> items;
    if (!Has(key)) return items;
    const YAML::Node list = node_[key];
    if (!list.IsSequence()) return absl::InvalidArgumentError(absl::StrCat("config: '", Key(key), "' must be a list"));
    for (size_t i = 0; i < list.size(); ++i) {
      items.emplace_back(list[i], absl::StrCat(Key(key), "[", i, "]"));
      if (mappings_only) SHOAL_RETURN_IF_ERROR(items.back().Check());
    }
    return items;
  }

  bool IsMap() const { return node_ && node_.IsMap(); }

  // The whole node as a value (an item that is not a mapping).
  template <typename T>
  absl::Status As(T* out) const {
    try {
      *out = node_.as<T>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat("config: '", path_, "' has a value of the wrong type"));
    }
    return absl::OkStatus();
  }

  Section Child(const std::string& key) {
    Use(key);
    return Section(node_ && node_.IsMap() ? node_[key] : YAML::Node(), Key(key));
  }

  absl::Status CheckNoUnknownKeys() const {
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    for (const auto& kv : node_) {
      std::string key = kv.first.as<std::string>();
      if (!used_.count(key)) {
        std::set<std::string> known;
        for (const std::string& k : used_) known.insert(Key(k));
        return absl::InvalidArgumentError(
            absl::StrCat("config: unknown key '", Key(key), "'", DidYouMean(Key(key), known)));
      }
    }
    return absl::OkStatus();
  }

  std::string Key(const std::string& key) const { return path_.empty() ? key : absl::StrCat(path_, ".", key); }

 private:
  void Use(const std::string& key) {
    used_.insert(key);
    if (g_keys_read != nullptr) g_keys_read->insert(Key(key));
  }

  YAML::Node node_;
  std::string path_;
  std::set<std::string> used_;
};

// `o` holds the section's default: the keys given tune it, and a kind other
// than its own starts from that kind's defaults (every field 0), so that SGD
// named in a file does not inherit the default Adam's decay.
absl::Status ParseOptimizer(Section s, wire::OptimizerConfig* o) {
  SHOAL_RETURN_IF_ERROR(s.Check());
  std::string kind = o->kind();
  SHOAL_RETURN_IF_ERROR(s.Get("kind", &kind));
  if (kind != o->kind()) *o = wire::OptimizerConfig();  // the kind is set with the rest below
  double lr = o->learning_rate(), momentum = o->momentum(), beta1 = o->beta1(), beta2 = o->beta2(),
         epsilon = o->epsilon(), init = o->initial_accumulator_value(), decay = o->decay(),
         weight_decay = o->weight_decay(), lr_decay_rate = o->lr_decay_rate();
  int64_t lr_decay_steps = o->lr_decay_steps();
  double l1 = o->l1(), l2 = o->l2(), learning_rate_power = o->learning_rate_power();
  bool nesterov = o->nesterov(), centered = o->centered();
  SHOAL_RETURN_IF_ERROR(s.Get("learning_rate", &lr));
  SHOAL_RETURN_IF_ERROR(s.Get("momentum", &momentum));
  SHOAL_RETURN_IF_ERROR(s.Get("nesterov", &nesterov));
  SHOAL_RETURN_IF_ERROR(s.Get("beta1", &beta1));
  SHOAL_RETURN_IF_ERROR(s.Get("beta2", &beta2));
  SHOAL_RETURN_IF_ERROR(s.Get("epsilon", &epsilon));
  SHOAL_RETURN_IF_ERROR(s.Get("initial_accumulator_value", &init));
  SHOAL_RETURN_IF_ERROR(s.Get("decay", &decay));
  SHOAL_RETURN_IF_ERROR(s.Get("centered", &centered));
  SHOAL_RETURN_IF_ERROR(s.Get("weight_decay", &weight_decay));
  SHOAL_RETURN_IF_ERROR(s.Get("lr_decay_rate", &lr_decay_rate));
  SHOAL_RETURN_IF_ERROR(s.Get("lr_decay_steps", &lr_decay_steps));
  SHOAL_RETURN_IF_ERROR(s.Get("l1", &l1));
  SHOAL_RETURN_IF_ERROR(s.Get("l2", &l2));
  SHOAL_RETURN_IF_ERROR(s.Get("learning_rate_power", &learning_rate_power));
  SHOAL_RETURN_IF_ERROR(s.CheckNoUnknownKeys());
  o->set_kind(kind);
  o->set_learning_rate(lr);
  o->set_momentum(momentum);
  o->set_nesterov(nesterov);
  o->set_beta1(beta1);
  o->set_beta2(beta2);
  o->set_epsilon(epsilon);
  o->set_initial_accumulator_value(init);
  o->set_decay(decay);
  o->set_centered(centered);
  o->set_weight_decay(weight_decay);
  o->set_lr_decay_rate(lr_decay_rate);
  o->set_lr_decay_steps(lr_decay_steps);
  o->set_l1(l1);
  o->set_l2(l2);
  o->set_learning_rate_power(learning_rate_power);
  return absl::OkStatus();
}

// The keys of `model:` (also those of a gated network or master given as a
// model of its own).
absl::Status ParseModel(Section model, ModelConfig* m) {
  SHOAL_RETURN_IF_ERROR(model.Check());
  SHOAL_RETURN_IF_ERROR(model.Get("kind", &m->kind));
  SHOAL_RETURN_IF_ERROR(model.Get("path", &m->path));
  SHOAL_RETURN_IF_ERROR(model.Get("layers", &m->layers));
  SHOAL_RETURN_IF_ERROR(model.Get("activation", &m->activation));
  SHOAL_RETURN_IF_ERROR(model.Get("seed", &m->seed));
  if (m->kind == "click") m->loss = "logistic";  // its only loss: the key may be left out
  SHOAL_RETURN_IF_ERROR(model.Get("loss", &m->loss));
  Section click = model.Child("click");
  SHOAL_RETURN_IF_ERROR(click.Check());
  ClickConfig& k = m->click;
  SHOAL_RETURN_IF_ERROR(click.Get("arch", &k.arch));
  SHOAL_RETURN_IF_ERROR(click.Get("integer_features", &k.integer_features));
  SHOAL_RETURN_IF_ERROR(click.Get("categorical_features", &k.categorical_features));
  SHOAL_RETURN_IF_ERROR(click.Get("bag_size", &k.bag_size));
  SHOAL_RETURN_IF_ERROR(click.Get("pooling", &k.pooling));
  SHOAL_RETURN_IF_ERROR(click.Get("rows", &k.rows));
  SHOAL_RETURN_IF_ERROR(click.Get("dim", &k.dim));
  SHOAL_RETURN_IF_ERROR(click.Get("init_scale", &k.init_scale));
  SHOAL_RETURN_IF_ERROR(click.Get("min_count", &k.min_count));
  SHOAL_RETURN_IF_ERROR(click.Get("steps_to_live", &k.steps_to_live));
  SHOAL_RETURN_IF_ERROR(click.Get("max_rows", &k.max_rows));
  SHOAL_RETURN_IF_ERROR(click.Get("evict_when_full", &k.evict_when_full));
  SHOAL_RETURN_IF_ERROR(click.Get("eviction", &k.eviction));
  SHOAL_RETURN_IF_ERROR(click.Get("cache_rows", &k.cache_rows));
  SHOAL_RETURN_IF_ERROR(click.Get("cache_staleness", &k.cache_staleness));
  SHOAL_RETURN_IF_ERROR(click.Get("hidden", &k.hidden));
  SHOAL_RETURN_IF_ERROR(click.Get("bottom", &k.bottom));
  SHOAL_RETURN_IF_ERROR(ParseOptimizer(click.Child("optimizer"), &k.optimizer));
  SHOAL_RETURN_IF_ERROR(click.CheckNoUnknownKeys());
  CnnConfig& cnn = m->cnn;
  SHOAL_RETURN_IF_ERROR(model.Get("input_shape", &cnn.input_shape));
  if (model.Has("conv")) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<Section> layers, model.Items("conv"));
    cnn.conv.clear();
    for (Section& item : layers) {
      ConvLayerConfig layer;
      SHOAL_RETURN_IF_ERROR(item.Get("channels", &layer.channels));
      SHOAL_RETURN_IF_ERROR(item.Get("kernel", &layer.kernel));
      SHOAL_RETURN_IF_ERROR(item.Get("stride", &layer.stride));
      SHOAL_RETURN_IF_ERROR(item.Get("padding", &layer.padding));
      SHOAL_RETURN_IF_ERROR(item.Get("pool", &layer.pool));
      SHOAL_RETURN_IF_ERROR(item.CheckNoUnknownKeys());
      cnn.conv.push_back(layer);
    }
  }
  SHOAL_RETURN_IF_ERROR(model.Get("batch_norm", &cnn.batch_norm));
  SHOAL_RETURN_IF_ERROR(model.Get("batch_norm_momentum", &cnn.batch_norm_momentum));
  SHOAL_RETURN_IF_ERROR(model.Get("dense", &cnn.dense));
  SHOAL_RETURN_IF_ERROR(model.Get("dropout", &cnn.dropout));
  SHOAL_RETURN_IF_ERROR(model.Get("classes", &cnn.classes));
  return model.CheckNoUnknownKeys();
}

// gated.networks: each entry a list of hidden sizes or a model's mapping.
absl::Status ParseGatedNetworks(Section& gated, std::vector<GatedNetworkConfig>* networks) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<Section> items, gated.Items("networks", /*mappings_only=*/false));
  if (items.empty()) return absl::OkStatus();
  networks->clear();
  for (Section& item : items) {
    GatedNetworkConfig network;
    if (item.IsMap()) {
      network.model.emplace();
      network.model->layers = {};  // an mlp of its own names its layers
      SHOAL_RETURN_IF_ERROR(ParseModel(item, &*network.model));
    } else {
      SHOAL_RETURN_IF_ERROR(item.As(&network.hidden));
    }
    networks->push_back(std::move(network));
  }
  return absl::OkStatus();
}

absl::Status ParseAll(const YAML::Node& root, JobConfig* c) {
  Section top(root, "");
  SHOAL_RETURN_IF_ERROR(top.Check());

  Section cluster = top.Child("cluster");
  SHOAL_RETURN_IF_ERROR(cluster.Check());
  SHOAL_RETURN_IF_ERROR(cluster.Get("ps", &c->cluster.ps));
  SHOAL_RETURN_IF_ERROR(cluster.Get("workers", &c->cluster.workers));
  SHOAL_RETURN_IF_ERROR(cluster.Get("processes", &c->cluster.processes));
  SHOAL_RETURN_IF_ERROR(cluster.Get("cluster_file", &c->cluster.cluster_file));
  SHOAL_RETURN_IF_ERROR(cluster.Get("max_restarts", &c->cluster.max_restarts));
  SHOAL_RETURN_IF_ERROR(cluster.Get("threads_per_task", &c->cluster.threads_per_task));
  SHOAL_RETURN_IF_ERROR(cluster.CheckNoUnknownKeys());

  SHOAL_RETURN_IF_ERROR(ParseModel(top.Child("model"), &c->model));

  Section data = top.Child("data");
  SHOAL_RETURN_IF_ERROR(data.Check());
  SHOAL_RETURN_IF_ERROR(data.Get("format", &c->data.format));
  SHOAL_RETURN_IF_ERROR(data.Get("dir", &c->data.dir));
  SHOAL_RETURN_IF_ERROR(data.Get("train_features", &c->data.train_features));
  SHOAL_RETURN_IF_ERROR(data.Get("train_labels", &c->data.train_labels));
  SHOAL_RETURN_IF_ERROR(data.Get("test_features", &c->data.test_features));
  SHOAL_RETURN_IF_ERROR(data.Get("test_labels", &c->data.test_labels));
  SHOAL_RETURN_IF_ERROR(data.Get("train_file", &c->data.train_file));
  SHOAL_RETURN_IF_ERROR(data.Get("test_file", &c->data.test_file));
  Section normalize = data.Child("normalize");
  SHOAL_RETURN_IF_ERROR(normalize.Check());
  SHOAL_RETURN_IF_ERROR(normalize.Get("scale", &c->data.normalize.scale));
  for (auto [key, field] : {std::pair{"mean", &c->data.normalize.mean}, std::pair{"std", &c->data.normalize.std}}) {
    if (!normalize.Has(key)) continue;
    double value = 0;
    SHOAL_RETURN_IF_ERROR(normalize.Get(key, &value));
    *field = value;
  }
  SHOAL_RETURN_IF_ERROR(normalize.CheckNoUnknownKeys());
  SHOAL_RETURN_IF_ERROR(data.Get("train_examples", &c->data.train_examples));
  SHOAL_RETURN_IF_ERROR(data.Get("test_examples", &c->data.test_examples));
  SHOAL_RETURN_IF_ERROR(data.Get("leases", &c->data.leases));
  SHOAL_RETURN_IF_ERROR(data.Get("lease_shard_examples", &c->data.lease_shard_examples));
  SHOAL_RETURN_IF_ERROR(data.Get("lease_timeout_s", &c->data.lease_timeout_s));
  SHOAL_RETURN_IF_ERROR(data.CheckNoUnknownKeys());

  Section training = top.Child("training");
  SHOAL_RETURN_IF_ERROR(training.Check());
  SHOAL_RETURN_IF_ERROR(training.Get("mode", &c->training.mode));
  SHOAL_RETURN_IF_ERROR(training.Get("epochs", &c->training.epochs));
  SHOAL_RETURN_IF_ERROR(training.Get("max_steps", &c->training.max_steps));
  SHOAL_RETURN_IF_ERROR(training.Get("batch_size", &c->training.batch_size));
  SHOAL_RETURN_IF_ERROR(training.Get("use_locking", &c->training.use_locking));
  SHOAL_RETURN_IF_ERROR(training.Get("seed", &c->training.seed));
  SHOAL_RETURN_IF_ERROR(training.Get("replicas_to_aggregate", &c->training.replicas_to_aggregate));
  SHOAL_RETURN_IF_ERROR(training.Get("sync_timeout_s", &c->training.sync_timeout_s));
  SHOAL_RETURN_IF_ERROR(training.Get("buffer_publish_steps", &c->training.buffer_publish_steps));
  SHOAL_RETURN_IF_ERROR(training.Get("staleness", &c->training.staleness));
  c->training.optimizer = DefaultOptimizer(c->training.mode);
  SHOAL_RETURN_IF_ERROR(ParseOptimizer(training.Child("optimizer"), &c->training.optimizer));
  SHOAL_RETURN_IF_ERROR(training.CheckNoUnknownKeys());

  Section local = top.Child("local");
  SHOAL_RETURN_IF_ERROR(local.Check());
  SHOAL_RETURN_IF_ERROR(ParseOptimizer(local.Child("optimizer"), &c->local.optimizer));
  SHOAL_RETURN_IF_ERROR(local.Get("n_fetch", &c->local.n_fetch));
  SHOAL_RETURN_IF_ERROR(local.Get("n_push", &c->local.n_push));
  SHOAL_RETURN_IF_ERROR(local.Get("interval_steps", &c->local.interval_steps));
  SHOAL_RETURN_IF_ERROR(local.Get("warmup_steps", &c->local.warmup_steps));
  SHOAL_RETURN_IF_ERROR(local.Get("block_momentum", &c->local.block_momentum));
  SHOAL_RETURN_IF_ERROR(local.Get("block_learning_rate", &c->local.block_learning_rate));
  SHOAL_RETURN_IF_ERROR(local.Get("tau", &c->local.tau));
  SHOAL_RETURN_IF_ERROR(local.Get("alpha", &c->local.alpha));
  SHOAL_RETURN_IF_ERROR(local.Get("rho", &c->local.rho));
  SHOAL_RETURN_IF_ERROR(local.CheckNoUnknownKeys());

  Section population = top.Child("population");
  PopulationConfig& pc = c->population;
  SHOAL_RETURN_IF_ERROR(population.Check());
  SHOAL_RETURN_IF_ERROR(population.Get("workers_per_member", &pc.workers_per_member));
  SHOAL_RETURN_IF_ERROR(population.Get("variables_on", &pc.variables_on));
  SHOAL_RETURN_IF_ERROR(population.Get("policy", &pc.policy));
  SHOAL_RETURN_IF_ERROR(population.Get("ready_steps", &pc.ready_steps));
  SHOAL_RETURN_IF_ERROR(population.Get("eval_steps", &pc.eval_steps));
  SHOAL_RETURN_IF_ERROR(population.Get("probability", &pc.probability));
  SHOAL_RETURN_IF_ERROR(population.Get("loss_threshold", &pc.loss_threshold));
  SHOAL_RETURN_IF_ERROR(population.Get("loss_margin", &pc.loss_margin));
  SHOAL_RETURN_IF_ERROR(population.Get("fraction", &pc.fraction));
  SHOAL_RETURN_IF_ERROR(population.Get("explore", &pc.explore));
  SHOAL_RETURN_IF_ERROR(population.Get("resample_probability", &pc.resample_probability));
  SHOAL_RETURN_IF_ERROR(population.Get("explore_clamp", &pc.explore_clamp));
  SHOAL_RETURN_IF_ERROR(population.Get("draw_initial", &pc.draw_initial));
  SHOAL_RETURN_IF_ERROR(population.Get("learning_rate_range", &pc.learning_rate_range));
  SHOAL_RETURN_IF_ERROR(population.Get("momentum_range", &pc.momentum_range));
  SHOAL_RETURN_IF_ERROR(population.Get("weight_decay_range", &pc.weight_decay_range));
  SHOAL_RETURN_IF_ERROR(population.Get("batch_size_range", &pc.batch_size_range));
  SHOAL_RETURN_IF_ERROR(population.Get("inherit_slots", &pc.inherit_slots));
  SHOAL_RETURN_IF_ERROR(population.Get("validation_examples", &pc.validation_examples));
  SHOAL_RETURN_IF_ERROR(population.Get("peer_cache_steps", &pc.peer_cache_steps));
  SHOAL_RETURN_IF_ERROR(population.Get("peer_timeout_s", &pc.peer_timeout_s));
  SHOAL_RETURN_IF_ERROR(population.Get("lineage_dir", &pc.lineage_dir));
  SHOAL_RETURN_IF_ERROR(population.CheckNoUnknownKeys());

  Section gated = top.Child("gated");
  GatedModelConfig& g = c->gated;
  SHOAL_RETURN_IF_ERROR(gated.Check());
  SHOAL_RETURN_IF_ERROR(ParseGatedNetworks(gated, &g.networks));
  if (gated.Has("master")) {
    g.master.emplace();
    g.master->layers = {};
    SHOAL_RETURN_IF_ERROR(ParseModel(gated.Child("master"), &*g.master));
  }
  SHOAL_RETURN_IF_ERROR(gated.Get("trunk", &g.trunk));
  SHOAL_RETURN_IF_ERROR(gated.Get("master_hidden", &g.master_hidden));
  SHOAL_RETURN_IF_ERROR(gated.Get("output", &g.output));
  SHOAL_RETURN_IF_ERROR(gated.Get("scale", &g.scale));
  SHOAL_RETURN_IF_ERROR(gated.Get("master_loss", &g.master_loss));
  SHOAL_RETURN_IF_ERROR(gated.Get("master_sees_input", &g.master_sees_input));
  SHOAL_RETURN_IF_ERROR(gated.Get("master_loss_to_workers", &g.master_loss_to_workers));
  SHOAL_RETURN_IF_ERROR(gated.CheckNoUnknownKeys());

  Section hooks = top.Child("hooks");
  SHOAL_RETURN_IF_ERROR(hooks.Check());
  SHOAL_RETURN_IF_ERROR(hooks.Get("log_every_steps", &c->hooks.log_every_steps));
  SHOAL_RETURN_IF_ERROR(hooks.Get("nan_guard", &c->hooks.nan_guard));
  SHOAL_RETURN_IF_ERROR(hooks.Get("stop_at_step", &c->hooks.stop_at_step));
  SHOAL_RETURN_IF_ERROR(hooks.Get("metrics_dir", &c->hooks.metrics_dir));
  SHOAL_RETURN_IF_ERROR(hooks.Get("metrics_format", &c->hooks.metrics_format));
  SHOAL_RETURN_IF_ERROR(hooks.Get("metrics_every_steps", &c->hooks.metrics_every_steps));
  SHOAL_RETURN_IF_ERROR(hooks.Get("run_dir", &c->hooks.run_dir));
  SHOAL_RETURN_IF_ERROR(hooks.Get("run_name", &c->hooks.run_name));
  SHOAL_RETURN_IF_ERROR(hooks.Get("logdir", &c->hooks.logdir));
  SHOAL_RETURN_IF_ERROR(hooks.Get("metrics_port", &c->hooks.metrics_port));
  SHOAL_RETURN_IF_ERROR(hooks.Get("trace", &c->hooks.trace));
  SHOAL_RETURN_IF_ERROR(hooks.Get("trace_steps", &c->hooks.trace_steps));
  SHOAL_RETURN_IF_ERROR(hooks.CheckNoUnknownKeys());

  Section checkpoint = top.Child("checkpoint");
  SHOAL_RETURN_IF_ERROR(checkpoint.Check());
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("dir", &c->checkpoint.dir));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("every_steps", &c->checkpoint.every_steps));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("every_seconds", &c->checkpoint.every_seconds));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("keep", &c->checkpoint.keep));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("restore", &c->checkpoint.restore));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("on_corrupt", &c->checkpoint.on_corrupt));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("background", &c->checkpoint.background));
  SHOAL_RETURN_IF_ERROR(checkpoint.Get("timeout_s", &c->checkpoint.timeout_s));
  SHOAL_RETURN_IF_ERROR(checkpoint.CheckNoUnknownKeys());

  Section security = top.Child("security");
  SHOAL_RETURN_IF_ERROR(security.Check());
  SHOAL_RETURN_IF_ERROR(security.Get("token_file", &c->security.token_file));
  SHOAL_RETURN_IF_ERROR(security.Get("tls_ca_file", &c->security.tls_ca_file));
  SHOAL_RETURN_IF_ERROR(security.Get("tls_cert_file", &c->security.tls_cert_file));
  SHOAL_RETURN_IF_ERROR(security.Get("tls_key_file", &c->security.tls_key_file));
  SHOAL_RETURN_IF_ERROR(security.Get("mutual_tls", &c->security.mutual_tls));
  SHOAL_RETURN_IF_ERROR(security.Get("insecure", &c->security.insecure));
  SHOAL_RETURN_IF_ERROR(security.CheckNoUnknownKeys());

  Section placement = top.Child("placement");
  SHOAL_RETURN_IF_ERROR(placement.Check());
  SHOAL_RETURN_IF_ERROR(placement.Get("strategy", &c->placement.strategy));
  SHOAL_RETURN_IF_ERROR(placement.Get("min_partition_bytes", &c->placement.min_partition_bytes));
  SHOAL_RETURN_IF_ERROR(placement.Get("max_partitions", &c->placement.max_partitions));
  std::vector<std::string> rules;
  SHOAL_RETURN_IF_ERROR(placement.Get("scope_rules", &rules));
  if (!rules.empty()) c->placement.scope_rules.clear();
  for (const std::string& text : rules) {
    auto rule = ParseScopeRule(text);
    if (!rule.ok()) return Annotate(rule.status(), "config: placement.scope_rules");
    c->placement.scope_rules.push_back(*rule);
  }
  SHOAL_RETURN_IF_ERROR(placement.CheckNoUnknownKeys());

  Section transport = top.Child("transport");
  SHOAL_RETURN_IF_ERROR(transport.Check());
  SHOAL_RETURN_IF_ERROR(transport.Get("kind", &c->transport.kind));
  SHOAL_RETURN_IF_ERROR(transport.Get("rpc_timeout_s", &c->transport.rpc_timeout_s));
  SHOAL_RETURN_IF_ERROR(transport.Get("startup_timeout_s", &c->transport.startup_timeout_s));
  SHOAL_RETURN_IF_ERROR(transport.Get("max_message_mb", &c->transport.max_message_mb));
  SHOAL_RETURN_IF_ERROR(transport.Get("connections_per_peer", &c->transport.connections_per_peer));
  SHOAL_RETURN_IF_ERROR(transport.CheckNoUnknownKeys());
  return top.CheckNoUnknownKeys();
}

absl::Status Positive(absl::string_view key, double value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("config: '", key, "' must be positive, is ", value));
}

absl::Status OneOf(absl::string_view key, const std::string& value, const std::vector<std::string>& known) {
  if (std::find(known.begin(), known.end(), value) != known.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("config: '", key, "' '", value, "' is unknown; known: ", absl::StrJoin(known, ", ")));
}

absl::Status Range(absl::string_view key, const std::vector<double>& range, bool positive) {
  if (range.size() == 2 && range[0] <= range[1] && (!positive || range[0] > 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("config: '", key, "' must be [low, high] with low <= high",
                                                 positive ? " and low > 0" : ""));
}

absl::Status ValidatePopulation(const JobConfig& c) {
  const PopulationConfig& p = c.population;
  SHOAL_RETURN_IF_ERROR(Positive("population.workers_per_member", p.workers_per_member));
  SHOAL_RETURN_IF_ERROR(OneOf("population.variables_on", p.variables_on, {"member", "ps"}));
  if (p.workers_per_member > 1 && p.variables_on != "ps") {
    return absl::InvalidArgumentError(
        "config: 'population.variables_on' must be ps when members have several workers (they share them there)");
  }
  SHOAL_RETURN_IF_ERROR(
      OneOf("population.policy", p.policy, {"none", "random", "loss_threshold", "truncation", "tournament"}));
  for (const std::string& name : p.explore) {
    SHOAL_RETURN_IF_ERROR(
        OneOf("population.explore", name, {"learning_rate", "momentum", "weight_decay", "batch_size"}));
  }
  if (p.ready_steps < 0) return absl::InvalidArgumentError("config: 'population.ready_steps' must not be negative");
  SHOAL_RETURN_IF_ERROR(Positive("population.eval_steps", static_cast<double>(p.eval_steps)));
  for (auto [key, value] : {std::pair{"population.probability", p.probability},
                            std::pair{"population.fraction", p.fraction},
                            std::pair{"population.resample_probability", p.resample_probability}}) {
    if (value < 0 || value > 1) {
      return absl::InvalidArgumentError(absl::StrCat("config: '", key, "' must be in [0, 1], is ", value));
    }
  }
  if (p.fraction > 0.5) return absl::InvalidArgumentError("config: 'population.fraction' must be at most 0.5");
  SHOAL_RETURN_IF_ERROR(Range("population.learning_rate_range", p.learning_rate_range, true));
  SHOAL_RETURN_IF_ERROR(Range("population.momentum_range", p.momentum_range, false));
  SHOAL_RETURN_IF_ERROR(Range("population.weight_decay_range", p.weight_decay_range, true));
  SHOAL_RETURN_IF_ERROR(Range("population.batch_size_range", p.batch_size_range, true));
  SHOAL_RETURN_IF_ERROR(Positive("population.validation_examples", static_cast<double>(p.validation_examples)));
  SHOAL_RETURN_IF_ERROR(Positive("population.peer_timeout_s", p.peer_timeout_s));
  if (p.peer_cache_steps < 0) return absl::InvalidArgumentError("config: 'population.peer_cache_steps' must not be negative");
  if (p.lineage_dir.empty()) return absl::InvalidArgumentError("config: 'population.lineage_dir' must not be empty");
  return absl::OkStatus();
}

void EmitOptimizer(YAML::Emitter& out, const wire::OptimizerConfig& o) {
  out << YAML::BeginMap << YAML::Key << "kind" << YAML::Value << o.kind() << YAML::Key << "learning_rate"
      << YAML::Value << o.learning_rate() << YAML::Key << "momentum" << YAML::Value << o.momentum() << YAML::Key
      << "nesterov" << YAML::Value << o.nesterov() << YAML::Key << "beta1" << YAML::Value << o.beta1() << YAML::Key
      << "beta2" << YAML::Value << o.beta2() << YAML::Key << "epsilon" << YAML::Value << o.epsilon() << YAML::Key
      << "initial_accumulator_value" << YAML::Value << o.initial_accumulator_value() << YAML::Key << "decay"
      << YAML::Value << o.decay() << YAML::Key << "centered" << YAML::Value << o.centered() << YAML::Key
      << "weight_decay" << YAML::Value << o.weight_decay() << YAML::Key << "lr_decay_rate" << YAML::Value
      << o.lr_decay_rate() << YAML::Key << "lr_decay_steps" << YAML::Value << o.lr_decay_steps() << YAML::Key << "l1"
      << YAML::Value << o.l1() << YAML::Key << "l2" << YAML::Value << o.l2() << YAML::Key << "learning_rate_power"
      << YAML::Value << o.learning_rate_power() << YAML::EndMap;
}

}  // namespace

JobConfig DefaultJobConfig() {
  JobConfig c;
  c.data.dir = kDefaultFashionMnistDir;
  c.training.optimizer = DefaultOptimizer(c.training.mode);
  c.local.optimizer = DefaultOptimizer("async");
  return c;
}

absl::Status ValidateJobConfig(const JobConfig& c) {
  SHOAL_RETURN_IF_ERROR(Positive("cluster.ps", c.cluster.ps));
  SHOAL_RETURN_IF_ERROR(Positive("cluster.workers", c.cluster.workers));
  if (c.cluster.max_restarts < 0) return absl::InvalidArgumentError("config: 'cluster.max_restarts' must not be negative");
  if (c.cluster.threads_per_task < 0) {
    return absl::InvalidArgumentError("config: 'cluster.threads_per_task' must not be negative (0 = derive it)");
  }
  SHOAL_RETURN_IF_ERROR(Annotate(ValidateModelConfig(c.model), "config"));
  SHOAL_RETURN_IF_ERROR(Annotate(ValidateDataConfig(c.data), "config"));
  if (c.data.train_examples < 0 || c.data.test_examples < 0) {
    return absl::InvalidArgumentError("config: 'data.train_examples' and 'data.test_examples' must not be negative");
  }
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(c.training.mode));
  if (c.data.leases) {
    if (c.data.lease_shard_examples < 0) {
      return absl::InvalidArgumentError("config: 'data.lease_shard_examples' must not be negative (0 = derive it)");
    }
    SHOAL_RETURN_IF_ERROR(Positive("data.lease_timeout_s", c.data.lease_timeout_s));
    if (!mode->LeasesData()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: 'data.leases' works with training.mode async, sync, downpour, model_average and easgd, not ",
          c.training.mode));
    }
  }
  if (mode->ClassifiesOnly() && c.model.loss != "cross_entropy") {
    return absl::InvalidArgumentError(absl::StrCat("config: training.mode ", c.training.mode,
                                                   " classifies (model.loss cross_entropy), not ", c.model.loss));
  }
  if (c.training.replicas_to_aggregate < 0) {
    return absl::InvalidArgumentError("config: 'training.replicas_to_aggregate' must not be negative");
  }
  SHOAL_RETURN_IF_ERROR(Positive("training.sync_timeout_s", c.training.sync_timeout_s));
  SHOAL_RETURN_IF_ERROR(Positive("training.buffer_publish_steps", c.training.buffer_publish_steps));
  SHOAL_RETURN_IF_ERROR(Positive("training.epochs", c.training.epochs));
  SHOAL_RETURN_IF_ERROR(Positive("training.batch_size", static_cast<double>(c.training.batch_size)));
  if (c.training.max_steps < 0) return absl::InvalidArgumentError("config: 'training.max_steps' must not be negative");
  SHOAL_RETURN_IF_ERROR(Annotate(Optimizer::Create(c.training.optimizer).status(), "config: training.optimizer"));
  SHOAL_RETURN_IF_ERROR(Annotate(Optimizer::Create(c.local.optimizer).status(), "config: local.optimizer"));
  SHOAL_RETURN_IF_ERROR(Positive("local.n_fetch", c.local.n_fetch));
  SHOAL_RETURN_IF_ERROR(Positive("local.n_push", c.local.n_push));
  SHOAL_RETURN_IF_ERROR(Positive("local.interval_steps", c.local.interval_steps));
  SHOAL_RETURN_IF_ERROR(Positive("local.tau", c.local.tau));
  SHOAL_RETURN_IF_ERROR(Positive("local.block_learning_rate", c.local.block_learning_rate));
  if (c.local.warmup_steps < 0) return absl::InvalidArgumentError("config: 'local.warmup_steps' must not be negative");
  if (c.local.block_momentum < 0 || c.local.block_momentum >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: 'local.block_momentum' must be in [0, 1), is ", c.local.block_momentum));
  }
  if (c.local.alpha < 0 || c.local.alpha > 1) {
    return absl::InvalidArgumentError(absl::StrCat("config: 'local.alpha' must be in [0, 1], is ", c.local.alpha));
  }
  if (c.local.rho < 0) return absl::InvalidArgumentError("config: 'local.rho' must not be negative");
  SHOAL_RETURN_IF_ERROR(ValidatePopulation(c));
  // The mode's own checks, against the cluster's workers when the config
  // gives them (a cluster file gives them only when the job starts).
  SHOAL_RETURN_IF_ERROR(mode->Validate(c, c.cluster.cluster_file.empty() ? c.cluster.workers : 0));
  SHOAL_RETURN_IF_ERROR(OneOf("checkpoint.on_corrupt", c.checkpoint.on_corrupt, {"fail", "fall_back"}));
  SHOAL_RETURN_IF_ERROR(OneOf("checkpoint.background", c.checkpoint.background, {"auto", "true", "false"}));
  SHOAL_RETURN_IF_ERROR(Positive("checkpoint.timeout_s", c.checkpoint.timeout_s));
  SHOAL_RETURN_IF_ERROR(OneOf("hooks.nan_guard", c.hooks.nan_guard, {"fail", "stop", "off"}));
  SHOAL_RETURN_IF_ERROR(OneOf("hooks.metrics_format", c.hooks.metrics_format, {"jsonl", "csv"}));
  if (c.hooks.run_name.find('/') != std::string::npos || c.hooks.run_name == "." || c.hooks.run_name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("hooks.run_name '", c.hooks.run_name,
                                                   "' must be one folder's name (no '/'): the folder under hooks.run_dir"));
  }
  if (c.hooks.log_every_steps < 0 || c.hooks.stop_at_step < 0) {
    return absl::InvalidArgumentError("config: 'hooks.log_every_steps' and 'hooks.stop_at_step' must not be negative");
  }
  SHOAL_RETURN_IF_ERROR(Positive("hooks.metrics_every_steps", static_cast<double>(c.hooks.metrics_every_steps)));
  if (c.hooks.metrics_port < 0 || c.hooks.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("config: 'hooks.metrics_port' is ", c.hooks.metrics_port,
                                                   ": give a TCP port (1 to 65535), or 0 for no metrics endpoint"));
  }
  TraceOptions trace_options;
  SHOAL_RETURN_IF_ERROR(ParseTraceSteps(c.hooks.trace_steps, &trace_options));
  if (c.checkpoint.every_steps < 0 || c.checkpoint.every_seconds < 0) {
    return absl::InvalidArgumentError("config: 'checkpoint.every_steps' and 'checkpoint.every_seconds' must not be negative");
  }
  SHOAL_RETURN_IF_ERROR(Positive("checkpoint.keep", c.checkpoint.keep));
  SHOAL_RETURN_IF_ERROR(OneOf("checkpoint.restore", c.checkpoint.restore, {"if_lost", "always"}));
  SHOAL_RETURN_IF_ERROR(OneOf("placement.strategy", c.placement.strategy, {"round_robin", "greedy"}));
  if (c.transport.kind != "auto" && c.transport.kind != "grpc" && c.transport.kind != "ucx") {
    return absl::InvalidArgumentError(
        absl::StrCat("transport.kind '", c.transport.kind, "' is not one of auto, grpc, ucx"));
  }
  if (c.transport.kind == "ucx" && (!c.security.tls_ca_file.empty() || !c.security.tls_cert_file.empty())) {
    return absl::InvalidArgumentError(
        "transport.kind ucx does not encrypt, and TLS is configured: use auto (gRPC carries everything under TLS) "
        "or grpc");
  }
  SHOAL_RETURN_IF_ERROR(Positive("transport.rpc_timeout_s", c.transport.rpc_timeout_s));
  SHOAL_RETURN_IF_ERROR(Positive("transport.startup_timeout_s", c.transport.startup_timeout_s));
  SHOAL_RETURN_IF_ERROR(Positive("transport.max_message_mb", static_cast<double>(c.transport.max_message_mb)));
  SHOAL_RETURN_IF_ERROR(Positive("transport.connections_per_peer", c.transport.connections_per_peer));
  return absl::OkStatus();
}

namespace {

// yaml-cpp keeps both entries of a repeated key and lookups see only the
// first, so `lr: 0.1` written twice would silently lose one: refuse it.
absl::Status CheckNoDuplicateKeys(const YAML::Node& node, const std::string& where) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      SHOAL_RETURN_IF_ERROR(CheckNoDuplicateKeys(node[i], absl::StrCat(where, "[", i, "]")));
    }
  }
  if (!node.IsMap()) return absl::OkStatus();
  std::set<std::string> keys;
  for (const auto& entry : node) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "(a non-scalar key)";
    const std::string path = where.empty() ? key : absl::StrCat(where, ".", key);
    if (!keys.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("config: key '", path, "' appears twice (line ",
                                                     entry.first.Mark().line + 1, ")"));
    }
    SHOAL_RETURN_IF_ERROR(CheckNoDuplicateKeys(entry.second, path));
  }
  return absl::OkStatus();
}

// `text` as a YAML tree; a parse error starts with `what`.
absl::StatusOr<YAML::Node> LoadYaml(const std::string& text, const std::string& what) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
  }
}

// Sets `key` ("training.optimizer.learning_rate") in the tree to the YAML
// `yaml_value` (`0.01`, `true`, `[256, 128]`, `{kind: adam}`), making the
// mappings on the way; `what` starts its errors. What the key names is
// checked when the tree is parsed, as any key of a file is, so a typo is an
// unknown key.
absl::Status SetKey(YAML::Node& root, const std::string& key, const std::string& yaml_value, const std::string& what) {
  const std::vector<std::string> path = absl::StrSplit(key, '.');
  if (absl::c_any_of(path, [](const std::string& part) { return part.empty(); })) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", key, "' is not a key path such as training.batch_size"));
  }
  SHOAL_ASSIGN_OR_RETURN(YAML::Node value, LoadYaml(yaml_value, absl::StrCat(what, ": '", yaml_value, "' is not YAML")));
  SHOAL_RETURN_IF_ERROR(CheckNoDuplicateKeys(value, key));
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(what, ": the config is not a mapping"));
  // reset(), not operator=: assigning a yaml-cpp node overwrites what it
  // refers to, where walking down must only move the handle.
  YAML::Node node;
  node.reset(root);
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    if (!node[path[i]] || node[path[i]].IsNull()) node[path[i]] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = node[path[i]];
    if (!child.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", absl::StrJoin(path.begin(), path.begin() + i + 1, "."),
                                                     "' is not a mapping, so it has no key '", path[i + 1], "'"));
    }
    node.reset(child);
  }
  node[path.back()] = value;
  return absl::OkStatus();
}

// A command line's `key.path=value`.
absl::Status ApplyOverride(YAML::Node& root, const std::string& assignment) {
  const size_t equals = assignment.find('=');
  const std::string what = absl::StrCat("config override '", assignment, "'");
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not KEY=VALUE (e.g. training.batch_size=64)"));
  }
  const std::string key = assignment.substr(0, equals);
  // YAML reads nothing as null, which a key would take as a value of the
  // wrong type (or, for a name, the name 'null'): say what is missing.
  if (absl::StripAsciiWhitespace(assignment.substr(equals + 1)).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " gives no value; for an empty string write ", key, "=\"\""));
  }
  return SetKey(root, key, assignment.substr(equals + 1), what);
}

}  // namespace

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::vector<std::string>& overrides) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml_text, "config is not valid YAML"));
  SHOAL_RETURN_IF_ERROR(CheckNoDuplicateKeys(root, ""));
  for (const std::string& assignment : overrides) SHOAL_RETURN_IF_ERROR(ApplyOverride(root, assignment));
  JobConfig config = DefaultJobConfig();
  SHOAL_RETURN_IF_ERROR(ParseAll(root, &config));
  SHOAL_RETURN_IF_ERROR(ValidateJobConfig(config));
  return config;
}

absl::StatusOr<ConfigKeysRead> TraceConfigKeys(const std::string& yaml_text) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml_text, "config is not valid YAML"));
  ConfigKeysRead read;
  JobConfig config = DefaultJobConfig();
  g_keys_read = &read.keys;
  const absl::Status parsed = ParseAll(root, &config);
  g_keys_read = nullptr;
  SHOAL_RETURN_IF_ERROR(parsed);
  read.yaml = JobConfigToYaml(config);
  return read;
}

absl::StatusOr<wire::OptimizerConfig> ParseOptimizerYaml(const std::string& yaml_text, const std::string& where) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml_text, absl::StrCat(where, ": '", yaml_text, "' is not YAML")));
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected a mapping such as {kind: sgd}"));
  SHOAL_RETURN_IF_ERROR(CheckNoDuplicateKeys(root, where));
  wire::OptimizerConfig optimizer;
  SHOAL_RETURN_IF_ERROR(ParseOptimizer(Section(root, where), &optimizer));
  return optimizer;
}

absl::StatusOr<std::string> SetConfigKey(const std::string& yaml_text, const std::string& key,
                                         const std::string& yaml_value) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml_text, "config is not valid YAML"));
  SHOAL_RETURN_IF_ERROR(SetKey(root, key, yaml_value, absl::StrCat("config: setting '", key, "'")));
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str());
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "config file"));
  auto config = ParseJobConfig(text, overrides);
  if (!config.ok()) return Annotate(config.status(), absl::StrCat("config file '", path, "'"));
  return config;
}

std::string JobModelSummary(const JobConfig& c) {
  auto mode = FindMode(c.training.mode);
  return mode.ok() ? (*mode)->Summary(c, c.cluster.workers) : ModelSummary(c.model);
}

namespace {

// A model's mapping, as ParseModel reads it.
void WriteModel(YAML::Emitter& out, const ModelConfig& m) {
  out << YAML::BeginMap << YAML::Key << "kind" << YAML::Value << m.kind;
  if (!m.path.empty()) out << YAML::Key << "path" << YAML::Value << m.path;
  out << YAML::Key << "layers" << YAML::Value << YAML::Flow << m.layers << YAML::Key << "activation" << YAML::Value
      << m.activation << YAML::Key << "seed" << YAML::Value << m.seed << YAML::Key << "loss" << YAML::Value << m.loss;
  if (m.kind == "cnn") {
    const CnnConfig& cnn = m.cnn;
    out << YAML::Key << "input_shape" << YAML::Value << YAML::Flow << cnn.input_shape << YAML::Key << "conv"
        << YAML::Value << YAML::BeginSeq;
    for (const ConvLayerConfig& layer : cnn.conv) {
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "channels" << YAML::Value << layer.channels << YAML::Key
          << "kernel" << YAML::Value << layer.kernel << YAML::Key << "stride" << YAML::Value << layer.stride
          << YAML::Key << "padding" << YAML::Value << layer.padding << YAML::Key << "pool" << YAML::Value
          << layer.pool << YAML::EndMap;
    }
    out << YAML::EndSeq << YAML::Key << "batch_norm" << YAML::Value << cnn.batch_norm << YAML::Key
        << "batch_norm_momentum" << YAML::Value << cnn.batch_norm_momentum << YAML::Key << "dense" << YAML::Value
        << YAML::Flow << cnn.dense << YAML::Key << "dropout" << YAML::Value << cnn.dropout << YAML::Key << "classes"
        << YAML::Value << cnn.classes;
  }
  if (m.kind == "click") {
    const ClickConfig& k = m.click;
    out << YAML::Key << "click" << YAML::Value << YAML::BeginMap << YAML::Key << "arch" << YAML::Value << k.arch
        << YAML::Key << "integer_features" << YAML::Value << k.integer_features << YAML::Key
        << "categorical_features" << YAML::Value << k.categorical_features << YAML::Key << "bag_size" << YAML::Value
        << k.bag_size << YAML::Key << "pooling" << YAML::Value << k.pooling << YAML::Key << "rows" << YAML::Value
        << k.rows << YAML::Key << "dim" << YAML::Value << k.dim << YAML::Key << "init_scale" << YAML::Value
        << k.init_scale << YAML::Key << "min_count" << YAML::Value << k.min_count << YAML::Key << "steps_to_live"
        << YAML::Value << k.steps_to_live << YAML::Key << "max_rows" << YAML::Value << k.max_rows
        << YAML::Key << "evict_when_full" << YAML::Value << k.evict_when_full << YAML::Key << "eviction"
        << YAML::Value << k.eviction
        << YAML::Key << "cache_rows" << YAML::Value << k.cache_rows << YAML::Key
        << "cache_staleness" << YAML::Value << k.cache_staleness << YAML::Key << "hidden" << YAML::Value << YAML::Flow << k.hidden
        << YAML::Key << "bottom" << YAML::Value << YAML::Flow << k.bottom << YAML::Key << "optimizer"
        << YAML::Value;
    EmitOptimizer(out, k.optimizer);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string JobConfigToYaml(const JobConfig& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap << YAML::Key << "ps" << YAML::Value << c.cluster.ps
      << YAML::Key << "workers" << YAML::Value << c.cluster.workers << YAML::Key << "processes" << YAML::Value
      << c.cluster.processes << YAML::Key << "cluster_file" << YAML::Value << c.cluster.cluster_file << YAML::Key
      << "max_restarts" << YAML::Value << c.cluster.max_restarts << YAML::Key << "threads_per_task" << YAML::Value
      << c.cluster.threads_per_task << YAML::EndMap;
  out << YAML::Key << "model" << YAML::Value;
  WriteModel(out, c.model);
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap << YAML::Key << "format" << YAML::Value
      << c.data.format << YAML::Key << "dir" << YAML::Value << c.data.dir;
  if (c.data.format == "npy") {
    out << YAML::Key << "train_features" << YAML::Value << c.data.train_features << YAML::Key << "train_labels"
        << YAML::Value << c.data.train_labels << YAML::Key << "test_features" << YAML::Value << c.data.test_features
        << YAML::Key << "test_labels" << YAML::Value << c.data.test_labels;
  }
  if (c.data.format == "criteo") {
    out << YAML::Key << "train_file" << YAML::Value << c.data.train_file << YAML::Key << "test_file" << YAML::Value
        << c.data.test_file;
  }
  out << YAML::Key << "normalize" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "scale"
      << YAML::Value << c.data.normalize.scale;
  if (c.data.normalize.mean) out << YAML::Key << "mean" << YAML::Value << *c.data.normalize.mean;
  if (c.data.normalize.std) out << YAML::Key << "std" << YAML::Value << *c.data.normalize.std;
  out << YAML::EndMap << YAML::Key << "train_examples" << YAML::Value << c.data.train_examples << YAML::Key
      << "test_examples" << YAML::Value << c.data.test_examples << YAML::Key << "leases" << YAML::Value
      << c.data.leases << YAML::Key << "lease_shard_examples" << YAML::Value << c.data.lease_shard_examples
      << YAML::Key << "lease_timeout_s" << YAML::Value << c.data.lease_timeout_s << YAML::EndMap;
  out << YAML::Key << "training" << YAML::Value << YAML::BeginMap << YAML::Key << "mode" << YAML::Value
      << c.training.mode << YAML::Key << "epochs" << YAML::Value << c.training.epochs << YAML::Key << "max_steps"
      << YAML::Value << c.training.max_steps << YAML::Key << "batch_size" << YAML::Value << c.training.batch_size
      << YAML::Key << "use_locking" << YAML::Value << c.training.use_locking << YAML::Key << "seed" << YAML::Value
      << c.training.seed << YAML::Key << "replicas_to_aggregate" << YAML::Value << c.training.replicas_to_aggregate
      << YAML::Key << "sync_timeout_s" << YAML::Value << c.training.sync_timeout_s << YAML::Key
      << "buffer_publish_steps" << YAML::Value << c.training.buffer_publish_steps << YAML::Key << "staleness"
      << YAML::Value << c.training.staleness;
  out << YAML::Key << "optimizer" << YAML::Value;
  EmitOptimizer(out, c.training.optimizer);
  out << YAML::EndMap;
  const LocalReplicaConfig& l = c.local;
  out << YAML::Key << "local" << YAML::Value << YAML::BeginMap << YAML::Key << "optimizer" << YAML::Value;
  EmitOptimizer(out, l.optimizer);
  out << YAML::Key << "n_fetch" << YAML::Value << l.n_fetch << YAML::Key << "n_push" << YAML::Value << l.n_push
      << YAML::Key << "interval_steps" << YAML::Value << l.interval_steps << YAML::Key << "warmup_steps"
      << YAML::Value << l.warmup_steps << YAML::Key << "block_momentum" << YAML::Value << l.block_momentum
      << YAML::Key << "block_learning_rate" << YAML::Value << l.block_learning_rate << YAML::Key << "tau"
      << YAML::Value << l.tau << YAML::Key << "alpha" << YAML::Value << l.alpha << YAML::Key << "rho" << YAML::Value
      << l.rho << YAML::EndMap;
  const PopulationConfig& p = c.population;
  out << YAML::Key << "population" << YAML::Value << YAML::BeginMap << YAML::Key << "workers_per_member"
      << YAML::Value << p.workers_per_member << YAML::Key << "variables_on" << YAML::Value << p.variables_on
      << YAML::Key << "policy" << YAML::Value << p.policy << YAML::Key << "ready_steps" << YAML::Value
      << p.ready_steps << YAML::Key << "eval_steps" << YAML::Value << p.eval_steps << YAML::Key << "probability"
      << YAML::Value << p.probability << YAML::Key << "loss_threshold" << YAML::Value << p.loss_threshold
      << YAML::Key << "loss_margin" << YAML::Value << p.loss_margin << YAML::Key << "fraction" << YAML::Value
      << p.fraction << YAML::Key << "explore" << YAML::Value << YAML::Flow << p.explore << YAML::Key
      << "resample_probability" << YAML::Value << p.resample_probability << YAML::Key << "explore_clamp"
      << YAML::Value << p.explore_clamp << YAML::Key << "draw_initial"
      << YAML::Value << p.draw_initial << YAML::Key << "learning_rate_range" << YAML::Value << YAML::Flow
      << p.learning_rate_range << YAML::Key << "momentum_range" << YAML::Value << YAML::Flow << p.momentum_range
      << YAML::Key << "weight_decay_range" << YAML::Value << YAML::Flow << p.weight_decay_range << YAML::Key
      << "batch_size_range" << YAML::Value << YAML::Flow << p.batch_size_range << YAML::Key << "inherit_slots"
      << YAML::Value << p.inherit_slots << YAML::Key << "validation_examples" << YAML::Value
      << p.validation_examples << YAML::Key << "peer_cache_steps" << YAML::Value << p.peer_cache_steps << YAML::Key
      << "peer_timeout_s" << YAML::Value << p.peer_timeout_s << YAML::Key << "lineage_dir" << YAML::Value
      << p.lineage_dir << YAML::EndMap;
  const GatedModelConfig& g = c.gated;
  out << YAML::Key << "gated" << YAML::Value << YAML::BeginMap << YAML::Key << "networks" << YAML::Value
      << YAML::BeginSeq;
  for (const GatedNetworkConfig& network : g.networks) {
    if (network.model) {
      WriteModel(out, *network.model);
    } else {
      out << YAML::Flow << network.hidden;
    }
  }
  out << YAML::EndSeq;
  if (g.master) {
    out << YAML::Key << "master" << YAML::Value;
    WriteModel(out, *g.master);
  }
  out << YAML::Key << "trunk" << YAML::Value << YAML::Flow << g.trunk << YAML::Key
      << "master_hidden" << YAML::Value << YAML::Flow << g.master_hidden << YAML::Key << "output" << YAML::Value
      << g.output << YAML::Key << "scale" << YAML::Value << g.scale << YAML::Key << "master_loss" << YAML::Value
      << g.master_loss << YAML::Key << "master_sees_input" << YAML::Value << g.master_sees_input << YAML::Key
      << "master_loss_to_workers" << YAML::Value << g.master_loss_to_workers << YAML::EndMap;
  const HooksConfig& k = c.hooks;
  out << YAML::Key << "hooks" << YAML::Value << YAML::BeginMap << YAML::Key << "log_every_steps" << YAML::Value
      << k.log_every_steps << YAML::Key << "nan_guard" << YAML::Value << k.nan_guard << YAML::Key << "stop_at_step"
      << YAML::Value << k.stop_at_step << YAML::Key << "metrics_dir" << YAML::Value << k.metrics_dir << YAML::Key
      << "metrics_format" << YAML::Value << k.metrics_format << YAML::Key << "metrics_every_steps" << YAML::Value
      << k.metrics_every_steps << YAML::Key << "run_dir" << YAML::Value << k.run_dir << YAML::Key << "run_name"
      << YAML::Value << k.run_name << YAML::Key << "logdir" << YAML::Value << k.logdir << YAML::Key << "metrics_port"
      << YAML::Value << k.metrics_port << YAML::Key << "trace" << YAML::Value << k.trace << YAML::Key
      << "trace_steps" << YAML::Value << k.trace_steps << YAML::EndMap;
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap << YAML::Key << "dir" << YAML::Value
      << c.checkpoint.dir << YAML::Key << "every_steps" << YAML::Value << c.checkpoint.every_steps << YAML::Key
      << "every_seconds" << YAML::Value << c.checkpoint.every_seconds << YAML::Key << "keep" << YAML::Value
      << c.checkpoint.keep << YAML::Key << "restore" << YAML::Value << c.checkpoint.restore
      << YAML::Key << "on_corrupt" << YAML::Value << c.checkpoint.on_corrupt << YAML::Key << "background"
      << YAML::Value << c.checkpoint.background << YAML::Key << "timeout_s" << YAML::Value << c.checkpoint.timeout_s
      << YAML::EndMap;
  const SecurityConfig& sec = c.security;  // the token itself is never written out
  out << YAML::Key << "security" << YAML::Value << YAML::BeginMap << YAML::Key << "token_file" << YAML::Value
      << sec.token_file << YAML::Key << "tls_ca_file" << YAML::Value << sec.tls_ca_file << YAML::Key
      << "tls_cert_file" << YAML::Value << sec.tls_cert_file << YAML::Key << "tls_key_file" << YAML::Value
      << sec.tls_key_file << YAML::Key << "mutual_tls" << YAML::Value << sec.mutual_tls << YAML::Key << "insecure"
      << YAML::Value << sec.insecure << YAML::EndMap;
  std::vector<std::string> rules;
  for (const auto& r : c.placement.scope_rules) rules.push_back(r.pattern + "=" + r.task.ToString());
  out << YAML::Key << "placement" << YAML::Value << YAML::BeginMap << YAML::Key << "strategy" << YAML::Value
      << c.placement.strategy << YAML::Key << "min_partition_bytes" << YAML::Value << c.placement.min_partition_bytes
      << YAML::Key << "max_partitions" << YAML::Value << c.placement.max_partitions << YAML::Key << "scope_rules"
      << YAML::Value << YAML::Flow << rules << YAML::EndMap;
  out << YAML::Key << "transport" << YAML::Value << YAML::BeginMap << YAML::Key << "kind" << YAML::Value
      << c.transport.kind << YAML::Key << "rpc_timeout_s" << YAML::Value
      << c.transport.rpc_timeout_s << YAML::Key << "startup_timeout_s" << YAML::Value << c.transport.startup_timeout_s
      << YAML::Key << "max_message_mb" << YAML::Value << c.transport.max_message_mb << YAML::Key
      << "connections_per_peer" << YAML::Value << c.transport.connections_per_peer << YAML::EndMap;
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace shoal
