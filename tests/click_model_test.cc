// The click-through path end to end: the embedding-bag layer over tables on
// the ps, the built-in click model's three dense parts, and training it on a
// click log with a planted logistic model, async and hybrid (sync dense,
// async tables).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "inproc_servers.h"
#include "planted_clicks.h"
#include "scripted_modules.h"
#include "stalls.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/export/export.h"
#include "shoal/model/click_metrics.h"
#include "shoal/model/embedding_bag.h"
#include "shoal/model/model_factory.h"
#include "shoal/session/evaluator.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/worker_session.h"
#include "shoal/strategy/strategy.h"
#include "temp_dir.h"
#include "source_paths.h"

namespace shoal {
namespace {

// A client of `ps` in-process ps tasks.
struct Tables {
  explicit Tables(int ps) : config(Config(ps)), cluster(ClusterSpec::Local(ps, 1)), servers(config, cluster) {
    client = Client::Create(cluster, &servers.transport, MakePlacement(config, cluster).value()).value();
  }
  static JobConfig Config(int ps) {
    JobConfig config;
    config.cluster.ps = ps;
    return config;
  }
  JobConfig config;
  ClusterSpec cluster;
  InProcServers servers;
  std::unique_ptr<Client> client;
};

wire::TableDef SgdTable(const std::string& name, int64_t rows, int64_t dim) {
  wire::TableDef def;
  def.set_name(name);
  def.set_rows(rows);
  def.set_dim(dim);
  def.set_seed(3);
  def.set_init_scale(0.5);
  def.mutable_optimizer()->set_kind("sgd");
  def.mutable_optimizer()->set_learning_rate(1.0);
  return def;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

torch::Tensor Rows(Client& client, const std::string& table, std::vector<int64_t> ids) {
  return client.PullRows(table, torch::tensor(ids, torch::kInt64)).value();
}

TEST(EmbeddingBagTest, PoolsMultiHotFeaturesAndPushesOneSummedRowPerId) {
  Tables t(2);
  ASSERT_TRUE(t.client->CreateTables({SgdTable("e", 10, 2)}).ok());
  const torch::Tensor before = Rows(*t.client, "e", {1, 3, 4});
  // Two features of two slots each; -1 is an empty slot; 11 folds to row 1.
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{1, 3, 3, -1, -1, -1, 11, 4}).view({2, 4});
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    RemoteEmbeddingBag bag(SgdTable("e", 10, 2), /*bag_size=*/2, pooling);
    ASSERT_TRUE(bag.Pull(*t.client, ids).ok());
    EXPECT_EQ(bag.distinct_ids().numel(), 3);
    const torch::Tensor pooled = bag.Pooled();
    ASSERT_EQ(pooled.sizes(), (std::vector<int64_t>{2, 2, 2}));
    const double half = pooling == Pooling::kMean ? 0.5 : 1.0;
    EXPECT_TRUE(torch::allclose(pooled[0][0], (before[0] + before[1]) * half));
    EXPECT_TRUE(torch::allclose(pooled[0][1], before[1]));       // one id: its row, summed or averaged
    EXPECT_TRUE(pooled[1][0].abs().sum().item<float>() == 0);  // an empty feature pools to zeros
    EXPECT_TRUE(torch::allclose(pooled[1][1], (before[0] + before[2]) * half));
  }
  // Sum pooling, loss = the sum of everything: row 1 and row 3 were used
  // twice, row 4 once; plain SGD with rate 1 takes those counts off.
  RemoteEmbeddingBag bag(SgdTable("e", 10, 2), 2, Pooling::kSum);
  ASSERT_TRUE(bag.Pull(*t.client, ids).ok());
  bag.Pooled().sum().backward();
  ASSERT_TRUE(bag.Push(*t.client).ok());
  const torch::Tensor after = Rows(*t.client, "e", {1, 3, 4});
  EXPECT_TRUE(torch::allclose(after, before - torch::tensor({2.0f, 2.0f, 1.0f}).view({3, 1})));
}

TEST(EmbeddingBagTest, ANegativeIdIsRefusedNamingExampleAndColumnAndChangesNothing) {
  Tables t(1);
  ASSERT_TRUE(t.client->CreateTables({SgdTable("e", 10, 2)}).ok());
  RemoteEmbeddingBag bag(SgdTable("e", 10, 2), 1, Pooling::kSum);
  ASSERT_TRUE(bag.Pull(*t.client, torch::tensor(std::vector<int64_t>{1, 2}).view({1, 2})).ok());
  const torch::Tensor rows = bag.rows().detach().clone();
  absl::Status refused = bag.Pull(*t.client, torch::tensor(std::vector<int64_t>{1, 2, 5, -7}).view({2, 2}));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("id -7 in example 1, column 1"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("table 'e'"), std::string::npos) << refused;
  EXPECT_TRUE(bag.rows().equal(rows));  // the last pull stands
  refused = bag.Pull(*t.client, torch::zeros({2, 2}));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
}

TEST(EmbeddingBagTest, ACachedRowServesStalenessStepsThenIsPulledAgain) {
  Tables t(2);
  ASSERT_TRUE(t.client->CreateTables({SgdTable("e", 10, 2)}).ok());
  RemoteEmbeddingBag bag(SgdTable("e", 10, 2), 1, Pooling::kSum,
                         std::make_unique<RowCache>(/*capacity=*/2, /*dim=*/2, /*staleness=*/1));
  const torch::Tensor one = torch::tensor(std::vector<int64_t>{1}).view({1, 1});
  const torch::Tensor before = Rows(*t.client, "e", {1});
  ASSERT_TRUE(bag.Pull(*t.client, one).ok());  // step 1: a miss, pulled
  bag.Pooled().sum().backward();
  ASSERT_TRUE(bag.Push(*t.client).ok());  // the ps's row moves by -1
  ASSERT_TRUE(bag.Pull(*t.client, one).ok());  // step 2: served from the cache, stale by one push
  EXPECT_TRUE(torch::allclose(bag.rows(), before));
  ASSERT_TRUE(bag.Pull(*t.client, one).ok());  // step 3: past its staleness, pulled again
  EXPECT_TRUE(torch::allclose(bag.rows(), before - 1));
  EXPECT_EQ(bag.cache()->lookups(), 3);
  EXPECT_EQ(bag.cache()->hits(), 1);
  // Two slots: ids 2 and 3 push id 1 out, the oldest.
  ASSERT_TRUE(bag.Pull(*t.client, torch::tensor(std::vector<int64_t>{2, 3}).view({1, 2})).ok());
  ASSERT_TRUE(bag.Pull(*t.client, torch::tensor(std::vector<int64_t>{1, 2, 3}).view({1, 3})).ok());
  EXPECT_EQ(bag.cache()->hits(), 3);  // 2 and 3 hit; 1 missed
  EXPECT_TRUE(torch::allclose(bag.rows().index_select(0, (bag.distinct_ids() == 1).nonzero().view({-1})),
                              before - 1));
}

// Ids [n] as a tensor; rows [n, 2] whose values name their id and step.
torch::Tensor Ids(std::vector<int64_t> ids) { return torch::tensor(ids, torch::kInt64); }
torch::Tensor RowsOf(const torch::Tensor& ids, int64_t step) {
  return torch::stack({ids.to(torch::kFloat32), torch::full({ids.numel()}, static_cast<float>(step))}, 1);
}

TEST(RowCacheTest, ARowPulledTakesThePlaceOfTheStalestInItsSet) {
  RowCache cache(/*capacity=*/4, /*dim=*/2, /*staleness=*/10);  // one set of 4
  cache.Insert(Ids({1, 2}), RowsOf(Ids({1, 2}), 1), 1);
  cache.Insert(Ids({3}), RowsOf(Ids({3}), 2), 2);
  cache.Insert(Ids({1, 4}), RowsOf(Ids({1, 4}), 3), 3);  // 1 pulled again: its row and step are new
  cache.Insert(Ids({5}), RowsOf(Ids({5}), 4), 4);        // full: 2 (pulled at step 1) goes, not 1
  const torch::Tensor asked = Ids({1, 2, 3, 4, 5});
  torch::Tensor rows = torch::zeros({5, 2});
  const torch::Tensor hit = cache.Lookup(asked, 5, rows);
  EXPECT_TRUE(hit.equal(torch::tensor({true, false, true, true, true})));
  EXPECT_TRUE(rows.equal(torch::tensor(std::vector<float>{1, 3, 0, 0, 3, 2, 4, 3, 5, 4}).view({5, 2})));
  EXPECT_EQ(cache.hits(), 4);
  EXPECT_EQ(cache.lookups(), 5);
}

TEST(RowCacheTest, EveryRowItServesIsTheOnePulledForItsIdWithinStaleness) {
  RowCache cache(/*capacity=*/1000, /*dim=*/2, /*staleness=*/2);
  std::mt19937_64 random(7);
  std::vector<int64_t> drawn(700);
  for (int64_t& id : drawn) id = static_cast<int64_t>(random() % 10'000'000);  // exact as floats
  const torch::Tensor ids = std::get<0>(torch::_unique(Ids(drawn)));
  cache.Insert(ids, RowsOf(ids, 1), 1);
  torch::Tensor rows = torch::zeros({ids.numel(), 2});
  const torch::Tensor hit = cache.Lookup(ids, 3, rows);  // within staleness: pulled at 1, serves 1 .. 3
  const torch::Tensor served = hit.nonzero().view({-1});
  EXPECT_TRUE(rows.index_select(0, served).equal(RowsOf(ids.index_select(0, served), 1)));
  // 700 ids in 250 sets of 4: a set drawn more than 4 times keeps 4 (about
  // 60 ids lost on average), so most are held.
  EXPECT_GT(hit.sum().item<int64_t>(), 600);
  EXPECT_TRUE(cache.Lookup(ids, 4, rows).logical_not().all().item<bool>());  // past staleness: all missed
  EXPECT_EQ(cache.lookups(), 2 * ids.numel());
}

ModelConfig SmallClickModel(const std::string& arch) {
  ModelConfig config;
  config.kind = "click";
  config.loss = "logistic";
  config.click.arch = arch;
  config.click.integer_features = 3;
  config.click.categorical_features = 4;
  config.click.rows = 100;
  config.click.dim = 4;
  config.click.hidden = {8};
  config.click.bottom = {6};
  return config;
}

// A batch of `n` examples for SmallClickModel: 3 counts, then 4 ids.
torch::Tensor SmallBatch(int64_t n) {
  torch::manual_seed(5);
  return torch::cat({torch::randint(0, 20, {n, 3}, torch::kInt64), torch::randint(0, 500, {n, 4}, torch::kInt64)}, 1);
}

TEST(ClickModelTest, EachDensePartMapsABatchToOneLogitAndTrainsWithTheTable) {
  const auto dir = FreshTempDir("shoal_click_", "each_arch");
  ModelConfig scripted = SmallClickModel("torchscript");
  scripted.path = (dir / "dense.pt").string();
  ScriptedLinear(4 * 4 + 3, 1).save(scripted.path);
  for (ModelConfig config : {SmallClickModel("wide_deep"), SmallClickModel("dlrm"), scripted}) {
    SCOPED_TRACE(config.click.arch);
    ASSERT_TRUE(ValidateModelConfig(config).ok());
    Tables t(2);
    auto made = MakeModel(config);
    ASSERT_TRUE(made.ok()) << made.status();
    Model& model = **made;
    RowTables* tables = model.row_tables();
    ASSERT_NE(tables, nullptr);
    tables->Bind(t.client.get());
    ASSERT_TRUE(t.client->CreateTables(tables->TableDefs()).ok());
    const torch::Tensor input = SmallBatch(16);
    EXPECT_THROW(model.Forward(input), std::logic_error);  // rows not pulled
    ASSERT_TRUE(tables->Pull(input).ok());
    {  // The dense part as TorchScript (what shoal export writes) takes the pooled rows and gives the same logits.
      torch::NoGradGuard no_grad;
      model.SetTraining(false);
      auto script = model.Script();
      ASSERT_TRUE(script.ok()) << script.status();
      const auto& click = static_cast<const ClickModel&>(model);
      const torch::Tensor logits = script->forward({input.narrow(1, 0, 3), click.bag().Pooled()}).toTensor();
      EXPECT_TRUE(torch::allclose(logits, model.Forward(input), 1e-5, 1e-6));
      model.SetTraining(true);
    }
    const BatchResult batch = ComputeGradients(model, input, torch::randint(0, 2, {16}).to(torch::kFloat32));
    EXPECT_TRUE(std::isfinite(batch.loss));
    EXPECT_EQ(model.Forward(input).sizes(), (std::vector<int64_t>{16}));
    int64_t reached = 0;
    for (const torch::Tensor& g : model.Gradients()) reached += g.abs().sum().item<float>() > 0;
    EXPECT_GE(reached, static_cast<int64_t>(model.variables().size()) - 1);  // all but a dead ReLU's, at most
    const std::string table = tables->TableDefs()[0].name();
    const torch::Tensor ids = torch::tensor({input[0][3].item<int64_t>() % 100}, torch::kInt64);
    const torch::Tensor row = t.client->PullRows(table, ids).value();
    ASSERT_TRUE(tables->Push().ok());
    EXPECT_FALSE(t.client->PullRows(table, ids).value().equal(row));  // the row trained
  }
}

TEST(ClickModelTest, TheWrongInputOrConfigIsAClearError) {
  Tables t(1);
  auto model = MakeModel(SmallClickModel("wide_deep")).value();
  model->row_tables()->Bind(t.client.get());
  absl::Status refused = model->row_tables()->Pull(torch::zeros({2, 7}));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("int64 [N, 7] (3 integer features, then 4 categorical"), std::string::npos)
      << refused;
  ModelConfig config = SmallClickModel("wide_deep");
  config.click.arch = "fm";
  EXPECT_NE(ValidateModelConfig(config).message().find("model.click.arch 'fm'"), std::string::npos);
  config = SmallClickModel("wide_deep");
  config.click.eviction = "mru";
  EXPECT_NE(ValidateModelConfig(config).message().find("model.click.eviction 'mru' is unknown; known: lru, lfu"),
            std::string::npos);
  config.click.eviction = "lfu";
  EXPECT_NE(ValidateModelConfig(config).message().find("set evict_when_full"), std::string::npos);
  config.click.evict_when_full = true;
  EXPECT_TRUE(ValidateModelConfig(config).ok());
  config = SmallClickModel("wide_deep");
  config.loss = "cross_entropy";
  EXPECT_FALSE(ValidateModelConfig(config).ok());
  ModelConfig mlp;
  mlp.loss = "logistic";
  EXPECT_NE(ValidateModelConfig(mlp).message().find("click model's loss"), std::string::npos);
  auto parsed = ParseJobConfig("model: {kind: click, click: {dim: 0}}\n");
  EXPECT_NE(parsed.status().message().find("model.click.dim = 0"), std::string::npos) << parsed.status();
  parsed = ParseJobConfig("model: {kind: click, click: {dims: 8}}\n");
  EXPECT_NE(parsed.status().message().find("dims"), std::string::npos) << parsed.status();  // an unknown key
}

