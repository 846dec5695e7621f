// The table of training modes and the step driver: every mode is found by
// its name and gives its own rules; the driver calls a policy's parts in
// order, rejoins after a rewound push, and sends nothing a hook stopped.
#include "shoal/strategy/training_mode.h"

#include <gtest/gtest.h>

#include "inproc_servers.h"
#include "quick_job.h"
#include "temp_dir.h"
#include "shoal/core/status.h"
#include "shoal/session/evaluator.h"
#include "shoal/strategy/step_driver.h"

namespace shoal {
namespace {

TEST(TrainingModeTest, EveryModeIsFoundByItsNameInOneTable) {
  const std::vector<std::string> names = ModeNames();
  EXPECT_EQ(names, (std::vector<std::string>{"async", "sync", "ssp", "downpour", "model_average", "easgd",
                                             "population", "gated"}));
  for (const std::string& name : names) {
    auto mode = FindMode(name);
    ASSERT_TRUE(mode.ok()) << mode.status();
    EXPECT_EQ((*mode)->name(), name);
    EXPECT_NE((*mode)->MakeStrategy(), nullptr) << name;
  }
  auto unknown = FindMode("hogwild");
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_NE(unknown.status().message().find(
                "'training.mode' 'hogwild' is unknown; known: async, sync, ssp, downpour, model_average, easgd, "
                "population, gated"),
            std::string::npos)
      << unknown.status();
  EXPECT_NE(ParseJobConfig("training: {mode: hogwild}").status().message().find("known: async"), std::string::npos);
}

TEST(TrainingModeTest, EachModeGivesItsOwnRules) {
  EXPECT_EQ(DefaultOptimizer("downpour").kind(), "adagrad");  // DistBelief's
  EXPECT_EQ(DefaultOptimizer("async").kind(), "adam");
  EXPECT_EQ(DefaultOptimizer("population").kind(), "momentum");  // its learning-rate prior is SGD's scale
  EXPECT_EQ(ParseJobConfig("training: {mode: population}")->training.optimizer.kind(), "momentum");
  EXPECT_EQ(ParseJobConfig("training: {mode: downpour}")->training.optimizer.kind(), "adagrad");

  JobConfig sync = QuickJob("sync");
  sync.training.batch_size = 32;
  sync.training.replicas_to_aggregate = 2;
  EXPECT_EQ(ExamplesPerStep(sync, 3), 64);  // one batch from each aggregated replica
  EXPECT_EQ(MaxSteps(sync, 12000, 3), 2 * 12000 / 64);
  EXPECT_EQ(ExamplesPerStep(QuickJob("async"), 3), 64);

  JobConfig population = QuickJob("population");
  population.population.validation_examples = 2000;
  EXPECT_EQ(MaxSteps(population, 12000, 4), 2 * 10000 * 4 / 64);  // every member trains on all but validation

  for (const char* mode : {"population", "gated"}) {
    JobConfig config = QuickJob(mode);
    EXPECT_FALSE(FindMode(mode).value()->TrainsOneModel()) << mode;
    config.checkpoint.dir = "/tmp/unused";
    EXPECT_TRUE(absl::IsFailedPrecondition(CheckEvaluatorConfig(config))) << mode;
    config.model.loss = "mse";
    EXPECT_NE(ValidateJobConfig(config).message().find("classifies"), std::string::npos) << mode;
  }
  // A mode's own checks run with the config's: against the cluster it gives.
  EXPECT_NE(ParseJobConfig("cluster: {workers: 3}\ntraining: {mode: population}\npopulation: "
                           "{workers_per_member: 2, variables_on: ps}")
                .status()
                .message()
                .find("not a multiple of 'population.workers_per_member'"),
            std::string::npos);
  EXPECT_TRUE(ParseJobConfig("cluster: {workers: 3}\ntraining: {replicas_to_aggregate: 5}").ok())
      << "only sync reads replicas_to_aggregate";
}

// A policy that records what the driver asks of it: two steps; the first
// push is rewound once (a restore), the last ends training.
// With lose_first_join, the first join finds a variable gone, as when a ps
// task is lost while the worker joins the job.
class RecordingPolicy : public StepPolicy {
 public:
  std::vector<std::string> calls;
  bool lose_first_join = false;
  bool HasStepsLeft() const override { return steps_ < 2; }
  int64_t LocalStep() const override { return steps_; }
  int64_t GlobalStep() const override { return steps_; }
  absl::Status Join(Model& /*model*/) override {
    if (lose_first_join) {
      lose_first_join = false;
      calls.push_back("join (variable lost)");
      return absl::NotFoundError("variable 'dense_1/kernel' not found on /job:ps/task:0");
    }
    calls.push_back("join");
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Barrier() override {
    calls.push_back("barrier");
    return true;
  }
  absl::Status Pull(Model& /*model*/) override {
    calls.push_back("pull");
    return absl::OkStatus();
  }
  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    SHOAL_ASSIGN_OR_RETURN(bool send, check(model.variable_names(), gradients));
    if (!send) {
      calls.push_back("held back");
      return PushOutcome::kStopped;
    }
    if (!rewound_) {
      rewound_ = true;
      calls.push_back("push (rewound)");
      return PushOutcome::kRewound;
    }
    calls.push_back("push");
    step.global_step = ++steps_;
    return steps_ == 2 ? PushOutcome::kLastStep : PushOutcome::kStepDone;
  }

