// The public C++ API (include/shoal/shoal.h), used as a program uses it:
// its own module, in-memory data, hooks, one task of a cluster, and the
// parameter-server client against a server in this process.
#include "shoal/shoal.h"

#include "shoal/embedding.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/session/local_cluster.h"  // FreeLoopbackPorts

namespace {

struct SmallNet : torch::nn::Module {
  SmallNet() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// BatchNorm's statistics are buffers: they travel too.
struct NormNet : torch::nn::Module {
  NormNet() {
    fc = register_module("fc", torch::nn::Linear(784, 32));
    bn = register_module("bn", torch::nn::BatchNorm1d(32));
    out = register_module("out", torch::nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return out(torch::relu(bn(fc(x.flatten(1))))); }
  torch::nn::Linear fc{nullptr}, out{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

shoal::Job QuickJob(const std::string& mode = "async") {
  shoal::Job job;
  job.Set("training.mode", mode)
      .Set("data.train_examples", "6000")
      .Set("data.test_examples", "2000")
      .Set("training.epochs", "1")
      .Set("transport.startup_timeout_s", "60");
  return job;
}

// Two classes split by the sign of the first feature's sum with the second.
std::vector<torch::Tensor> SeparableData(int64_t n, int64_t features) {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({n, features});
  torch::Tensor y = (x.select(1, 0) + x.select(1, 1) > 0).to(torch::kInt64);
  return {x.narrow(0, 0, n * 4 / 5), y.narrow(0, 0, n * 4 / 5), x.narrow(0, n * 4 / 5, n / 5),
          y.narrow(0, n * 4 / 5, n / 5)};
}

template <typename F>
shoal::Error ErrorOf(F&& f) {
  try {
    f();
  } catch (const shoal::Error& e) {
    return e;
  }
  ADD_FAILURE() << "no shoal::Error was thrown";
  return shoal::Error("OK", "");
}

TEST(ApiTest, AProgramsModuleTrainsInAsyncAndSyncModes) {
  for (const std::string mode : {"async", "sync"}) {
    shoal::Job job = QuickJob(mode);
    job.SetModule(shoal::Module::Of<SmallNet>("SmallNet"));
    const shoal::Report report = job.Train();
    EXPECT_GT(report.test_accuracy, 0.7) << mode;
    EXPECT_GT(report.global_step, 0) << mode;
    const nlohmann::json json = nlohmann::json::parse(report.json);
    EXPECT_DOUBLE_EQ(json.at("test_accuracy").get<double>(), report.test_accuracy);
  }
}

// Train writes the trained values into the program's own module, as Keras'
// fit and a PyTorch loop leave them: evaluated with plain libtorch it scores
// the report's accuracy. The report names them, and the run folder holds them.
TEST(ApiTest, TheProgramsModuleHoldsTheTrainedValuesAfterTrain) {
  const std::filesystem::path runs = std::filesystem::temp_directory_path() / absl::StrCat("shoal_api_runs_", getpid());
  std::filesystem::remove_all(runs);
  for (const std::string mode : {"async", "population"}) {
    SCOPED_TRACE(mode);
    auto net = std::make_shared<SmallNet>();
    const torch::Tensor initial = net->fc1->weight.detach().clone();
    const std::vector<torch::Tensor> data = SeparableData(5000, 784);
    shoal::Job job = QuickJob(mode);
    job.Set("hooks.run_dir", absl::StrCat("\"", runs.string(), "\""))
        .SetData(data[0], data[1], data[2], data[3])
        .SetModule(shoal::Module::Of("SmallNet", net));
    job.Set("training.epochs", "5");  // 2 of 784 features carry the label
    if (mode == "population") job.Set("cluster.workers", "2").Set("population.validation_examples", "500");
    const shoal::Report report = job.Train();
    EXPECT_FALSE(net->fc1->weight.equal(initial)) << "the module still holds its initial values";
    ASSERT_EQ(report.variables.size(), 4u);
    EXPECT_TRUE(net->fc1->weight.equal(report.variables.at("fc1.weight")));
    EXPECT_TRUE(net->fc2->bias.equal(report.variables.at("fc2.bias")));
    torch::NoGradGuard no_grad;
    net->eval();
    const double accuracy = net->forward(data[2]).argmax(1).eq(data[3]).to(torch::kFloat64).mean().item<double>();
    EXPECT_GT(accuracy, 0.7);  // chance is 0.5
    EXPECT_NEAR(accuracy, report.test_accuracy, 0.001);
    const nlohmann::json json = nlohmann::json::parse(report.json);
    EXPECT_TRUE(report.model_file.empty()) << "a C++ module has no TorchScript form";
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(report.run_dir) / "weights.pt"));
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(report.run_dir) / "report.json"));
    EXPECT_NE(json.at("no_model_file").get<std::string>().find("torch::nn::Module"), std::string::npos);
    if (mode == "population") EXPECT_EQ(report.member, json.at("best_member").get<int>());
  }
  // Values of another model are refused, naming the variable, and change nothing.
  shoal::Report report;
  report.variables["fc1.weight"] = torch::zeros({32, 784});
  auto other = std::make_shared<SmallNet>();
  const torch::Tensor before = other->fc1->weight.detach().clone();
  const shoal::Error missing = ErrorOf([&] { report.LoadInto(*other); });
  EXPECT_EQ(missing.code(), "NOT_FOUND");
  EXPECT_NE(std::string(missing.what()).find("'fc1.bias'"), std::string::npos) << missing.what();
  EXPECT_TRUE(other->fc1->weight.equal(before));
  std::filesystem::remove_all(runs);
}

// A Criteo-format log whose clicks follow the first categorical feature:
// id 0 clicks 4 times in 5, id 1 once in 5.
void WriteClickLog(const std::string& path, int examples) {
  std::ofstream out(path);
  for (int i = 0; i < examples; ++i) {
    const int id = i % 2;
    const bool click = id == 0 ? i % 10 != 0 : i % 10 == 1;
    out << (click ? "1" : "0");
    for (int f = 0; f < 13; ++f) out << "\t" << (i + f) % 3;
    for (int f = 0; f < 26; ++f) out << "\t" << absl::StrFormat("%08x", f == 0 ? id : 0x100 * f + i % 7);
    out << "\n";
  }
}

TEST(ApiTest, AClickModelsReportCarriesItsAuc) {
  const std::string dir = ::testing::TempDir() + "/shoal_api_click";
  std::filesystem::create_directories(dir);
  WriteClickLog(dir + "/train.tsv", 4000);
  WriteClickLog(dir + "/test.tsv", 1000);
  shoal::Job job;
  job.Set("model.kind", "click")
      .Set("model.click.rows", "4096")
      .Set("model.click.dim", "4")
      .Set("model.click.hidden", "[8]")
      .Set("data.train_file", dir + "/train.tsv")
      .Set("data.test_file", dir + "/test.tsv")
      .Set("data.format", "criteo")
      .Set("training.epochs", "2")
      .Set("training.batch_size", "100")
      .Set("transport.startup_timeout_s", "60");
  const shoal::Report report = job.Train();
  const nlohmann::json json = nlohmann::json::parse(report.json);
  EXPECT_DOUBLE_EQ(json.at("test_auc").get<double>(), report.test_auc);
  EXPECT_DOUBLE_EQ(json.at("test_loss").get<double>(), report.test_loss);
  // The first feature decides: the best AUC is 0.8 (one id clicks 4 times
  // in 5, the other once); a model that learned nothing has 0.5.
  EXPECT_GT(report.test_auc, 0.75) << report.json;
  EXPECT_EQ(report.row_cache_hit_rate, 0);  // no cache configured
}

TEST(ApiTest, AModulesBuffersArePublishedAndEvaluated) {
  shoal::Job job = QuickJob("model_average");
  job.SetModule(shoal::Module::Of<NormNet>("NormNet"));
  const shoal::Report report = job.Train();
  // Evaluation uses the published running statistics: unpublished (zero
  // mean, unit variance) ones would not give this.
  EXPECT_GT(report.test_accuracy, 0.7);
}

// Counts every worker's steps; stops the job once the non-chief worker
// (which may start later than the chief) has taken `stop_at` steps.
class CountingHook : public shoal::Hook {
 public:
  explicit CountingHook(int64_t stop_at) : stop_at_(stop_at) {}
  bool AfterStep(const shoal::Step& step, std::string* reason) override {
    ++steps;
    if (step.chief) chief_steps++;
    if (!step.chief && step.local_step >= stop_at_) {
      *reason = absl::StrCat("enough at ", step.global_step);
      return true;
    }
    return false;
  }
  void End(const shoal::Step& last, const std::string& error) override {
    ++ends;
    if (!error.empty()) errors++;
  }
  std::atomic<int64_t> steps{0}, chief_steps{0}, ends{0}, errors{0};

 private:
  int64_t stop_at_;
};

TEST(ApiTest, HooksSeeEveryWorkersStepsAndStopTheJob) {
  auto hook = std::make_shared<CountingHook>(20);
  shoal::Job job = QuickJob();
  job.Set("training.epochs", "3");  // 281 global steps unless stopped
  job.AddHook(hook);
  const shoal::Report report = job.Train();
  // The other worker stopped it: the chief's report says a worker's hook did.
  EXPECT_NE(report.stop_reason.find("hook"), std::string::npos) << report.stop_reason;
  EXPECT_LT(report.global_step, 281);
  EXPECT_GT(hook->chief_steps.load(), 0);
  EXPECT_GT(hook->steps.load(), hook->chief_steps.load());  // the other worker's too
  EXPECT_EQ(hook->ends.load(), 2);
  EXPECT_EQ(hook->errors.load(), 0);
}

TEST(ApiTest, TensorsInMemoryTrainInProcessAndAsProcesses) {
  const std::vector<torch::Tensor> data = SeparableData(5000, 20);
  for (const bool processes : {false, true}) {
    shoal::Job job;
    job.Set("model.layers", "[20, 16, 2]").Set("training.epochs", "5").Set("cluster.ps", "1");
    job.Set("training.optimizer", "{kind: adam, learning_rate: 0.01}");
    job.Set("cluster.processes", processes ? "true" : "false");
    job.SetData(data[0], data[1], data[2], data[3]);
    const shoal::Report report = job.Train();
    EXPECT_GT(report.test_accuracy, 0.9) << (processes ? "processes" : "in-process");
  }
}

TEST(ApiTest, BadInputIsNamedAndChangesNothing) {
  shoal::Job job;
  const std::string before = job.ToYaml();
  shoal::Error unknown = ErrorOf([&] { job.Set("cluster.wrkers", "3"); });
  EXPECT_EQ(unknown.code(), "INVALID_ARGUMENT");
  EXPECT_NE(std::string(unknown.what()).find("cluster.wrkers"), std::string::npos) << unknown.what();
  EXPECT_NE(ErrorOf([&] { job.Set("training.batch_size", "-4"); }).code(), "OK");
  EXPECT_EQ(job.ToYaml(), before);

  // Data that does not fit the model: named at start, with both shapes.
  const std::vector<torch::Tensor> data = SeparableData(500, 30);
  shoal::Job misfit;
  misfit.Set("model.layers", "[20, 16, 2]").SetData(data[0], data[1], data[2], data[3]);
  shoal::Error shape = ErrorOf([&] { misfit.Train(); });
  EXPECT_NE(std::string(shape.what()).find("[2, 30]"), std::string::npos) << shape.what();

  shoal::Job wrong_labels;
  wrong_labels.Set("model.layers", "[30, 2]").SetData(data[0], data[1].to(torch::kFloat64), data[2], data[3]);
  shoal::Error labels = ErrorOf([&] { wrong_labels.Train(); });
  EXPECT_NE(std::string(labels.what()).find("training tensors"), std::string::npos) << labels.what();

  // A module lives in this program: processes could not build it.
  shoal::Job processes;
  processes.Set("cluster.processes", "true").SetModule(shoal::Module::Of<SmallNet>("SmallNet"));
  shoal::Error module = ErrorOf([&] { processes.Train(); });
  EXPECT_EQ(module.code(), "FAILED_PRECONDITION");
  EXPECT_NE(std::string(module.what()).find("SmallNet"), std::string::npos) << module.what();
}

TEST(ApiTest, RunTaskRunsTheTasksOfARealCluster) {
  const std::vector<int> ports = shoal::FreeLoopbackPorts(2).value();
  const std::string cluster = nlohmann::json{{"ps", {absl::StrCat("127.0.0.1:", ports[0])}},
                                             {"worker", {absl::StrCat("127.0.0.1:", ports[1])}}}
                                  .dump();
  shoal::Job job = QuickJob();
  job.SetModule(shoal::Module::Of<SmallNet>("SmallNet"));
  std::string ps_error;
  std::thread ps([&] {
    try {
      job.RunTask(cluster, "ps:0");
    } catch (const shoal::Error& e) {
      ps_error = e.what();
    }
  });
  const shoal::Report report = job.RunTask(cluster, "worker:0");
  ps.join();  // the chief shut it down
  EXPECT_EQ(ps_error, "");
  EXPECT_GT(report.test_accuracy, 0.7);
  EXPECT_NE(ErrorOf([&] { job.RunTask(cluster, "worker:3"); }).code(), "OK");
}

TEST(ApiTest, AClusterClientTrainsVariablesOnAServerByName) {
  const std::vector<int> ports = shoal::FreeLoopbackPorts(1).value();
  const std::string address = absl::StrCat("127.0.0.1:", ports[0]);
  shoal::VariableServer server(address);
  shoal::ClusterClient client(nlohmann::json{{"ps", {address}}}.dump(), {{"w", {2, 2}}, {"b", {2}}});
  client.Create({"w", "b"}, {torch::ones({2, 2}), torch::zeros({2})}, "{kind: sgd, learning_rate: 0.5}");
  EXPECT_EQ(client.Apply({"w", "b"}, {torch::ones({2, 2}), torch::full({2}, 2.0f)}), 1);
  std::vector<torch::Tensor> values = client.Read({"w", "b"});
  EXPECT_TRUE(torch::allclose(values[0], torch::full({2, 2}, 0.5f)));
  EXPECT_TRUE(torch::allclose(values[1], torch::full({2}, -1.0f)));
  client.Assign({"b"}, {torch::full({2}, 7.0f)});
  EXPECT_TRUE(torch::allclose(client.Read({"b"})[0], torch::full({2}, 7.0f)));

  // Wrong dtype, wrong shape, unknown name: named, and nothing applied.
  shoal::Error dtype = ErrorOf([&] { client.Apply({"w"}, {torch::ones({2, 2}, torch::kFloat64)}); });
  EXPECT_NE(std::string(dtype.what()).find("float64"), std::string::npos) << dtype.what();
  shoal::Error shape = ErrorOf([&] { client.Apply({"w"}, {torch::ones({3})}); });
  EXPECT_NE(std::string(shape.what()).find("'w'"), std::string::npos) << shape.what();
  EXPECT_EQ(ErrorOf([&] { client.Read({"nope"}); }).code(), "NOT_FOUND");
  EXPECT_TRUE(torch::allclose(client.Read({"w"})[0], torch::full({2, 2}, 0.5f)));
  EXPECT_EQ(client.AddToCounter("global_step", 0), 1);

  client.ShutdownServers();
  EXPECT_TRUE(server.Wait(10));
}

// shoal::Embedding and shoal::EmbeddingBag: rows pulled by id in forward,
// each distinct id's summed gradient pushed by backward (not under
// NoGradGuard), pooled as torch's embedding_bag pools the same rows.
TEST(ApiTest, EmbeddingLayersPullByIdAndPushTheirGradientsOnBackward) {
  const std::vector<int> ports = shoal::FreeLoopbackPorts(2).value();
  const std::vector<std::string> addresses = {absl::StrCat("127.0.0.1:", ports[0]),
                                              absl::StrCat("127.0.0.1:", ports[1])};
  shoal::VariableServer first(addresses[0]), second(addresses[1]);
  shoal::ClusterClient client(nlohmann::json{{"ps", addresses}}.dump(), {});
  shoal::TableOptions options;
  options.rows = 100;
  options.dim = 4;
  options.optimizer_yaml = "{kind: sgd, learning_rate: 1.0}";
  client.CreateTable("emb", options);
  const torch::Tensor every = torch::arange(100, torch::kInt64);
  auto moved_since = [&](const torch::Tensor& before) { return before - client.PullRows("emb", every); };
  auto expected = [](std::vector<int64_t> ids, std::vector<float> by) {
    torch::Tensor e = torch::zeros({100, 4});
    for (size_t i = 0; i < ids.size(); ++i) e[ids[i]].fill_(by[i]);
    return e;
  };

  torch::Tensor before = client.PullRows("emb", every);
  shoal::Embedding embedding(&client, "emb");
  torch::Tensor out = embedding(torch::tensor({3, 8, 3, 51}, torch::kInt32).view({2, 2}));
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 2, 4}));
  EXPECT_TRUE(out[0][0].equal(before[3]) && out[1][1].equal(before[51]));
  out.sum().backward();  // id 3 is used twice: it moves twice
  EXPECT_TRUE(torch::allclose(moved_since(before), expected({3, 8, 51}, {2, 1, 1})));

  before = client.PullRows("emb", every);
  const torch::Tensor bags = torch::tensor({1, 2, 2, 7, 1, 9}, torch::kInt64).view({2, 3});
  const torch::Tensor flat = torch::tensor({1, 2, 2, 7, 1}, torch::kInt64), offsets = torch::tensor({0, 3});
  for (shoal::BagMode mode : {shoal::BagMode::kSum, shoal::BagMode::kMean}) {
    namespace F = torch::nn::functional;
    auto reference = F::EmbeddingBagFuncOptions();
    if (mode == shoal::BagMode::kSum) reference.mode(torch::kSum);
    shoal::EmbeddingBag bag(&client, "emb", mode);
    torch::NoGradGuard evaluation;  // nothing is pushed
    EXPECT_TRUE(torch::allclose(bag(bags), F::embedding_bag(bags, before, reference)));
    EXPECT_TRUE(torch::allclose(bag(flat, offsets), F::embedding_bag(flat, before, reference.offsets(offsets))));
  }
  EXPECT_TRUE(client.PullRows("emb", every).equal(before));
  shoal::EmbeddingBag mean(&client, "emb", shoal::BagMode::kMean);
  mean(flat, offsets).sum().backward();  // bags {1, 2, 2} and {7, 1}
  EXPECT_TRUE(torch::allclose(moved_since(before), expected({1, 2, 7}, {1.0f / 3 + 0.5f, 2.0f / 3, 0.5f})));

  // Padding (-1) is neither pulled nor pushed, and a mean leaves it out;
  // per-sample weights scale a sum.
  before = client.PullRows("emb", every);
  shoal::EmbeddingBag padded(&client, "emb", shoal::BagMode::kMean, /*padding_idx=*/-1);
  const torch::Tensor padded_bags = torch::tensor({1, 2, -1, 7, -1, -1}, torch::kInt64).view({2, 3});
  torch::Tensor pooled = padded(padded_bags);
  EXPECT_TRUE(torch::allclose(pooled, torch::stack({(before[1] + before[2]) / 2, before[7]})));
  pooled.sum().backward();
  EXPECT_TRUE(torch::allclose(moved_since(before), expected({1, 2, 7}, {0.5f, 0.5f, 1.0f})));
  before = client.PullRows("emb", every);
  {
    torch::NoGradGuard evaluation;
    shoal::EmbeddingBag weighted(&client, "emb", shoal::BagMode::kSum, -1);
    const torch::Tensor weights = torch::tensor({0.5f, 2.0f, 1.0f, 3.0f, 1.0f, 1.0f}).view({2, 3});
    EXPECT_TRUE(torch::allclose(weighted(padded_bags, torch::Tensor(), weights),
                                torch::stack({0.5 * before[1] + 2.0 * before[2], 3.0 * before[7]})));
  }

  // Bad input is named and changes nothing.
  shoal::Error float_ids = ErrorOf([&] { embedding(torch::ones({2})); });
  EXPECT_EQ(float_ids.code(), "INVALID_ARGUMENT");
  EXPECT_NE(std::string(float_ids.what()).find("shoal::Embedding 'emb': ids must be an integer tensor"),
            std::string::npos)
      << float_ids.what();
  shoal::Error shapes = ErrorOf([&] { mean(bags, offsets); });
  EXPECT_NE(std::string(shapes.what()).find("give ids [batch, bag], or ids [n] with offsets"), std::string::npos)
      << shapes.what();
  EXPECT_EQ(ErrorOf([&] { embedding(torch::tensor({100}, torch::kInt64)); }).code(), "OUT_OF_RANGE");
  // What torch refuses of the bags is a shoal::Error too, naming the layer.
  shoal::Error offsets_past_the_ids = ErrorOf([&] { mean(flat, torch::tensor({0, 9})); });
  EXPECT_EQ(offsets_past_the_ids.code(), "INVALID_ARGUMENT");
  EXPECT_NE(std::string(offsets_past_the_ids.what()).find("shoal::EmbeddingBag 'emb': "), std::string::npos)
      << offsets_past_the_ids.what();
  EXPECT_EQ(ErrorOf([&] { mean(bags, torch::Tensor(), torch::ones({2, 3})); }).code(), "INVALID_ARGUMENT");
  // A push the ps refuses (a NaN gradient) ends backward with its error.
  shoal::Error nan = ErrorOf([&] { (embedding(torch::tensor({5}, torch::kInt64)) * NAN).sum().backward(); });
  EXPECT_EQ(nan.code(), "INVALID_ARGUMENT");
  EXPECT_NE(std::string(nan.what()).find("not finite"), std::string::npos) << nan.what();
  shoal::Embedding unknown(&client, "nope");
  EXPECT_EQ(ErrorOf([&] { unknown(torch::tensor({1}, torch::kInt64)); }).code(), "NOT_FOUND");
  EXPECT_TRUE(client.PullRows("emb", every).equal(before));

  // The layers find their batch's distinct ids with UniqueIds (in order of
  // first appearance) and say so, so the client does not look again; a
  // push said to be distinct whose ids repeat is refused, naming the id.
  const auto [unique, where] = shoal::UniqueIds(torch::tensor({7, 3, 7, 51, 3}, torch::kInt64).view({5, 1}));
  EXPECT_TRUE(unique.equal(torch::tensor({7, 3, 51}, torch::kInt64))) << unique;
  EXPECT_TRUE(where.equal(torch::tensor({0, 1, 0, 2, 1}, torch::kInt64).view({5, 1}))) << where;
  constexpr auto kDistinct = shoal::ClusterClient::RowIds::kDistinct;
  EXPECT_TRUE(client.PullRows("emb", unique, kDistinct).equal(before.index_select(0, unique)));
  shoal::Error repeated = ErrorOf([&] {
    client.PushRows("emb", torch::tensor({7, 3, 7}, torch::kInt64), torch::ones({3, 4}), kDistinct);
  });
  EXPECT_EQ(repeated.code(), "INVALID_ARGUMENT");
  EXPECT_NE(std::string(repeated.what()).find("id 7 appears twice"), std::string::npos) << repeated.what();
  EXPECT_TRUE(client.PullRows("emb", every).equal(before));
  client.PushRows("emb", unique, torch::ones({3, 4}), kDistinct);
  EXPECT_TRUE(torch::allclose(moved_since(before), expected({7, 3, 51}, {1, 1, 1})));
  std::ostringstream printed;
  printed << *padded;
  EXPECT_EQ(printed.str(), "shoal::EmbeddingBag(table=emb, mode=mean, padding_idx=-1)");
}