JobConfig ClickJob(const std::string& dir, const std::string& mode, double* planted_auc) {
  JobConfig config = DefaultJobConfig();
  config.cluster.ps = 2;
  config.cluster.workers = 2;
  config.model.kind = "click";
  config.model.loss = "logistic";
  config.model.click.rows = 1 << 20;  // few collisions among the log's 1,040 ids
  config.model.click.dim = 8;
  config.model.click.hidden = {16};
  config.data.format = "criteo";
  config.data.train_file = dir + "/train.tsv";
  config.data.test_file = dir + "/test.tsv";
  WritePlantedClicks(config.data.train_file, 24000, 1);
  *planted_auc = WritePlantedClicks(config.data.test_file, 6000, 2);
  config.training.mode = mode;
  config.training.epochs = 4;
  config.training.batch_size = 128;
  config.training.optimizer.set_kind("adam");
  config.training.optimizer.set_learning_rate(0.003);
  config.transport.startup_timeout_s = 60;
  config.training.sync_timeout_s = 30;
  return config;
}

// ClickJob with one worker for 120 steps, saving checkpoints: its last push,
// rows included, precedes the final save (another worker's last push may
// land after the chief saved).
JobConfig SavedClickJob(const std::string& dir) {
  double planted_auc = 0;
  JobConfig config = ClickJob(dir, "async", &planted_auc);
  config.cluster.workers = 1;
  config.training.max_steps = 120;
  config.checkpoint.dir = dir + "/checkpoints";
  config.hooks.run_dir = "";
  return config;
}

