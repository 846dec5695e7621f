// The trained model leaving shoal: each model kind's TorchScript form, the
// model a job hands back (TrainingMode::Final), the run folder a job leaves,
// and `shoal export` of a checkpoint, bad input included.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "quick_job.h"
#include "scripted_modules.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/data/npy.h"
#include "shoal/export/export.h"
#include "shoal/export/model_files.h"
#include "shoal/model/gated_ensemble.h"
#include "shoal/model/model_factory.h"
#include "shoal/model/module_model.h"
#include "shoal/session/evaluator.h"
#include "shoal/session/local_cluster.h"
#include "shoal/shoal.h"
#include "shoal/strategy/population_strategy.h"
#include "temp_dir.h"
#include "source_paths.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// Values unlike any initial ones, so that a script holding the wrong
// tensor, or none, cannot pass; variances stay positive.
std::vector<torch::Tensor> RandomLike(const std::vector<torch::Tensor>& tensors, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& t : tensors) {
    values.push_back(t.scalar_type() == torch::kFloat32 ? torch::rand_like(t) * 0.2 + 0.01
                                                        : torch::full_like(t, 7));
  }
  return values;
}

// Saved and loaded again, as a user without shoal would load it.
torch::jit::Module RoundTrip(const torch::jit::Module& module, const fs::path& path) {
  EXPECT_TRUE(SaveScriptFile(module, path.string()).ok());
  return torch::jit::load(path.string());
}

TEST(ModelScriptTest, EveryBuiltInKindScriptsToItsOwnEvaluationForward) {
  const fs::path dir = FreshTempDir("shoal_export_", "kinds");
  ModelConfig mlp;
  mlp.layers = {784, 40, 20, 10};
  mlp.activation = "tanh";
  ModelConfig cnn;
  cnn.kind = "cnn";
  cnn.cnn.conv = {{8, 3, 1, -1, 2}, {16, 3, 2, 1, 0}};
  cnn.cnn.dense = {32};
  ModelConfig scripted;
  scripted.kind = "torchscript";
  scripted.path = (dir / "net.pt").string();
  SaveScriptedMlp(scripted.path);
  for (const ModelConfig& config : {mlp, cnn, scripted}) {
    SCOPED_TRACE(config.kind);
    auto model = MakeModel(config).value();
    model->Load(RandomLike(model->variables(), 1));
    model->LoadBuffers(RandomLike(model->buffers(), 2));
    model->SetTraining(false);
    auto script = model->Script();
    ASSERT_TRUE(script.ok()) << script.status();
    torch::jit::Module loaded = RoundTrip(*script, dir / (config.kind + ".pt"));
    torch::NoGradGuard no_grad;
    const torch::Tensor images = torch::randn({6, 1, 28, 28});
    const torch::Tensor expected = model->Forward(images);
    EXPECT_TRUE(torch::allclose(loaded.forward({images}).toTensor(), expected, 1e-5, 1e-5));
    // Every parameter and buffer went along, and nothing else.
    EXPECT_EQ(loaded.named_parameters().size(), model->variables().size());
    EXPECT_EQ(loaded.named_buffers().size(), model->buffers().size());
  }
}

TEST(ModelScriptTest, AGatedEnsembleScriptsToItsMasterWeightedVote) {
  const fs::path dir = FreshTempDir("shoal_export_", "gated");
  ModelConfig base;
  base.layers = {784, 16, 10};
  GatedModelConfig gated;
  gated.trunk = {24};
  gated.networks = {{{12}, std::nullopt}, {{20}, std::nullopt}, {{}, std::nullopt}};
  gated.master_sees_input = true;
  auto resolved = ResolveGatedConfig(gated, base, 3);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  auto ensemble = GatedEnsemble::Create(base, *resolved).value();
  torch::manual_seed(4);
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& v : ensemble->variables()) values.push_back(torch::randn_like(v));
  ensemble->Load(values);
  ensemble->SetTraining(false);
  auto script = ensemble->Script();
  ASSERT_TRUE(script.ok()) << script.status();
  torch::jit::Module loaded = RoundTrip(*script, dir / "gated.pt");
  const torch::Tensor images = torch::randn({64, 784});
  const torch::Tensor votes = loaded.forward({images}).toTensor();
  EXPECT_EQ(votes.sizes(), (std::vector<int64_t>{64, 10}));
  EXPECT_TRUE(votes.argmax(1).equal(ensemble->Predict(images)));
}

