// Compute threads and the BLAS: how many threads a task takes and why, that
// setting them reaches OpenBLAS and libtorch (in new threads too), that the
// bootstrap's BLAS is an optimised one, and that every entry point (the
// in-process launcher, each launched process) sets them without help from
// the caller's environment.
#include "shoal/compute/compute_threads.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "shoal/cluster/cluster_spec.h"
#include "shoal/config/config.h"
#include "source_paths.h"

namespace shoal {
namespace {

TEST(ComputeThreadsTest, TheConfigWinsThenTheEnvironmentThenAShareOfTheCores) {
  EXPECT_EQ(ChooseComputeThreads(3, "5", true, 2, 16).threads, 3);
  EXPECT_EQ(ChooseComputeThreads(3, "5", true, 2, 16).source, "cluster.threads_per_task");
  EXPECT_EQ(ChooseComputeThreads(0, "5", true, 2, 16).threads, 5);
  EXPECT_EQ(ChooseComputeThreads(0, "5", true, 2, 16).source, "OPENBLAS_NUM_THREADS");
  EXPECT_EQ(ChooseComputeThreads(0, nullptr, true, 2, 2).threads, 1);
  EXPECT_EQ(ChooseComputeThreads(0, nullptr, true, 3, 16).threads, 5);
  EXPECT_EQ(ChooseComputeThreads(0, nullptr, true, 1, 2).threads, 2);
  EXPECT_EQ(ChooseComputeThreads(0, nullptr, true, 4, 2).threads, 1);  // more workers than cores
  EXPECT_EQ(ChooseComputeThreads(0, nullptr, true, 2, 2).source, "2 cores shared by 2 training tasks on this host");
  // A ps task's optimizer math is elementwise: one thread.
  EXPECT_EQ(ChooseComputeThreads(0, nullptr, false, 2, 16).threads, 1);
  // An environment value OpenBLAS itself would ignore is ignored here too.
  EXPECT_EQ(ChooseComputeThreads(0, "lots", true, 2, 2).source, "2 cores shared by 2 training tasks on this host");
  EXPECT_EQ(ChooseComputeThreads(0, "", true, 1, 2).threads, 2);
  EXPECT_EQ(ChooseComputeThreads(0, "0", true, 1, 2).threads, 2);
}

TEST(ComputeThreadsTest, SettingThemReachesOpenBlasAndLibtorchInNewThreadsToo) {
  const int before = at::get_num_threads();
  // Beside OpenBLAS's own pthread pool (the bootstrap's), libtorch keeps one
  // thread, so two spinning pools never share the cores.
  for (const auto [threads, intra_op] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{3, 1}}) {
    SetComputeThreads(threads);
    EXPECT_EQ(OpenBlasThreads(), threads);
    EXPECT_EQ(IntraOpThreadsBeside(threads), intra_op);
    EXPECT_EQ(at::get_num_threads(), intra_op);
    int in_new_thread = 0;
    std::thread([&] {
      UseComputeThreadsInThisThread();
      in_new_thread = at::get_num_threads();
    }).join();
    EXPECT_EQ(in_new_thread, intra_op);
  }
  SetComputeThreads(before);
}

TEST(ComputeThreadsTest, TheBootstrapsBlasIsOpenBlas) {
  const BlasInfo& blas = IdentifyBlas();
  EXPECT_EQ(blas.name.rfind("OpenBLAS", 0), 0u) << blas.name << " from " << blas.library;
  EXPECT_TRUE(blas.optimised);
  EXPECT_EQ(SlowBlasWarning(blas), "");
}

TEST(ComputeThreadsTest, ASlowBlasGetsOneWarningThatSaysHowToFixIt) {
  BlasInfo reference;
  reference.name = "unknown (/usr/lib/x86_64-linux-gnu/blas/libblas.so.3)";
  reference.library = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  reference.probe_gflops = 4.9;
  const std::string warning = SlowBlasWarning(reference);
  EXPECT_NE(warning.find("4.9 GFLOP/s"), std::string::npos) << warning;
  EXPECT_NE(warning.find("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"), std::string::npos) << warning;
  EXPECT_NE(warning.find("reference BLAS"), std::string::npos) << warning;
  EXPECT_NE(warning.find("apt-get install libopenblas0-pthread"), std::string::npos) << warning;
}

TEST(ComputeThreadsTest, TrainingTasksAreCountedPerHost) {
  auto spec = ClusterSpec::FromJson(
      R"({"ps": ["a:1"], "chief": ["a:2"], "worker": ["a:3", "b:1", "b:2", "[::1]:5", "[::1]:6"]})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->TrainingTasksOnHostOf({"ps", 0}), 2);  // the chief and worker 0 share host a
  EXPECT_EQ(spec->TrainingTasksOnHostOf({"chief", 0}), 2);
  EXPECT_EQ(spec->TrainingTasksOnHostOf({"worker", 1}), 2);
  EXPECT_EQ(spec->TrainingTasksOnHostOf({"worker", 3}), 2);
}

TEST(ComputeThreadsTest, ThreadsPerTaskParsesAndANegativeOneIsRefused) {
  EXPECT_EQ(ParseJobConfig("cluster: {threads_per_task: 4}")->cluster.threads_per_task, 4);
  auto bad = ParseJobConfig("cluster: {threads_per_task: -1}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cluster.threads_per_task"), std::string::npos) << bad.status();
}

// Runs `shoal train` with `env` in front (an `env` command line) and returns
// the chief's result; the CLI's stderr goes to `err`.
nlohmann::json TrainWith(const std::string& env, const std::string& flags, std::string* err = nullptr) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shoal_compute_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string result = (dir / "result.json").string(), log = (dir / "stderr").string();
  const std::string command = "env " + env + " " + SHOAL_BINARY +
                              " train --max_steps 30 --train_examples 2000 --quiet "
                              "--result_file " + result + " " + flags + " > /dev/null 2> " + log;
  const int status = std::system(command.c_str());
  std::ifstream in(result), log_in(log);
  const std::string stderr_text((std::istreambuf_iterator<char>(log_in)), {});
  if (err) *err = stderr_text;
  nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(status, 0) << command << "\n" << stderr_text;
  return json;
}