TEST(ClickTrainingTest, WideAndDeepLearnsThePlantedModelAsyncAndHybrid) {
  const auto dir = FreshTempDir("shoal_click_", "train").string();
  for (const std::string mode : {"async", "sync"}) {
    SCOPED_TRACE(mode);
    double planted_auc = 0;
    JobConfig config = ClickJob(dir, mode, &planted_auc);
    const std::string metrics = dir + "/metrics_" + mode;
    config.hooks.metrics_dir = metrics;
    if (mode == "sync") config.model.click.cache_rows = 4096;  // the hybrid mode with each worker's row cache
    ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
    auto report = TrainInProcess(config, InProcOptions{}, nullptr);
    ASSERT_TRUE(report.ok()) << report.status();
    // The metrics files carry the batches' AUC; the cache served most rows.
    std::ifstream lines(metrics + "/worker_0.jsonl");
    std::string last, line;
    while (std::getline(lines, line)) last = line;
    EXPECT_NE(last.find("\"auc\":0."), std::string::npos) << last;
    if (mode == "sync") {
      EXPECT_GT(report->row_cache_hit_rate, 0.5);
    } else {
      EXPECT_EQ(report->row_cache_hit_rate, 0);
    }
    // The report says how full the table ended: a fixed one holds every row.
    EXPECT_EQ(report->table_rows_held, config.model.click.rows);
    EXPECT_EQ(report->table_ids_refused, 0);
    std::printf("%s: test AUC %.4f, log loss %.4f; planted AUC %.4f\n", mode.c_str(), report->test_auc,
                report->test_loss, planted_auc);
    // A model that learned nothing scores 0.5; the planted one about 0.8.
    EXPECT_GT(report->test_auc, planted_auc - 0.045) << "planted " << planted_auc;  // measured: 0.025 below
    EXPECT_LT(report->test_loss, 0.6);
  }
}