struct TinyNet : torch::nn::Module {
  TinyNet() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
  torch::Tensor forward(torch::Tensor x) { return fc(x.flatten(1)); }
  torch::nn::Linear fc{nullptr};
};

TEST(ModelScriptTest, AProgramsCppModuleSaysWhyItHasNoScript) {
  auto model = ModuleModel::Create(Module::Of<TinyNet>("TinyNet"), 1, "").value();
  const absl::Status why = model->Script().status();
  EXPECT_TRUE(absl::IsUnimplemented(why)) << why;
  EXPECT_NE(why.message().find("module 'TinyNet'"), std::string::npos) << why;
  EXPECT_NE(why.message().find("weights.pt"), std::string::npos) << why;
}

// A population hands back its fittest member by the fitness each measured
// last, or the member asked for, under the module's own names.
TEST(FinalModelTest, APopulationHandsBackItsFittestMemberOrTheOneAskedFor) {
  JobConfig config = QuickJob("population");
  config.model.layers = {784, 8, 10};
  config.cluster.workers = 4;
  const TrainingMode* mode = FindMode("population").value();
  std::map<std::string, torch::Tensor> held;
  const std::vector<float> fitness = {0.5f, 0.9f, 0.7f, 0.1f};
  for (int m = 0; m < 4; ++m) {
    auto model = MakeModel(MemberModel(config, m)).value();
    const std::vector<torch::Tensor> values = RandomLike(model->variables(), 10 + m);
    for (size_t i = 0; i < values.size(); ++i) held[model->variable_names()[i]] = values[i];
    held[FitnessVariable(m)] = torch::tensor({fitness[m], 0.0f, 0.0f});
  }
  const ReadTensors read = [&held](const std::vector<std::string>& names) -> absl::StatusOr<std::vector<torch::Tensor>> {
    std::vector<torch::Tensor> values;
    for (const std::string& name : names) values.push_back(held.at(name));
    return values;
  };
  auto fittest = mode->Final(config, 4, read, -1);
  ASSERT_TRUE(fittest.ok()) << fittest.status();
  EXPECT_EQ(fittest->member, 1);
  ASSERT_EQ(fittest->names.front(), "dense_1/kernel");
  EXPECT_TRUE(fittest->values.front().equal(held.at(MemberScope(1) + "dense_1/kernel")));
  ASSERT_TRUE(fittest->script.ok()) << fittest->script.status();
  auto asked = mode->Final(config, 4, read, 3);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_TRUE(asked->values.back().equal(held.at(MemberScope(3) + "dense_2/bias")));
  const absl::Status beyond = mode->Final(config, 4, read, 4).status();
  EXPECT_TRUE(absl::IsInvalidArgument(beyond)) << beyond;
  EXPECT_NE(beyond.message().find("member 4 is out of range: the population has 4 members"), std::string::npos)
      << beyond;
  const absl::Status not_a_population = FindMode("async").value()->Final(config, 4, read, 0).status();
  EXPECT_TRUE(absl::IsInvalidArgument(not_a_population)) << not_a_population;
}