TEST(ApiTest, AClusterClientReachesAPsOfAnotherTaskOverGrpc) {
  // The ps runs as a task (RunTask serves over gRPC only): the client's
  // calls cross the network path, codec included.
  const std::vector<int> ports = shoal::FreeLoopbackPorts(2).value();
  const std::string cluster = nlohmann::json{{"ps", {absl::StrCat("127.0.0.1:", ports[0])}},
                                             {"worker", {absl::StrCat("127.0.0.1:", ports[1])}}}
                                  .dump();
  std::thread ps([&] { shoal::Job().RunTask(cluster, "ps:0"); });
  shoal::ClusterClient client(cluster, {{"w", {3}}});
  client.Create({"w"}, {torch::zeros({3})}, "{kind: sgd, learning_rate: 1.0}");
  client.Apply({"w"}, {torch::ones({3})});
  const torch::Tensor value = client.Read({"w"})[0];
  EXPECT_TRUE(torch::allclose(value, torch::full({3}, -1.0f)));
  shoal::Error dtype = ErrorOf([&] { client.Apply({"w"}, {torch::ones({3}, torch::kFloat64)}); });
  EXPECT_NE(std::string(dtype.what()).find("float64"), std::string::npos) << dtype.what();
  client.ShutdownServers();
  ps.join();
}

}  // namespace