 private:
  int64_t steps_ = 0;
  bool rewound_ = false;
};

// Stops training at its first update.
class StopAtFirstUpdate : public TrainingHook {
 public:
  absl::Status BeforeUpdate(const std::vector<std::string>& /*names*/, const std::vector<torch::Tensor>& /*update*/,
                            const StepInfo& /*step*/, StopRequest* stop) override {
    stop->requested = true;
    stop->reason = "test";
    return absl::OkStatus();
  }
};

TEST(StepDriverTest, CallsThePolicyInOrderAndRejoinsAfterARewoundPush) {
  InProcChief chief(QuickJob("async"), 10);
  RecordingPolicy policy;
  auto result = DriveSteps(chief.context, policy);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->local_steps, 2);  // the rewound step does not count
  EXPECT_EQ(policy.calls, (std::vector<std::string>{"join", "barrier", "pull", "push (rewound)", "join", "barrier",
                                                    "pull", "push", "barrier", "pull", "push"}));
}

// A ps task lost while a worker joins the job (its variables were there a
// moment before) is recovered from as one lost mid-step is: the worker
// waits for the job to recover, joins again and trains. (A CI run once lost
// easgd's second worker so, as it joined while the first had already
// checkpointed and the ps was killed.) Without checkpoints there is nothing
// to recover from, and the error ends the worker.
TEST(StepDriverTest, APsLostAsTheWorkerJoinsIsRecoveredFrom) {
  const std::filesystem::path dir = FreshTempDir("shoal_join_", "lost");
  JobConfig config = QuickJob("async");
  config.checkpoint.dir = (dir / "ckpt").string();
  InProcChief chief(config, 10);
  RecordingPolicy policy;
  policy.lose_first_join = true;
  auto result = DriveSteps(chief.context, policy);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->local_steps, 2);
  EXPECT_EQ(policy.calls, (std::vector<std::string>{"join (variable lost)", "join", "barrier", "pull",
                                                    "push (rewound)", "join", "barrier", "pull", "push", "barrier",
                                                    "pull", "push"}));

  InProcChief no_checkpoints(QuickJob("async"), 10);
  RecordingPolicy unrecoverable;
  unrecoverable.lose_first_join = true;
  auto failed = DriveSteps(no_checkpoints.context, unrecoverable);
  EXPECT_TRUE(absl::IsNotFound(failed.status())) << failed.status();
  EXPECT_EQ(unrecoverable.calls, std::vector<std::string>{"join (variable lost)"});
  std::filesystem::remove_all(dir);
}

TEST(StepDriverTest, AnUpdateAHookStoppedIsNeverSent) {
  InProcChief chief(QuickJob("async"), 10);
  HookList hooks;
  hooks.Add(std::make_shared<StopAtFirstUpdate>());
  chief.context.hooks = &hooks;
  RecordingPolicy policy;
  auto result = DriveSteps(chief.context, policy);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->local_steps, 0);
  EXPECT_EQ(result->stop_reason, "test");
  EXPECT_EQ(policy.calls, (std::vector<std::string>{"join", "barrier", "pull", "held back"}));
  EXPECT_TRUE(JobStopRequested(*chief.client).value()) << "the other workers are told";
}

}  // namespace
}  // namespace shoal
