// `shoal train` as a user runs it: config settings from the command line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "shoal/config/config.h"
#include "temp_dir.h"

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

CliRun RunTrain(const std::string& flags) {
  const std::filesystem::path dir = FreshTempDir("cli_", "train");
  const std::string command = std::string(SHOAL_BINARY) + " train --quiet --result_file " +
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

}  // namespace
}  // namespace shoal