// On leased data (data.leases) every example of a click job reaches the
// dense variables once and every shard of its table once, through a worker
// that stalls past its lease: the rows' push carries the batch's places
// and each table shard applies them on a watermark of its own.
TEST(ClickTrainingTest, OnLeasedDataEachExampleReachesTheVariablesAndEveryTableShardOnce) {
  const auto dir = FreshTempDir("shoal_click_", "leased").string();
  for (const std::string mode : {"async", "sync"}) {  // sync: the hybrid, its rows pushed asynchronously
    SCOPED_TRACE(mode);
    double planted_auc = 0;
    JobConfig config = ClickJob(dir, mode, &planted_auc);
    config.data.leases = true;
    config.data.lease_shard_examples = 20 * 128;
    config.data.lease_timeout_s = 0.3;
    Stalls stalls{/*worker=*/1, /*every=*/40, /*at=*/7, /*most=*/2, absl::Milliseconds(900)};
    auto report = TrainInProcess(config, InProcOptions{}, nullptr, stalls.Customizer());
    ASSERT_TRUE(report.ok()) << report.status();
    const DataLedgerReport& ledger = report->data_ledger;
    EXPECT_TRUE(ledger.leased);
    EXPECT_EQ(ledger.epochs_finished, 4);  // the job ends when its data is over
    EXPECT_EQ(ledger.table_ledgers, 2);  // the table's shard on each of the 2 ps tasks
    EXPECT_GE(ledger.variable_ledgers, 1);
    EXPECT_EQ(ledger.places_missing, 0);
    EXPECT_EQ(ledger.places_repeated, 0);
    EXPECT_EQ(ledger.places_applied, 4 * 24000);
    EXPECT_GT(stalls.count.load(), 0);
    EXPECT_GT(ledger.takeovers, 0);
    std::printf("%s\n", absl::StrFormat("leased %s: %d epochs finished, %d places, %d takeovers; test AUC %.4f, "
                                        "planted %.4f",
                                        mode, ledger.epochs_finished, ledger.places_applied, ledger.takeovers,
                                        report->test_auc, planted_auc)
                           .c_str());
    EXPECT_GT(report->test_auc, planted_auc - 0.05) << "planted " << planted_auc;
  }
}

