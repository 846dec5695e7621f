// `shoal train` as a user runs it: config settings from the command line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/script.h>

#include "shoal/config/config.h"
#include "temp_dir.h"
#include "source_paths.h"

namespace shoal {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

struct CliRun {
  int exit_code = -1;
  std::string out, err;
  nlohmann::json result;  // discarded when the job wrote none
};

CliRun RunTrain(const std::string& flags, bool quiet = true) {
  const std::filesystem::path dir = FreshTempDir("cli_", "train");
  const std::string command = std::string(SHOAL_BINARY) + " train" + (quiet ? " --quiet" : "") + " --result_file " +
                              (dir / "result.json").string() + " " + flags + " > " + (dir / "out").string() +
                              " 2> " + (dir / "err").string();
  CliRun run;
  const int status = std::system(command.c_str());
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = ReadAll(dir / "out");
  run.err = ReadAll(dir / "err");
  std::ifstream result(dir / "result.json");
  run.result = nlohmann::json::parse(result, nullptr, /*allow_exceptions=*/false);
  std::filesystem::remove_all(dir);
  return run;
}

TEST(CliTest, SetChangesAnyConfigKeyAndTheNamedFlagsStillApply) {
  CliRun run = RunTrain(
      "--set training.max_steps=12 --set=data.train_examples=3000 --set training.batch_size=50 "
      "--set 'model.layers=[784, 32, 10]' --mode sync --set training.optimizer.learning_rate=0.05 --workers 1");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("1 workers, sync"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("batch 50"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("784-32-10"), std::string::npos) << run.out;
  ASSERT_FALSE(run.result.is_discarded()) << run.err;
  EXPECT_EQ(run.result["global_step"], 12) << run.result.dump();
}

// A job of processes prints its report once: the launcher's, not the
// chief's as well.
TEST(CliTest, AJobOfProcessesPrintsItsReportOnce) {
  CliRun run = RunTrain("--processes --max_steps 30 --set data.train_examples=3000", /*quiet=*/false);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string line = "trained model: ";
  const size_t first = run.out.find(line);
  ASSERT_NE(first, std::string::npos) << run.out;
  EXPECT_EQ(run.out.find(line, first + 1), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("test accuracy"), run.out.rfind("test accuracy")) << run.out;
}

TEST(CliTest, PrintConfigShowsWhatTheFlagsMakeAsAConfigAndTrainsNothing) {
  CliRun run = RunTrain("--config " + std::string(SHOAL_SOURCE_DIR) +
                        "/configs/sync.yaml --set training.batch_size=77 --workers 3 --print_config");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(run.result.is_discarded());
  auto printed = ParseJobConfig(run.out);
  ASSERT_TRUE(printed.ok()) << printed.status() << "\n" << run.out;
  EXPECT_EQ(printed->training.batch_size, 77);
  EXPECT_EQ(printed->cluster.workers, 3);
  EXPECT_EQ(printed->training.mode, "sync");
}

TEST(CliTest, ABadSetNamesTheKeyAndTrainsNothing) {
  CliRun typo = RunTrain("--set training.batch_sise=50");
  EXPECT_EQ(typo.exit_code, 1);
  EXPECT_NE(typo.err.find("unknown key 'training.batch_sise'"), std::string::npos) << typo.err;
  EXPECT_TRUE(typo.result.is_discarded());
  CliRun missing = RunTrain("--set");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("--set needs KEY=VALUE"), std::string::npos) << missing.err;
  CliRun no_value = RunTrain("--set training.batch_size");
  EXPECT_EQ(no_value.exit_code, 1);
  EXPECT_NE(no_value.err.find("is not KEY=VALUE"), std::string::npos) << no_value.err;
}

TEST(CliTest, AMistypedFlagKeyOrCommandSuggestsTheNearestAndEveryCommandHasItsHelp) {
  CliRun flag = RunTrain("--metric_port 9100");
  EXPECT_EQ(flag.exit_code, 1);
  EXPECT_NE(flag.err.find("unknown flag --metric_port (did you mean --metrics_port?)"), std::string::npos) << flag.err;
  CliRun far = RunTrain("--colour blue");
  EXPECT_NE(far.err.find("unknown flag --colour"), std::string::npos) << far.err;
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;  // nothing is near
  CliRun key = RunTrain("--set hooks.logdri=/tmp/x");
  EXPECT_NE(key.err.find("unknown key 'hooks.logdri' (did you mean hooks.logdir?)"), std::string::npos) << key.err;
  const std::filesystem::path dir = FreshTempDir("cli_", "help");
  auto run = [&](const std::string& args) {
    const std::string command = std::string(SHOAL_BINARY) + " " + args + " > " + (dir / "out").string() + " 2>&1";
    const int status = std::system(command.c_str());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadAll(dir / "out"));
  };
  auto [code, said] = run("trian");
  EXPECT_EQ(code, 1);
  EXPECT_NE(said.find("unknown command 'trian' (did you mean train?)"), std::string::npos) << said;
  for (const char* command : {"train", "server", "worker", "evaluator", "plot", "export", "checkpoint", "resolve"}) {
    auto [help_code, help] = run(std::string(command) + " --help");
    EXPECT_EQ(help_code, 0) << command << ": " << help;
    EXPECT_EQ(help.rfind(std::string("usage:\n  shoal ") + command, 0), 0u) << help;
    EXPECT_EQ(help.find("shoal plot", 1) == std::string::npos, std::string(command) != "plot") << command;
  }
  auto [train_code, train] = run("train --help");
  EXPECT_NE(train.find("--metrics_port"), std::string::npos) << train;
  std::filesystem::remove_all(dir);
}