TEST(FinalModelTest, ValuesOfAnotherModelAreRefusedNamingTheVariable) {
  JobConfig config = QuickJob();
  const ReadTensors read = [](const std::vector<std::string>& names) -> absl::StatusOr<std::vector<torch::Tensor>> {
    std::vector<torch::Tensor> values;
    for (size_t i = 0; i < names.size(); ++i) values.push_back(torch::zeros({3}));
    return values;
  };
  const absl::Status refused = FindMode("async").value()->Final(config, 2, read, -1).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("variable 'dense_1/kernel' is float32 [3] where the configured model has "
                                   "float32 [784, 256]"),
            std::string::npos)
      << refused;
}

// What TrainInProcess's chief evaluated, evaluated again from the model file.
double FileAccuracy(const std::string& model_file, const Dataset& test) {
  torch::jit::Module model = torch::jit::load(model_file);
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model.forward({test.images}).toTensor();
  return logits.argmax(1).eq(test.labels).to(torch::kFloat64).mean().item<double>();
}

TEST(RunFolderTest, AJobLeavesItsModelWhichScoresTheReportsAccuracyWithoutShoal) {
  const fs::path dir = FreshTempDir("shoal_export_", "run_folder");
  JobConfig config = QuickJob();
  config.training.epochs = 1;
  config.hooks.run_dir = (dir / "runs").string();
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(fs::path(report->run_dir).parent_path(), dir / "runs");
  ASSERT_EQ(report->model_file, (fs::path(report->run_dir) / "model.pt").string());
  const Dataset test = LoadData(config).value().test;
  EXPECT_NEAR(FileAccuracy(report->model_file, test), report->test_accuracy, 1e-9);
  auto weights = LoadWeightsFile((fs::path(report->run_dir) / "weights.pt").string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->names, report->trained_names);
  EXPECT_EQ(weights->names.size(), 6u);
  std::ifstream json_file(fs::path(report->run_dir) / "report.json");
  const nlohmann::json json = nlohmann::json::parse(json_file);
  EXPECT_EQ(json.at("model_file"), report->model_file);
  EXPECT_DOUBLE_EQ(json.at("test_accuracy").get<double>(), report->test_accuracy);
  // A second job the same second gets a folder of its own.
  config.training.max_steps = 5;
  auto second = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->run_dir, report->run_dir);
  // hooks.run_dir "" leaves nothing, and the trained values still come back.
  config.hooks.run_dir = "";
  auto none = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->run_dir.empty());
  EXPECT_EQ(none->trained_values.size(), 6u);
  // A run folder that cannot be made (a file stands where it would go)
  // costs the files, not the job: it says why, and the values come back.
  std::ofstream(dir / "a_file") << "not a folder";
  config.hooks.run_dir = (dir / "a_file").string();
  auto blocked = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(blocked.ok()) << blocked.status();
  EXPECT_TRUE(blocked->run_dir.empty());
  EXPECT_NE(blocked->no_model_file.find("a_file"), std::string::npos) << blocked->no_model_file;
  EXPECT_EQ(blocked->trained_values.size(), 6u);
}

TEST(RunFolderTest, AJobOfProcessesHandsBackItsTrainedValues) {
  const fs::path dir = FreshTempDir("shoal_export_", "processes");
  JobConfig config = QuickJob();
  config.training.max_steps = 60;
  config.transport.kind = "grpc";
  config.hooks.run_dir = (dir / "runs").string();
  config.hooks.run_name = "named";
  auto report = TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->run_dir, (dir / "runs" / "named").string());
  ASSERT_EQ(report->trained_names.size(), 6u);
  torch::jit::Module model = torch::jit::load(report->model_file);
  std::map<std::string, torch::Tensor> in_file;
  for (const auto& p : model.named_parameters()) in_file[p.name] = p.value;
  EXPECT_TRUE(report->trained_values[0].equal(in_file.at("dense_1_kernel")));
  EXPECT_NEAR(FileAccuracy(report->model_file, LoadData(config).value().test), report->test_accuracy, 1e-9);
}