// The tables go into the job's checkpoints with the dense variables: a job
// started again on 3 ps tasks from what 2 saved evaluates as the first ended.
TEST(ClickTrainingTest, AClickJobRestoredOntoThreePsTasksEvaluatesAsItEnded) {
  const auto dir = FreshTempDir("shoal_click_", "restore").string();
  JobConfig config = SavedClickJob(dir);
  auto first = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->last_checkpoint.empty());
  EXPECT_FALSE(ReadCheckpointIndex(first->last_checkpoint).value().table_shards.empty());
  // An evaluator task reads the checkpoint, tables included, by itself.
  const Dataset test_set = LoadData(config).value().test;
  auto evaluated = EvaluateCheckpoint(config, first->last_checkpoint, test_set);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  ASSERT_TRUE(evaluated->test_auc.has_value());
  EXPECT_NEAR(*evaluated->test_auc, first->test_auc, 1e-4);
  EXPECT_NEAR(evaluated->test_loss, first->test_loss, 1e-4);
  EXPECT_NE(EvaluationJsonLine("/job:evaluator/task:0", *evaluated).find("\"test_auc\":"), std::string::npos);
  // It restored only the rows of the ids the test set holds.
  auto model = MakeModel(config.model).value();
  const int64_t test_ids = model->row_tables()->TableIds(test_set.images).value()[0].numel();
  EXPECT_EQ(evaluated->table_rows, test_ids);
  EXPECT_LT(test_ids, config.model.click.rows / 100);
  config.cluster.ps = 3;
  // A job started at its last step still takes one; steps too small to
  // move anything keep the evaluation the restored state's.
  config.training.optimizer.set_learning_rate(1e-12);
  config.model.click.optimizer.set_learning_rate(1e-12);
  auto second = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restored_from, first->last_checkpoint);
  EXPECT_NEAR(second->test_auc, first->test_auc, 1e-4);
  EXPECT_NEAR(second->test_loss, first->test_loss, 1e-4);
}