TEST(ComputeThreadsTest, EveryLauncherSetsThemWithoutTheCallersEnvironment) {
  const int share = std::max(1, UsableCores() / 2);
  std::string err;
  for (const std::string processes : {"", "--processes"}) {
    nlohmann::json result = TrainWith("-u OPENBLAS_NUM_THREADS", processes, &err);
    ASSERT_FALSE(result.is_discarded()) << processes;
    EXPECT_EQ(result["compute_threads"], share) << processes << ": " << result.dump();
    EXPECT_NE(result["compute_threads_source"].get<std::string>().find("training tasks on this host"),
              std::string::npos)
        << result.dump();
    EXPECT_EQ(result["blas"].get<std::string>().rfind("OpenBLAS", 0), 0u) << result.dump();
    EXPECT_EQ(err.find("warning"), std::string::npos) << err;  // the bootstrap's BLAS is fast
  }
  EXPECT_EQ(TrainWith("OPENBLAS_NUM_THREADS=2", "--processes")["compute_threads"], 2);
  EXPECT_EQ(TrainWith("OPENBLAS_NUM_THREADS=2", "--processes --threads_per_task 3")["compute_threads"], 3);
  EXPECT_EQ(TrainWith("-u OPENBLAS_NUM_THREADS", "--threads_per_task 3")["compute_threads_source"],
            "cluster.threads_per_task");
}

// The reference BLAS that libtorch's package would otherwise bring, put
// first in the library path: shoal says once, on stderr, how to fix it.
TEST(ComputeThreadsTest, TheReferenceBlasIsNamedWithAFix) {
  const std::string reference_dir = "/usr/lib/x86_64-linux-gnu/blas";
  ASSERT_TRUE(std::filesystem::exists(reference_dir + "/libblas.so.3"))
      << "scripts/bootstrap.sh installs libblas3 for this test";
  std::string err;
  nlohmann::json result = TrainWith("LD_LIBRARY_PATH=" + reference_dir, "", &err);
  ASSERT_FALSE(result.is_discarded());
  EXPECT_EQ(result["blas"].get<std::string>().find("OpenBLAS"), std::string::npos) << result.dump();
  EXPECT_NE(err.find("reference BLAS"), std::string::npos) << err;
  EXPECT_NE(err.find("libopenblas0-pthread"), std::string::npos) << err;
  size_t warnings = 0;
  for (size_t at = err.find("shoal: warning: matrix products"); at != std::string::npos;
       at = err.find("shoal: warning: matrix products", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << err;
}

}  // namespace
}  // namespace shoal