// A checkpoint of a short job, for the export tests.
struct SavedJob {
  JobConfig config;
  TrainReport report;
};
SavedJob TrainWithCheckpoints(const fs::path& dir) {
  SavedJob saved{QuickJob(), {}};
  saved.config.training.max_steps = 40;
  saved.config.checkpoint.dir = (dir / "checkpoints").string();
  saved.config.hooks.run_dir = "";
  auto report = TrainInProcess(saved.config, InProcOptions{}, nullptr);
  EXPECT_TRUE(report.ok()) << report.status();
  if (report.ok()) saved.report = *report;
  return saved;
}

TEST(ExportTest, ACheckpointExportsToAModelThatPredictsAsTheEvaluator) {
  const fs::path dir = FreshTempDir("shoal_export_", "checkpoint");
  const SavedJob job = TrainWithCheckpoints(dir);
  ExportOptions options;
  options.checkpoint = job.config.checkpoint.dir;
  options.out = (dir / "model.pt").string();
  auto exported = ExportCheckpoint(job.config, options);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->checkpoint, job.report.last_checkpoint);
  EXPECT_EQ(exported->step, job.report.global_step);
  EXPECT_TRUE(exported->tables_dir.empty());
  const Dataset test = LoadData(job.config).value().test;
  auto evaluated = EvaluateCheckpoint(job.config, exported->checkpoint, test);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  EXPECT_NEAR(FileAccuracy(options.out, test), evaluated->test_accuracy, 1e-9);
  // --step picks one; a step that has none lists those there are.
  options.step = 12345;
  const absl::Status no_step = ExportCheckpoint(job.config, options).status();
  EXPECT_TRUE(absl::IsNotFound(no_step)) << no_step;
  EXPECT_NE(no_step.message().find(absl::StrCat("its steps: ", job.report.global_step)), std::string::npos)
      << no_step;
}

TEST(ExportTest, BadInputIsAClearErrorAndWritesNoFile) {
  const fs::path dir = FreshTempDir("shoal_export_", "bad");
  const SavedJob job = TrainWithCheckpoints(dir);
  ExportOptions options;
  options.checkpoint = job.report.last_checkpoint;
  options.out = (dir / "model.pt").string();
  auto refused = [&](const JobConfig& config, const ExportOptions& o, absl::StatusCode code,
                     const std::string& says) {
    const absl::Status status = ExportCheckpoint(config, o).status();
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(status.message().find(says), std::string::npos) << status;
    for (const auto& entry : fs::directory_iterator(dir)) {
      EXPECT_EQ(entry.path().filename().string().find("model.pt"), std::string::npos) << entry.path();
    }
  };
  // A checkpoint of another model: the variable it lacks or holds otherwise.
  JobConfig other = job.config;
  other.model.layers = {784, 64, 10};
  refused(other, options, absl::StatusCode::kInvalidArgument, "variable 'dense_1/kernel' is float32 [784, 256]");
  other.model.layers = {784, 256, 128, 64, 10};
  refused(other, options, absl::StatusCode::kNotFound, "holds no variable 'dense_4/kernel'");
  // A member of a mode that trains one model.
  ExportOptions member = options;
  member.member = 2;
  refused(job.config, member, absl::StatusCode::kInvalidArgument, "a member (2) picks one of a population's models");
  // An output folder that does not exist.
  ExportOptions nowhere = options;
  nowhere.out = (dir / "no_such_folder" / "model.pt").string();
  refused(job.config, nowhere, absl::StatusCode::kNotFound, "no_such_folder");
  // A damaged shard: a flipped byte in the middle of a tensor.
  const fs::path copy = dir / "damaged" / fs::path(job.report.last_checkpoint).filename();
  fs::create_directories(copy.parent_path());
  fs::copy(job.report.last_checkpoint, copy, fs::copy_options::recursive);
  const fs::path shard = copy / "shard-0.ckpt";
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    byte = static_cast<char>(byte ^ 0x5a);
    file.write(&byte, 1);
  }
  ExportOptions damaged = options;
  damaged.checkpoint = copy.string();
  refused(job.config, damaged, absl::StatusCode::kDataLoss, "shard-0.ckpt");
}