// `shoal export` of a click job: its dense part and tables, served by the
// Python example with PyTorch and NumPy alone, predict as shoal's evaluator.
TEST(ClickTrainingTest, AnExportedClickModelServesTheEvaluatorsPredictions) {
  const auto dir = FreshTempDir("shoal_click_", "export").string();
  JobConfig config = SavedClickJob(dir);
  config.model.click.rows = 1 << 16;  // a fixed table: ids folded into it
  auto trained = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(trained.ok()) << trained.status();
  ExportOptions options;
  options.checkpoint = config.checkpoint.dir;
  options.out = dir + "/served/model.pt";
  std::filesystem::create_directories(dir + "/served");
  auto exported = ExportCheckpoint(config, options);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->tables.size(), 1u);
  EXPECT_EQ(exported->tables[0].rows, 1 << 16);  // a fixed table is held whole
  const Dataset test_set = LoadData(config).value().test;
  auto evaluated = EvaluateCheckpoint(config, exported->checkpoint, test_set);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  const std::string command = absl::StrCat("/usr/bin/python3 ", SHOAL_SOURCE_DIR, "/examples/python/serve_clicks.py ",
                                           dir, "/served ", config.data.test_file, " > ", dir, "/served.txt 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << ReadFile(dir + "/served.txt");
  const std::string served = ReadFile(dir + "/served.txt");
  double log_loss = 0, auc = 0;
  ASSERT_EQ(std::sscanf(served.c_str(), "served %*d examples: log loss %lf, AUC %lf", &log_loss, &auc), 2) << served;
  EXPECT_NEAR(log_loss, evaluated->test_loss, 1e-5) << served;
  EXPECT_NEAR(auc, *evaluated->test_auc, 1e-5) << served;
}

TEST(ClickTrainingTest, TheConfigOfAClickJobGoesThroughYamlUnchanged) {
  double planted_auc = 0;
  const auto dir = FreshTempDir("shoal_click_", "yaml").string();
  JobConfig config = ClickJob(dir, "async", &planted_auc);
  config.model.click.optimizer.set_kind("ftrl");
  config.model.click.optimizer.set_l1(0.5);
  auto again = ParseJobConfig(JobConfigToYaml(config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobConfigToYaml(*again), JobConfigToYaml(config));
  EXPECT_EQ(again->model.click.rows, 1 << 20);
  EXPECT_EQ(again->model.click.optimizer.l1(), 0.5);
  EXPECT_EQ(again->data.train_file, config.data.train_file);
  // An evaluator task can follow a click job (it restores the tables).
  config.checkpoint.dir = dir;
  EXPECT_TRUE(CheckEvaluatorConfig(config).ok()) << CheckEvaluatorConfig(config);
}

}  // namespace
}  // namespace shoal
