#include "shoal/config/config.h"
#include "shoal/config/config_reference.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "temp_dir.h"
#include "source_paths.h"

namespace shoal {
namespace {

TEST(ConfigTest, DefaultsAreTheMainJob) {
  JobConfig c = DefaultJobConfig();
  EXPECT_EQ(c.cluster.ps, 2);
  EXPECT_EQ(c.cluster.workers, 2);
  EXPECT_EQ(c.model.layers, (std::vector<int64_t>{784, 256, 128, 10}));
  EXPECT_EQ(c.training.mode, "async");
  EXPECT_EQ(c.training.optimizer.kind(), "adam");
  EXPECT_EQ(c.data.dir, "/usr/share/datasets/fashion-mnist");
  EXPECT_TRUE(ValidateJobConfig(c).ok());
}

TEST(ConfigTest, ParsesEverySection) {
  auto c = ParseJobConfig(R"(
cluster: {ps: 3, workers: 4, processes: true}
model: {layers: [784, 64, 10], activation: tanh, seed: 9}
data: {dir: /tmp/x, train_examples: 1000}
training:
  epochs: 2
  batch_size: 32
  use_locking: true
  optimizer: {kind: momentum, learning_rate: 0.05, momentum: 0.8, nesterov: true}
placement:
  strategy: greedy
  min_partition_bytes: 65536
  scope_rules: ["worker_1/*=/job:worker/task:1"]
transport: {rpc_timeout_s: 5}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.ps, 3);
  EXPECT_TRUE(c->cluster.processes);
  EXPECT_EQ(c->model.layers.size(), 3u);
  EXPECT_EQ(c->model.activation, "tanh");
  EXPECT_EQ(c->data.train_examples, 1000);
  EXPECT_EQ(c->training.batch_size, 32);
  EXPECT_TRUE(c->training.use_locking);
  EXPECT_EQ(c->training.optimizer.kind(), "momentum");
  EXPECT_TRUE(c->training.optimizer.nesterov());
  EXPECT_EQ(c->placement.strategy, "greedy");
  ASSERT_EQ(c->placement.scope_rules.size(), 1u);
  EXPECT_EQ(c->placement.scope_rules[0].task, (TaskId{"worker", 1}));
  EXPECT_EQ(c->transport.rpc_timeout_s, 5);
}

TEST(ConfigTest, YamlRoundTrip) {
  auto c = ParseJobConfig("training: {optimizer: {kind: rmsprop, learning_rate: 0.003}, epochs: 3}\n"
                          "placement: {scope_rules: ['a/*=ps:1']}\n"
                          "checkpoint: {dir: /tmp/c, background: false, timeout_s: 120}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  auto again = ParseJobConfig(JobConfigToYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobConfigToYaml(*c);
  EXPECT_EQ(JobConfigToYaml(*again), JobConfigToYaml(*c));
  EXPECT_EQ(again->training.optimizer.kind(), "rmsprop");
  EXPECT_DOUBLE_EQ(again->training.optimizer.learning_rate(), 0.003);
  EXPECT_EQ(again->checkpoint.background, "false");  // what a job's processes are given
  EXPECT_EQ(again->checkpoint.timeout_s, 120);
  EXPECT_EQ(ParseJobConfig("checkpoint: {timeout_s: 0}").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJobConfig("checkpoint: {background: yes}").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, MalformedConfigsNameTheProblem) {
  struct Case {
    const char* yaml;
    const char* says;
  } cases[] = {
      {"cluster: {ps: 2, wrkers: 3}", "unknown key 'cluster.wrkers'"},
      {"trainig: {}", "unknown key 'trainig'"},
      {"training: {batch_size: many}", "'training.batch_size' has a value of the wrong type"},
      {"training: {batch_size: 0}", "'training.batch_size' must be positive"},
      {"training: {mode: telepathy}", "'training.mode' 'telepathy' is unknown"},
      {"training: {optimizer: {kind: adam, beta1: 2}}", "beta1"},
      {"model: {layers: [784]}", "model.layers"},
      {"model: {activation: swish}", "swish"},
      {"placement: {strategy: random}", "placement.strategy"},
      {"placement: {scope_rules: [nonsense]}", "scope rule"},
      {"cluster: [1, 2]", "'cluster' must be a mapping"},
      {"cluster: {ps: [1", "not valid YAML"},
  };
  for (const Case& c : cases) {
    auto config = ParseJobConfig(c.yaml);
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_NE(config.status().message().find(c.says), std::string::npos) << config.status() << " for " << c.yaml;
  }
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadJobConfig("/nonexistent/shoal.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(ConfigTest, ParsesSyncAndSspKeys) {
  auto sync = ParseJobConfig("cluster: {workers: 3}\ntraining: {mode: sync, replicas_to_aggregate: 2, sync_timeout_s: 5}");
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(sync->training.replicas_to_aggregate, 2);
  EXPECT_EQ(sync->training.sync_timeout_s, 5);
  auto ssp = ParseJobConfig("training: {mode: ssp, staleness: 0}");
  ASSERT_TRUE(ssp.ok()) << ssp.status();
  EXPECT_EQ(ssp->training.staleness, 0);
}

TEST(ConfigTest, MoreReplicasThanWorkersIsRefusedWithTheReason) {
  auto config = ParseJobConfig("cluster: {workers: 2}\ntraining: {mode: sync, replicas_to_aggregate: 3}");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("exceeds the number of workers (2)"), std::string::npos) << config.status();
  EXPECT_FALSE(ParseJobConfig("training: {mode: sync, sync_timeout_s: 0}").ok());
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(ConfigTest, ParsesLocalReplicaAndHookKeys) {
  auto config = ParseJobConfig(R"(
training: {mode: model_average}
local:
  optimizer: {kind: sgd, learning_rate: 0.1}
  interval_steps: 16
  warmup_steps: 4
  block_momentum: 0.9
  block_learning_rate: 1.0
hooks: {log_every_steps: 100, nan_guard: stop, stop_at_step: 500, metrics_dir: /tmp/m, metrics_format: csv}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->local.optimizer.kind(), "sgd");
  EXPECT_EQ(config->local.interval_steps, 16);
  EXPECT_EQ(config->local.block_momentum, 0.9);
  EXPECT_EQ(config->hooks.nan_guard, "stop");
  EXPECT_EQ(config->hooks.metrics_format, "csv");
  auto again = ParseJobConfig(JobConfigToYaml(*config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobConfigToYaml(*again), JobConfigToYaml(*config));
}

TEST(ConfigTest, DownpourPsOptimizerIsAdagradUnlessNamed) {
  EXPECT_EQ(ParseJobConfig("training: {mode: downpour}")->training.optimizer.kind(), "adagrad");
  EXPECT_EQ(ParseJobConfig("training: {mode: downpour, optimizer: {kind: sgd}}")->training.optimizer.kind(), "sgd");
  EXPECT_EQ(ParseJobConfig("training: {mode: easgd}")->training.optimizer.kind(), "adam");
  // Without a kind, the keys given tune the mode's own optimizer.
  auto tuned = ParseJobConfig("training: {mode: downpour, optimizer: {learning_rate: 0.5}}");
  EXPECT_EQ(tuned->training.optimizer.kind(), "adagrad");
  EXPECT_FLOAT_EQ(tuned->training.optimizer.learning_rate(), 0.5);
}

TEST(ConfigTest, ANamedKindStartsFromItsOwnDefaultsAndTheSameKindTunesTheDefault) {
  // Another kind than the default's inherits none of its fields (the
  // default Adam halves its step every 1,500 applies; SGD named here does not).
  auto sgd = ParseJobConfig("training: {optimizer: {kind: sgd, learning_rate: 0.1}}\n"
                            "local: {optimizer: {kind: momentum}}\n"
                            "model: {kind: click, click: {optimizer: {kind: ftrl, l1: 0.5}}}\n");
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ(sgd->training.optimizer.kind(), "sgd");
  EXPECT_EQ(sgd->training.optimizer.lr_decay_rate(), 0);
  EXPECT_EQ(sgd->training.optimizer.lr_decay_steps(), 0);
  EXPECT_EQ(sgd->local.optimizer.lr_decay_steps(), 0);
  EXPECT_EQ(sgd->model.click.optimizer.initial_accumulator_value(), 0);  // ftrl's own, not Adagrad's 1e-8
  EXPECT_EQ(sgd->model.click.optimizer.learning_rate(), 0);
  EXPECT_FLOAT_EQ(sgd->model.click.optimizer.l1(), 0.5);
  // The default's own kind, named, is tuned: its other fields stay.
  auto adam = ParseJobConfig("training: {optimizer: {kind: adam, learning_rate: 0.01}}");
  EXPECT_FLOAT_EQ(adam->training.optimizer.learning_rate(), 0.01);
  EXPECT_FLOAT_EQ(adam->training.optimizer.lr_decay_rate(), DefaultJobConfig().training.optimizer.lr_decay_rate());
  EXPECT_GT(adam->training.optimizer.lr_decay_steps(), 0);
}

// Each (yaml, key) pair: the config is refused and the error names the key.
template <size_t N>
void ExpectEachRefusedNamingItsKey(const std::pair<const char*, const char*> (&cases)[N]) {
  for (const auto& [yaml, key] : cases) {
    auto config = ParseJobConfig(yaml);
    ASSERT_FALSE(config.ok()) << yaml;
    EXPECT_NE(config.status().message().find(key), std::string::npos) << yaml << ": " << config.status();
  }
}

TEST(ConfigTest, BadLocalAndHookValuesNameTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"local: {n_push: 0}", "local.n_push"},
      {"local: {block_momentum: 1.5}", "local.block_momentum"},
      {"local: {alpha: 2}", "local.alpha"},
      {"local: {taus: 8}", "local.taus"},
      {"local: {optimizer: {kind: lbfgs}}", "local.optimizer"},
      {"hooks: {nan_guard: ignore}", "hooks.nan_guard"},
      {"hooks: {metrics_format: xml}", "hooks.metrics_format"},
      {"training: {mode: downpur}", "training.mode"},
  };
  ExpectEachRefusedNamingItsKey(cases);
}

TEST(ConfigTest, TheTransportKindIsCheckedAndUcxRefusesTls) {
  EXPECT_EQ(ParseJobConfig("").value().transport.kind, "auto");
  EXPECT_EQ(ParseJobConfig("transport: {kind: grpc}").value().transport.kind, "grpc");
  const std::pair<const char*, const char*> cases[] = {
      {"transport: {kind: rdma}", "transport.kind"},
      {"transport: {kind: ucx}\nsecurity: {tls_ca_file: ca.pem}", "transport.kind ucx does not encrypt"},
  };
  ExpectEachRefusedNamingItsKey(cases);
  // auto under TLS is fine: gRPC carries everything.
  EXPECT_TRUE(ParseJobConfig("security: {tls_ca_file: ca.pem}").ok());
}

TEST(ConfigTest, BadGatedValuesNameTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"training: {mode: gated}\ngated: {networks: [[64], [32], [16]]}", "gated.networks"},  // 3 networks, 2 workers
      {"training: {mode: gated}\ncluster: {workers: 1}", "gated.networks"},                 // one network is no ensemble
      {"training: {mode: gated}\ngated: {networks: [[64], [0]]}", "gated.networks[1]"},
      {"training: {mode: gated}\ngated: {output: relu}", "gated.output"},
      {"training: {mode: gated}\ngated: {scale: per_batch}", "gated.scale"},
      {"training: {mode: gated}\ngated: {output: sigmoid, master_loss: cross_entropy}", "gated.master_loss"},
      {"training: {mode: gated}\ngated: {trunk: [-4]}", "gated.trunk[0]"},
      {"gated: {master: [64]}", "gated.master"},
      {"gated: {networks: [{kind: cnn, chanels: 4}, [8]]}", "gated.networks[0].chanels"},
      {"gated: {networks: [[8], hello]}", "gated.networks[1]"},
      {"training: {mode: gated}\ngated: {networks: [[8], {kind: torchscript}]}", "gated.networks[1]"},  // no path
      {"training: {mode: gated}\ngated: {master: {kind: rnn}}", "gated.master"},
  };
  ExpectEachRefusedNamingItsKey(cases);
}

TEST(ConfigTest, GatedNetworksAndTheMasterMayBeModelsOfTheirOwn) {
  auto config = ParseJobConfig(
      "cluster: {workers: 3}\ntraining: {mode: gated}\n"
      "gated:\n"
      "  networks:\n"
      "    - {kind: torchscript, path: a.pt}\n"
      "    - {kind: cnn, conv: [{channels: 4}], dense: [8]}\n"
      "    - [32, 16]\n"
      "  master: {kind: torchscript, path: master.pt}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  const auto& networks = config->gated.networks;
  ASSERT_EQ(networks.size(), 3u);
  ASSERT_TRUE(networks[0].model.has_value());
  EXPECT_EQ(networks[0].model->path, "a.pt");
  EXPECT_EQ(networks[1].model->cnn.conv.size(), 1u);
  EXPECT_FALSE(networks[2].model.has_value());
  EXPECT_EQ(networks[2].hidden, (std::vector<int64_t>{32, 16}));
  ASSERT_TRUE(config->gated.master.has_value());
  EXPECT_EQ(config->gated.master->kind, "torchscript");
  auto again = ParseJobConfig(JobConfigToYaml(*config));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobConfigToYaml(*config);
  EXPECT_EQ(JobConfigToYaml(*again), JobConfigToYaml(*config));
  EXPECT_EQ(JobModelSummary(*config),
            "3 networks (torchscript a.pt; cnn conv 4 dense 8 (BatchNorm); mlp 784-32-16-10), master torchscript master.pt");
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(ConfigTest, EveryShippedConfigParsesAndTheMainOneIsTheDefault) {
  const std::filesystem::path dir = std::filesystem::path(SHOAL_SOURCE_DIR) / "configs";
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    auto config = LoadJobConfig(entry.path().string());
    EXPECT_TRUE(config.ok()) << config.status();
    ++parsed;
  }
  EXPECT_GE(parsed, 7);
  auto main_job = LoadJobConfig((dir / "async_fashion_mnist.yaml").string());
  ASSERT_TRUE(main_job.ok()) << main_job.status();
  EXPECT_EQ(JobConfigToYaml(*main_job), JobConfigToYaml(DefaultJobConfig()));
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(ConfigTest, PopulationKeysParseAndBadOnesNameTheKey) {
  auto config = ParseJobConfig(R"(
cluster: {workers: 4}
training: {mode: population}
population: {policy: tournament, workers_per_member: 2, variables_on: ps, explore: [learning_rate, batch_size],
             learning_rate_range: [0.001, 0.5], inherit_slots: true, peer_cache_steps: 10}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->population.policy, "tournament");
  EXPECT_EQ(config->population.explore.size(), 2u);
  auto again = ParseJobConfig(JobConfigToYaml(*config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobConfigToYaml(*again), JobConfigToYaml(*config));
  const std::pair<const char*, const char*> cases[] = {
      {"population: {policy: elitist}", "population.policy"},
      {"population: {explore: [dropout]}", "population.explore"},
      {"population: {learning_rate_range: [0.1, 0.01]}", "population.learning_rate_range"},
      {"population: {fraction: 0.75}", "population.fraction"},
      {"population: {probability: 1.5}", "population.probability"},
      {"population: {workers_per_member: 2}", "population.variables_on"},
      {"cluster: {workers: 3}\ntraining: {mode: population}\npopulation: {workers_per_member: 2, variables_on: ps}",
       "population.workers_per_member"},
  };
  ExpectEachRefusedNamingItsKey(cases);
}

TEST(ConfigTest, ARepeatedKeyIsRefusedNamingItAndItsLine) {
  auto twice = ParseJobConfig("training:\n  epochs: 2\n  batch_size: 32\n  epochs: 9\n");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("key 'training.epochs' appears twice (line 4)"), std::string::npos)
      << twice.status();
  auto top = ParseJobConfig("cluster:\n  ps: 1\ncluster:\n  ps: 2\n");
  EXPECT_NE(top.status().message().find("key 'cluster' appears twice"), std::string::npos) << top.status();
  EXPECT_TRUE(ParseJobConfig("training:\n  epochs: 2\nmodel:\n  layers: [784, 10]\n").ok());
}

TEST(ConfigTest, OverridesSetKeysAsTheFileWould) {
  const std::string file = "training:\n  mode: sync\n  batch_size: 32\nmodel:\n  layers: [784, 64, 10]\n";
  auto config = ParseJobConfig(file, {"training.batch_size=128", "model.layers=[784, 256, 10]",
                                      "training.optimizer.learning_rate=0.25", "checkpoint.dir=/tmp/a:b",
                                      "training.batch_size=96"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->training.batch_size, 96);  // in order: the last one wins
  EXPECT_EQ(config->model.layers, (std::vector<int64_t>{784, 256, 10}));
  EXPECT_EQ(config->checkpoint.dir, "/tmp/a:b");
  // An optimizer key alone goes over the mode's default optimizer, as in a file.
  EXPECT_EQ(config->training.optimizer.kind(), ParseJobConfig(file)->training.optimizer.kind());
  EXPECT_FLOAT_EQ(config->training.optimizer.learning_rate(), 0.25);
  EXPECT_EQ(config->training.mode, "sync");
  // With no file, over the defaults; a whole mapping as a value.
  auto downpour = ParseJobConfig("", {"training.mode=downpour", "training.optimizer={kind: sgd, learning_rate: 0.5}"});
  ASSERT_TRUE(downpour.ok()) << downpour.status();
  EXPECT_EQ(downpour->training.optimizer.kind(), "sgd");
  EXPECT_EQ(ParseJobConfig("", {"training.mode=downpour", "training.optimizer.learning_rate=0.5"})
                ->training.optimizer.kind(),
            "adagrad");
  EXPECT_EQ(ParseJobConfig("", {})->training.optimizer.kind(), DefaultJobConfig().training.optimizer.kind());
}

TEST(ConfigTest, ABadOverrideIsRefusedNamingIt) {
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"training.learnig_rate=0.1"}, "unknown key 'training.learnig_rate'"},
      {{"training.batch_size=many"}, "'training.batch_size' has a value of the wrong type"},
      {{"training.batch_size"}, "'training.batch_size' is not KEY=VALUE"},
      {{"training.epochs="}, "'training.epochs=' gives no value; for an empty string write training.epochs=\"\""},
      {{"training.mode= "}, "gives no value"},
      {{"training..batch_size=3"}, "'training..batch_size' is not a key path"},
      {{"=3"}, "'' is not a key path"},
      {{"training.mode.kind=sync"}, "'training.mode' is not a mapping, so it has no key 'kind'"},
      {{"model.layers=[784, 10"}, "'[784, 10' is not YAML"},
      {{"training.batch_size=-4"}, "training.batch_size"},
      {{"training.optimizer={kind: sgd, kind: adam}"}, "key 'training.optimizer.kind' appears twice"},
  };
  for (const auto& [overrides, expected] : cases) {
    auto config = ParseJobConfig("training:\n  mode: sync\n", overrides);
    ASSERT_FALSE(config.ok()) << overrides[0];
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << overrides[0];
    EXPECT_NE(config.status().message().find(expected), std::string::npos) << overrides[0] << ": " << config.status();
  }
  // A file that is not a mapping has no keys to set.
  EXPECT_FALSE(ParseJobConfig("[1, 2]", {"training.batch_size=3"}).ok());
  // An empty string is written as one.
  EXPECT_EQ(ParseJobConfig("checkpoint: {dir: ck}\n", {"checkpoint.dir=\"\""}).value().checkpoint.dir, "");
  // The file named in a loaded config's errors, the override's key too.
  const std::filesystem::path dir = FreshTempDir("config_", "overrides");
  const std::filesystem::path file = dir / "shoal_override_test.yaml";
  std::ofstream(file) << "training:\n  epochs: 2\n";
  auto loaded = LoadJobConfig(file.string(), {"training.epocs=3"});
  EXPECT_NE(loaded.status().message().find("shoal_override_test.yaml"), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find("training.epocs"), std::string::npos) << loaded.status();
  EXPECT_EQ(LoadJobConfig(file.string(), {"training.epochs=7"})->training.epochs, 7);
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, AConfigPathNamingADirectoryIsRefused) {
  auto config = LoadJobConfig(std::filesystem::temp_directory_path().string());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("is a directory, not a file"), std::string::npos) << config.status();
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(ConfigReferenceTest, EveryKeyTheParserReadsIsDescribedAndNothingElse) {
  ASSERT_TRUE(CheckConfigReference().ok()) << CheckConfigReference();
  auto keys = AllConfigKeys();
  ASSERT_TRUE(keys.ok()) << keys.status();
  // Keys from every branch of the parser: the defaults, a list's items,
  // keys read only when present, a gated master given as a model.
  for (const char* key : {"cluster.ps", "training.optimizer.learning_rate", "model.click.rows", "model.conv[].kernel",
                          "data.normalize.mean", "gated.master", "hooks.trace_steps", "transport.kind"}) {
    EXPECT_TRUE(keys->count(key)) << key;
  }
  // A key the parser does not read is not one.
  EXPECT_FALSE(keys->count("training.learnig_rate"));
  EXPECT_FALSE(keys->count("gated.master.kind"));  // listed whole, as a model's keys
}

TEST(ConfigReferenceTest, TheDocsPageIsWhatShoalConfigReferencePrints) {
  const std::filesystem::path page =
      std::filesystem::path(SHOAL_SOURCE_DIR) / "docs" / "reference" / "configuration.md";
  std::ifstream in(page);
  ASSERT_TRUE(in) << page;
  const std::string on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto generated = ConfigReferenceMarkdown();
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_EQ(on_disk, *generated) << page
                                 << " differs from what the parser's keys make; regenerate it with "
                                    "build/shoal config --reference > docs/reference/configuration.md";
  // Defaults come from the code: the main job's, and a kind's own section.
  EXPECT_NE(generated->find("| `cluster.ps` | `2` |"), std::string::npos);
  EXPECT_NE(generated->find("| `model.click.rows` | `1000000` |"), std::string::npos);
  EXPECT_NE(generated->find("| `data.normalize.mean` | — |"), std::string::npos);
}

}  // namespace
}  // namespace shoal