// A job leaves its model in a run folder and says where; `shoal export` turns
// a checkpoint into the same kind of file, and refuses bad input by name.
TEST(CliTest, TrainLeavesARunFolderAndExportWritesACheckpointsModel) {
  const std::filesystem::path dir = FreshTempDir("cli_", "export");
  const std::string common = "--set training.max_steps=30 --set data.train_examples=3000 --set data.test_examples=500 "
                             "--set 'model.layers=[784, 32, 10]' --workers 1 ";
  CliRun run = RunTrain(common + "--set hooks.run_dir=" + (dir / "runs").string() +
                        " --set hooks.run_name=first --checkpoint_dir " + (dir / "ckpt").string());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::filesystem::path model = dir / "runs" / "first" / "model.pt";
  EXPECT_NE(run.out.find("trained model: " + model.string()), std::string::npos) << run.out;
  EXPECT_TRUE(std::filesystem::exists(model));
  EXPECT_TRUE(std::filesystem::exists(dir / "runs" / "first" / "report.json"));
  auto run_export = [&](const std::string& flags) {
    const std::string command = std::string(SHOAL_BINARY) + " export " + common + flags + " > " +
                                (dir / "out").string() + " 2> " + (dir / "err").string();
    const int status = std::system(command.c_str());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadAll(dir / "out") + ReadAll(dir / "err"));
  };
  const auto [exit_code, said] =
      run_export("--checkpoint " + (dir / "ckpt").string() + " --out " + (dir / "exported.pt").string());
  ASSERT_EQ(exit_code, 0) << said;
  EXPECT_NE(said.find("global step 30"), std::string::npos) << said;
  // One worker: its last step is in the final checkpoint, so both files hold the same values.
  auto parameters = [](const std::filesystem::path& path) {
    std::vector<torch::Tensor> values;
    for (const auto& p : torch::jit::load(path.string()).named_parameters()) values.push_back(p.value);
    return values;
  };
  const std::vector<torch::Tensor> exported = parameters(dir / "exported.pt"), kept = parameters(model);
  ASSERT_EQ(exported.size(), 4u);
  ASSERT_EQ(kept.size(), 4u);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(exported[i].equal(kept[i])) << i;
  const auto [bad_code, bad_said] = run_export("--checkpoint " + (dir / "ckpt").string() + " --member 1 --out " +
                                               (dir / "member.pt").string());
  EXPECT_EQ(bad_code, 1);
  EXPECT_NE(bad_said.find("a member (1) picks one of a population's models"), std::string::npos) << bad_said;
  EXPECT_FALSE(std::filesystem::exists(dir / "member.pt"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal
