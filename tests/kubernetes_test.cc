// The Kubernetes manifests in deploy/kubernetes/: they parse, their job
// config is valid, and every replica starts the right task, as the
// training operator's TF_CONFIG (or a StatefulSet pod's name) says, which
// `shoal resolve` reports from the replica's own command.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "temp_dir.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/config/config.h"
#include "source_paths.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

std::vector<YAML::Node> Manifest(const std::string& name) {
  return YAML::LoadAllFromFile(std::string(SHOAL_SOURCE_DIR) + "/deploy/kubernetes/" + name);
}

YAML::Node OfKind(const std::vector<YAML::Node>& docs, const std::string& kind, const std::string& name = "") {
  for (const YAML::Node& doc : docs) {
    if (doc["kind"].as<std::string>() == kind && (name.empty() || doc["metadata"]["name"].as<std::string>() == name)) {
      return doc;
    }
  }
  ADD_FAILURE() << "no " << kind << " " << name;
  return YAML::Node();
}

// Runs `command` with `env` (NAME=value words) and returns its output.
std::string RunWithEnv(const std::string& env, const std::string& command) {
  const std::string full = env + " " + command + " 2>&1";
  std::FILE* pipe = popen(full.c_str(), "r");
  std::string out;
  char buffer[4096];
  while (pipe != nullptr && std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  if (pipe != nullptr) pclose(pipe);
  return out;
}

std::string Quoted(const std::string& s) { return "'" + absl::StrReplaceAll(s, {{"'", "'\\''"}}) + "'"; }

// The training operator's TF_CONFIG for replica `index` of `type`: every
// replica type but the evaluator in the cluster, each task named
// <job>-<type>-<i>.<namespace>.svc:<port>.
std::string OperatorTfConfig(const YAML::Node& tfjob, const std::string& type, int index) {
  const std::string job = tfjob["metadata"]["name"].as<std::string>();
  const std::string ns = tfjob["metadata"]["namespace"].as<std::string>();
  std::map<std::string, std::vector<std::string>> cluster;
  for (const auto& replica : tfjob["spec"]["tfReplicaSpecs"]) {
    const std::string rtype = absl::AsciiStrToLower(replica.first.as<std::string>());
    if (rtype == "evaluator") continue;
    const int port = replica.second["template"]["spec"]["containers"][0]["ports"][0]["containerPort"].as<int>();
    for (int i = 0; i < replica.second["replicas"].as<int>(); ++i) {
      cluster[rtype].push_back(absl::StrCat(job, "-", rtype, "-", i, ".", ns, ".svc:", port));
    }
  }
  nlohmann::json doc = {{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}, {"environment", "cloud"}};
  return doc.dump();
}

// The replica's command with `shoal <command>` replaced by `shoal resolve`
// and the mounted config by `config`.
std::string ResolveCommand(const YAML::Node& command, const fs::path& config) {
  std::string line = SHOAL_BINARY + std::string(" resolve");
  for (size_t i = 2; i < command.size(); ++i) {
    const std::string arg = command[i].as<std::string>();
    line += " " + Quoted(arg == "/etc/shoal/job.yaml" ? config.string() : arg);
  }
  return line;
}

TEST(KubernetesTest, EveryTfJobReplicaStartsTheTaskItsTfConfigNames) {
  const fs::path dir = FreshTempDir("shoal_k8s_", "tfjob");
  const auto docs = Manifest("tfjob.yaml");
  const YAML::Node config_map = OfKind(docs, "ConfigMap");
  const YAML::Node tfjob = OfKind(docs, "TFJob");
  ASSERT_TRUE(tfjob.IsDefined());
  const std::string job_yaml = config_map["data"]["job.yaml"].as<std::string>();
  auto config = ParseJobConfig(job_yaml);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->checkpoint.dir.empty()) << "the evaluator follows the chief's checkpoints";
  // The chief's run folder (the trained model) on the claim, not the pod's disk.
  EXPECT_EQ(config->hooks.run_dir.rfind("/checkpoints/", 0), 0u) << config->hooks.run_dir;
  std::ofstream(dir / "job.yaml") << job_yaml;

  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"Chief", {"worker", "trains (the chief)"}},
      {"PS", {"server", "serves variables"}},
      {"Worker", {"worker", "trains"}},
      {"Evaluator", {"evaluator", "evaluates checkpoints"}}};
  int replicas_seen = 0;
  for (const auto& replica : tfjob["spec"]["tfReplicaSpecs"]) {
    const std::string type = replica.first.as<std::string>();
    ASSERT_TRUE(expected.count(type)) << type;
    const YAML::Node container = replica.second["template"]["spec"]["containers"][0];
    EXPECT_EQ(container["name"].as<std::string>(), "tensorflow") << type << ": the operator reads this container's port";
    EXPECT_EQ(container["ports"][0]["name"].as<std::string>(), "tfjob-port") << type;
    EXPECT_EQ(container["ports"][0]["containerPort"].as<int>(), 2222) << type;
    EXPECT_EQ(container["env"][0]["name"].as<std::string>(), "SHOAL_TOKEN") << type;
    EXPECT_EQ(container["env"][0]["valueFrom"]["secretKeyRef"]["name"].as<std::string>(), "shoal-token") << type;
    const YAML::Node command = container["command"];
    EXPECT_EQ(command[0].as<std::string>(), "shoal") << type;
    EXPECT_EQ(command[1].as<std::string>(), expected.at(type).first) << type;
    const std::string rtype = absl::AsciiStrToLower(type);
    for (int i = 0; i < replica.second["replicas"].as<int>(); ++i, ++replicas_seen) {
      const std::string out = RunWithEnv("TF_CONFIG=" + Quoted(OperatorTfConfig(tfjob, rtype, i)),
                                  ResolveCommand(command, dir / "job.yaml"));
      const std::string task = absl::StrCat("task /job:", rtype, "/task:", i, " ", expected.at(type).second, " at ");
      EXPECT_NE(out.find(task), std::string::npos) << type << " " << i << ":\n" << out;
      if (rtype == "evaluator") {
        EXPECT_NE(out.find("no address (not in the cluster)"), std::string::npos) << out;
      } else {
        EXPECT_NE(out.find(absl::StrCat("shoal-mnist-", rtype, "-", i, ".default.svc:2222")), std::string::npos)
            << out;
      }
    }
  }
  EXPECT_EQ(replicas_seen, 6);  // a chief, 2 ps, 2 workers, an evaluator
  fs::remove_all(dir);
}

TEST(KubernetesTest, EveryStatefulSetPodStartsTheTaskItsNameGives) {
  const fs::path dir = FreshTempDir("shoal_k8s_", "statefulset");
  const auto docs = Manifest("statefulset.yaml");
  const YAML::Node config_map = OfKind(docs, "ConfigMap");
  std::ofstream(dir / "job.yaml") << config_map["data"]["job.yaml"].as<std::string>();
  std::ofstream(dir / "cluster.json") << config_map["data"]["cluster.json"].as<std::string>();
  ASSERT_TRUE(ParseJobConfig(config_map["data"]["job.yaml"].as<std::string>()).ok());
  auto cluster = ClusterSpec::FromJson(config_map["data"]["cluster.json"].as<std::string>());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const char* job : {"ps", "worker"}) {
    const YAML::Node set = OfKind(docs, "StatefulSet", absl::StrCat("shoal-", job));
    const std::string service = set["spec"]["serviceName"].as<std::string>();
    EXPECT_EQ(OfKind(docs, "Service", service)["spec"]["clusterIP"].as<std::string>(), "None") << "headless";
    const int replicas = set["spec"]["replicas"].as<int>();
    ASSERT_EQ(cluster->NumTasks(job), replicas) << job;
    std::string command = set["spec"]["template"]["spec"]["containers"][0]["command"][2].as<std::string>();
    command = absl::StrReplaceAll(command, {{"exec shoal server", std::string("exec ") + SHOAL_BINARY + " resolve"},
                                            {"exec shoal worker", std::string("exec ") + SHOAL_BINARY + " resolve"},
                                            {"/etc/shoal/", dir.string() + "/"}});
    for (int i = 0; i < replicas; ++i) {
      const std::string pod = absl::StrCat("shoal-", job, "-", i);
      const std::string out = RunWithEnv("HOSTNAME=" + pod, "sh -c " + Quoted(command));
      EXPECT_NE(out.find(absl::StrCat("task /job:", job, "/task:", i, " ")), std::string::npos) << out;
      EXPECT_NE(out.find(absl::StrCat(pod, ".", service, ".default.svc:2222")), std::string::npos) << out;
    }
    if (std::string(job) == "worker") {
      // Scaled up past the cluster file's workers: the pod's worker joins (leased data).
      const std::string out = RunWithEnv(absl::StrCat("HOSTNAME=shoal-worker-", replicas), "sh -c " + Quoted(command));
      EXPECT_NE(out.find(absl::StrCat("task /job:worker/task:", replicas, " trains at no address")), std::string::npos)
          << out;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
