// Watching a run: TensorBoard's event files (read back by an independent
// reader, tests/read_tfevents.py), Prometheus's /metrics scraped while a
// job runs, the Chrome trace, and where the workers' time went.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "quick_job.h"
#include "shoal/config/config.h"
#include "shoal/session/local_cluster.h"
#include "shoal/telemetry/event_file.h"
#include "shoal/telemetry/phase.h"
#include "shoal/telemetry/scrape_listener.h"
#include "shoal/telemetry/trace.h"
#include "temp_dir.h"
#include "source_paths.h"

namespace shoal {
namespace {

// What `command` prints on stdout; fails the test if it exits non-zero.
std::string Output(const std::string& command) {
  std::string out;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command << " said:\n" << out;
  return out;
}

// The reader's view of every event file under `dir`, by path.
std::map<std::string, nlohmann::json> ReadEventFiles(const std::filesystem::path& dir, bool cut = false) {
  std::map<std::string, nlohmann::json> files;
  std::istringstream lines(Output(absl::StrCat("/usr/bin/python3 ", SHOAL_SOURCE_DIR, "/tests/read_tfevents.py ",
                                               dir.string(), cut ? " --cut-copy" : "")));
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json file = nlohmann::json::parse(line);
    files[file["path"].get<std::string>()] = file;
  }
  return files;
}

std::set<std::string> Tags(const nlohmann::json& file) {
  std::set<std::string> tags;
  for (const auto& scalar : file["scalars"]) tags.insert(scalar[0].get<std::string>());
  return tags;
}

// One HTTP exchange with 127.0.0.1:`port`: the whole answer.
std::string Http(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  (void)!write(fd, request.data(), request.size());
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) answer.append(buffer, static_cast<size_t>(n));
  close(fd);
  return answer;
}

std::string Scrape(int port) { return Http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); }