// A click model's tables export as NPY pairs that hold, id for id, the rows
// the ps tasks serve: two ps tasks, a dynamic table, saved by a client.
TEST(ExportTest, ATablesExportHoldsThePsTasksOwnRows) {
  const fs::path dir = FreshTempDir("shoal_export_", "tables");
  JobConfig config = DefaultJobConfig();
  config.model.kind = "click";
  config.model.loss = "logistic";
  config.model.click.integer_features = 3;
  config.model.click.categorical_features = 4;
  config.model.click.rows = 0;
  config.model.click.dim = 4;
  config.model.click.hidden = {8};
  auto model = MakeModel(config.model).value();
  const wire::TableDef table = model->row_tables()->TableDefs()[0];
  VariableServer ps0("127.0.0.1:0", "", (dir / "checkpoints").string());
  VariableServer ps1("127.0.0.1:0", "", (dir / "checkpoints").string());
  std::vector<VariableShape> shapes;
  for (const VariableSpec& spec : model->VariableSpecs()) shapes.push_back({spec.name, spec.shape});
  ClusterClient client(absl::StrCat(R"({"ps": [")", ps0.address(), R"(", ")", ps1.address(), R"("]})"), shapes);
  client.Create(model->variable_names(), RandomLike(model->variables(), 3));
  TableOptions options;
  options.dim = table.dim();
  client.CreateTable(table.name(), options);
  torch::manual_seed(8);
  const torch::Tensor ids = torch::randperm(50000, torch::kInt64).narrow(0, 0, 3000) * 7;
  client.PushRows(table.name(), ids, torch::randn({3000, table.dim()}));
  const std::string saved = client.Save((dir / "checkpoints").string(), 10);
  ExportOptions export_options;
  export_options.checkpoint = saved;
  export_options.out = (dir / "dense.pt").string();
  auto exported = ExportCheckpoint(config, export_options);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->tables.size(), 1u);
  EXPECT_EQ(exported->tables[0].rows, 3000);
  EXPECT_EQ(exported->tables[0].shards, 2);
  std::ifstream manifest_file(dir / "tables" / "manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
  EXPECT_EQ(manifest.at("click").at("wide_column"), true);
  int64_t checked = 0;
  for (const nlohmann::json& shard : manifest.at("tables")[0].at("shards")) {
    const torch::Tensor shard_ids = ReadNpy((dir / "tables" / shard.at("ids").get<std::string>()).string()).value();
    const torch::Tensor rows = ReadNpy((dir / "tables" / shard.at("rows").get<std::string>()).string()).value();
    ASSERT_EQ(rows.sizes(), (std::vector<int64_t>{shard_ids.size(0), table.dim()}));
    EXPECT_TRUE(rows.equal(client.PullRows(table.name(), shard_ids)));
    checked += shard_ids.size(0);
  }
  EXPECT_EQ(checked, 3000);
  // The dense part scripted from the same checkpoint takes the pooled rows.
  torch::jit::Module dense = torch::jit::load(export_options.out);
  const torch::Tensor logits =
      dense.forward({torch::randint(0, 9, {5, 3}, torch::kInt64), torch::randn({5, 4, table.dim()})}).toTensor();
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{5}));
  // A folder that is not an export's is never replaced.
  fs::create_directories(dir / "mine");
  std::ofstream(dir / "mine" / "notes.txt") << "keep me";
  export_options.tables_dir = (dir / "mine").string();
  const absl::Status kept = ExportCheckpoint(config, export_options).status();
  EXPECT_TRUE(absl::IsAlreadyExists(kept)) << kept;
  EXPECT_TRUE(fs::exists(dir / "mine" / "notes.txt"));
  client.ShutdownServers();
}

}  // namespace
}  // namespace shoal