// The value of the first series of `text` that starts with `series`; -1 if none.
double Series(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

TEST(EventFileTest, FramesRecordsAsTfRecordDoes) {
  // TFRecord's framing of the empty record: length 0, its masked CRC, no
  // bytes, the masked CRC of nothing.
  const std::string record = FrameRecord("");
  ASSERT_EQ(record.size(), 16u);
  EXPECT_EQ(record.substr(0, 8), std::string(8, '\0'));
  uint32_t empty_crc;
  std::memcpy(&empty_crc, record.data() + 12, 4);
  EXPECT_EQ(empty_crc, MaskedCrc32c("", 0));
  EXPECT_EQ(MaskedCrc32c("", 0), 0xa282ead8u);  // CRC32C of nothing is 0; the mask's offset is left
}

TEST(WatchingTest, AJobsEventFilesReadBackWithEveryRecordsCrcAndTheTagsTensorBoardShows) {
  const auto dir = FreshTempDir("watching_", "events");
  JobConfig config = QuickJob("async");
  config.training.epochs = 1;
  config.hooks.logdir = (dir / "tb").string();
  config.hooks.run_dir = "";
  ASSERT_TRUE(TrainInProcess(config, InProcOptions{}, nullptr).ok());

  const auto files = ReadEventFiles(dir / "tb", /*cut=*/true);
  // The chief's evaluation at the top, each worker's steps in its folder.
  const std::string top = (dir / "tb").string() + "/events.out.tfevents.";
  int workers = 0, evaluations = 0, cut = 0;
  for (const auto& [path, file] : files) {
    EXPECT_EQ(file["file_version"], "brain.Event:2") << path;
    if (path.find("(cut)") != std::string::npos) {
      // A killed job's file: every whole record before the cut still reads.
      EXPECT_TRUE(file["truncated"].get<bool>()) << path;
      const auto whole = files.at(path.substr(0, path.size() - 6));
      EXPECT_EQ(file["records"].get<int>(), whole["records"].get<int>() - 1) << path;
      ++cut;
      continue;
    }
    EXPECT_FALSE(file["truncated"].get<bool>()) << path;
    const std::set<std::string> tags = Tags(file);
    if (path.rfind(top, 0) == 0) {
      EXPECT_EQ(tags, (std::set<std::string>{"test/accuracy", "test/loss"})) << path;
      ++evaluations;
    } else {
      for (const char* tag : {"loss", "batch_accuracy", "examples_per_second", "learning_rate", "staleness"}) {
        EXPECT_TRUE(tags.count(tag)) << path << " has no " << tag;
      }
      EXPECT_NE(path.find("/worker_"), std::string::npos) << path;
      // Written at the global step, which grows.
      int64_t last_step = -1;
      for (const auto& scalar : file["scalars"]) {
        if (scalar[0] != "loss") continue;
        EXPECT_GT(scalar[1].get<int64_t>(), last_step);
        last_step = scalar[1].get<int64_t>();
      }
      ++workers;
    }
  }
  EXPECT_EQ(workers, 2);
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(cut, 3);
}

TEST(WatchingTest, ModesSayTheirOwn) {
  const auto dir = FreshTempDir("watching_", "modes");
  // sync with a backup worker: its dropped gradients.
  JobConfig sync = QuickJob("sync");
  sync.cluster.workers = 3;
  sync.training.replicas_to_aggregate = 2;
  sync.training.epochs = 1;
  sync.hooks.logdir = (dir / "sync").string();
  sync.hooks.run_dir = "";
  ASSERT_TRUE(TrainInProcess(sync, InProcOptions{}, nullptr).ok());
  std::set<std::string> sync_tags;
  for (const auto& [path, file] : ReadEventFiles(dir / "sync")) {
    for (const std::string& tag : Tags(file)) sync_tags.insert(tag);
  }
  EXPECT_TRUE(sync_tags.count("sync/stale_gradients_dropped"));
  EXPECT_FALSE(sync_tags.count("staleness"));  // an async figure
}

TEST(WatchingTest, MetricsMoveWhileTheJobRunsAndTheSummarySaysWhereTheTimeWent) {
  JobConfig config = QuickJob("async");  // 2 epochs: ~380 steps, over a second with the sleeps below
  config.hooks.run_dir = "";
  auto ports = FreeLoopbackPorts(1);
  ASSERT_TRUE(ports.ok());
  config.hooks.metrics_port = (*ports)[0];
  std::atomic<int64_t> steps{0};
  absl::StatusOr<TrainReport> report;
  std::thread job([&] {
    report = TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
      // worker:1 is the slow one, and the job lasts long enough to scrape.
      const bool slow = context.worker_index == 1;
      context.before_step = [&, slow](int64_t) {
        ++steps;
        absl::SleepFor(absl::Milliseconds(slow ? 10 : 3));
      };
    });
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (steps.load() < 20 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  const std::string first = Scrape(config.hooks.metrics_port);
  absl::SleepFor(absl::Milliseconds(200));
  const std::string second = Scrape(config.hooks.metrics_port);
  job.join();
  ASSERT_TRUE(report.ok()) << report.status();

  ASSERT_NE(first.find("HTTP/1.1 200 OK"), std::string::npos) << first;
  EXPECT_NE(first.find("text/plain; version=0.0.4"), std::string::npos);
  const std::string steps_0 = "shoal_worker_steps_total{task=\"worker:0\"}";
  EXPECT_GT(Series(first, steps_0), 0) << first;
  EXPECT_GT(Series(second, steps_0), Series(first, steps_0));
  const std::string applied = "shoal_ps_requests_total{code=\"OK\",kind=\"apply_gradients\",task=\"ps:0\"}";
  EXPECT_GT(Series(second, applied), Series(first, applied)) << second;
  EXPECT_GT(Series(second, "shoal_ps_received_bytes_total{task=\"ps:0\"}"), 0);
  EXPECT_GT(Series(second, "shoal_ps_sent_bytes_total{task=\"ps:0\"}"), 0);
  EXPECT_GT(Series(second, "shoal_ps_variables{task=\"ps:0\"}"), 0);
  EXPECT_GT(Series(second, "shoal_process_resident_bytes"), 1e6);
  EXPECT_GE(Series(second, "shoal_ps_waiting_calls{task=\"ps:0\"}"), 0);
  EXPECT_GT(Series(second, "shoal_worker_phase_seconds_count{phase=\"compute\",task=\"worker:1\"}"), 0);
  EXPECT_GT(Series(second, "shoal_worker_loss{task=\"worker:0\"}"), 0);
  EXPECT_GE(Series(second, "shoal_worker_staleness_steps{task=\"worker:0\"}"), 0);
  EXPECT_GT(Series(second, "shoal_ps_request_seconds_count{kind=\"apply_gradients\",task=\"ps:1\"}"), 0);

  // The summary: both workers' time, in parts that add up, and the slow one named.
  ASSERT_EQ(report->task_times.size(), 2u);
  for (const TaskTime& t : report->task_times) {
    EXPECT_GT(t.steps, 0) << t.task;
    EXPECT_GT(t.compute, 0) << t.task;
    EXPECT_GT(t.communication, 0) << t.task;
    EXPECT_LE(t.compute + t.communication + t.waiting + t.checkpoint, t.seconds * 1.001) << t.task;
  }
  const std::string summary = TimeSummary(*report);
  EXPECT_NE(summary.find("slowest worker: worker:1"), std::string::npos) << summary;
  // The sleeps are outside every phase: "other" holds them.
  EXPECT_TRUE(std::regex_search(summary, std::regex("other [1-9][0-9]%"))) << summary;
}

TEST(ScrapeListenerTest, AnswersOnlyAScrapeOfMetricsAndOnlyWithThePassword) {
  auto listener = ScrapeListener::Start("127.0.0.1:0", "s3cret", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = (*listener)->port();
  EXPECT_NE(Scrape(port).find("401 Unauthorized"), std::string::npos);
  auto with = [&](const std::string& credentials) {
    return Http(port, absl::StrCat("GET /metrics HTTP/1.1\r\nAuthorization: Basic ", absl::Base64Escape(credentials),
                                   "\r\n\r\n"));
  };
  EXPECT_NE(with("prometheus:wrong").find("401 Unauthorized"), std::string::npos);
  const std::string ok = with("prometheus:s3cret");
  EXPECT_NE(ok.find("200 OK"), std::string::npos) << ok;
  EXPECT_NE(ok.find("\r\n\r\nup 1\n"), std::string::npos) << ok;
  EXPECT_NE(Http(port, "POST /metrics HTTP/1.1\r\n\r\n").find("405"), std::string::npos);
  EXPECT_NE(Http(port, "GET /admin HTTP/1.1\r\n\r\n").find("404"), std::string::npos);
  EXPECT_NE(Http(port, "garbage\r\n\r\n").find("400"), std::string::npos);
  EXPECT_NE(Http(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n").find("431"),
            std::string::npos);
  // A client that says nothing is dropped after the deadline, and the next is served.
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_NE(with("x:s3cret").find("200 OK"), std::string::npos);
  close(idle);
  // A port in use is an error naming it.
  auto second = ScrapeListener::Start(absl::StrCat("127.0.0.1:", port), "", [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(absl::StrCat(port)), std::string::npos) << second.status();
}

nlohmann::json ReadTrace(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(WatchingTest, TheTraceHoldsTheStepsAskedForOnEveryWorkersAndPsTrack) {
  const auto dir = FreshTempDir("watching_", "trace");
  JobConfig config = QuickJob("sync");
  config.training.epochs = 1;
  config.hooks.run_dir = "";
  config.hooks.trace = (dir / "trace.json").string();
  config.hooks.trace_steps = "5:9";
  ASSERT_TRUE(TrainInProcess(config, InProcOptions{}, nullptr).ok());
  const nlohmann::json trace = ReadTrace(config.hooks.trace);
  std::map<int, std::string> tracks;
  std::map<std::string, std::set<std::string>> names;
  std::set<int64_t> steps;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name") tracks[event["tid"]] = event["args"]["name"];
  }
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] != "X") continue;
    EXPECT_GE(event["dur"].get<int64_t>(), 0);
    const std::string track = tracks.at(event["tid"].get<int>());
    names[track].insert(event["name"].get<std::string>());
    if (event["cat"] == "worker") steps.insert(event["args"]["step"].get<int64_t>());
  }
  EXPECT_EQ(steps, (std::set<int64_t>{5, 6, 7, 8, 9}));
  for (const char* worker : {"worker:0", "worker:1"}) {
    // sync pulls at its barrier: the push's read (a pull of its own would be empty)
    for (const char* phase : {"compute", "push", "wait"}) {
      EXPECT_TRUE(names[worker].count(phase)) << worker << " has no " << phase;
    }
  }
  // sync's barrier is the accumulate and the read at the step.
  for (const char* ps : {"ps:0", "ps:1"}) EXPECT_TRUE(names[ps].count("accumulate")) << ps;

  // The ring: each worker's last N steps.
  config.hooks.trace_steps = "3";
  ASSERT_TRUE(TrainInProcess(config, InProcOptions{}, nullptr).ok());
  std::set<int64_t> ring;
  const nlohmann::json last = ReadTrace(config.hooks.trace);
  for (const auto& event : last["traceEvents"]) {
    if (event["ph"] == "X" && event["cat"] == "worker") ring.insert(event["args"]["step"].get<int64_t>());
  }
  ASSERT_FALSE(ring.empty());
  EXPECT_LE(*ring.rbegin() - *ring.begin(), 2 + 1);  // the workers' last steps differ by at most one
  EXPECT_GT(*ring.begin(), 10);
}

TEST(WatchingTest, BadSettingsAreClearErrorsNamingTheKey) {
  for (const char* bad : {"0", "9:3", "a:b", "-4", "1:2:3", ""}) {
    auto config = ParseJobConfig(absl::StrCat("hooks: {trace_steps: '", bad, "'}"));
    ASSERT_FALSE(config.ok()) << bad;
    EXPECT_NE(config.status().message().find("hooks.trace_steps"), std::string::npos) << config.status();
  }
  auto port = ParseJobConfig("hooks: {metrics_port: 70000}");
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.status().message().find("hooks.metrics_port"), std::string::npos) << port.status();
  // A port another process holds: the job does not start, and says which.
  auto ports = FreeLoopbackPorts(1);
  ASSERT_TRUE(ports.ok());
  auto holder = ScrapeListener::Start(absl::StrCat("127.0.0.1:", (*ports)[0]), "", [] { return std::string(); });
  ASSERT_TRUE(holder.ok());
  JobConfig config = QuickJob("async");
  config.hooks.metrics_port = (*ports)[0];
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("hooks.metrics_port"), std::string::npos) << report.status();
}

TEST(PhaseTest, AWaitInsideAPushCountsAsWaitingNotAsThePush) {
  PhaseRecorder recorder(nullptr, 0, nullptr);
  {
    PhaseRecorder::Installed installed(&recorder);
    PhaseScope push(Phase::kPush);
    absl::SleepFor(absl::Milliseconds(20));
    {
      PhaseScope wait(Phase::kWait);
      absl::SleepFor(absl::Milliseconds(60));
    }
  }
  EXPECT_GE(recorder.seconds(Phase::kWait), 0.06);
  EXPECT_GE(recorder.seconds(Phase::kPush), 0.02);
  EXPECT_LT(recorder.seconds(Phase::kPush), 0.06);  // the wait is not in it
  // No recorder on this thread: a scope does nothing.
  PhaseScope nothing(Phase::kCompute);
}

}  // namespace
}  // namespace shoal
