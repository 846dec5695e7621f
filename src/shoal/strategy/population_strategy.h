// Populations (population-based training): every member trains its own
// model under its own scope, `worker_<m>/dense_1/kernel`, with its own
// hyper-parameters, on the whole training set. Any task reads any member's
// variables by name through the ordinary client. Every `ready_steps` a
// member's lead worker measures... and asks the policy whether to copy
// another member (exploit), then perturbs its hyper-parameters (explore).
//
// Besides its model, member m keeps two small variables that anyone can read:
// worker_<m>/hparams [learning rate, momentum, weight decay, batch size] and
// worker_<m>/fitness [validation accuracy, validation loss, member step]
// (accuracy -1 until measured). With workers_per_member > 1 the member's
// workers train its variables asynchronously through the ps; the first of
// them (the lead) evaluates and decides.
#ifndef SHOAL_STRATEGY_POPULATION_STRATEGY_H_
#define SHOAL_STRATEGY_POPULATION_STRATEGY_H_

#include <string>
#include <vector>

#include "shoal/population/policy.h"
#include "shoal/strategy/train_report.h"
#include "shoal/strategy/strategy.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

int NumMembers(const StrategyConfig& config, int num_workers);

// Member m's scope, "worker_<m>/", and its model's config (seeded per member).
std::string MemberScope(int member);
ModelConfig MemberModel(const StrategyConfig& config, int member);
// The counters a checkpoint of a population keeps besides the job's: each
// member's step.
std::vector<std::string> PopulationCounters(const StrategyConfig& config, int num_workers);
std::string HyperparametersVariable(int member);
std::string FitnessVariable(int member);

// Every member's variables, for the placement; with variables_on: member,
// scope rules that put member m's on its first worker task.
absl::StatusOr<std::vector<VariableSpec>> PopulationVariableSpecs(const StrategyConfig& config, int num_workers);
std::vector<ScopeRule> PopulationScopeRules(const StrategyConfig& config, const std::vector<TaskId>& workers);

// One member's weights, buffers (BatchNorm statistics) and, when asked for,
// optimizer slots, read once: what a copier measures is what it copies.
struct MemberState {
  std::vector<torch::Tensor> values;
  std::vector<torch::Tensor> buffers;
  std::vector<OptimizerSlots> slots;  // empty unless read with slots
};
// Reads `names` and `buffers` (and with `with_slots` the slots of `names`)
// into tensors of their own, unaliased by an in-process ps.
absl::StatusOr<MemberState> ReadMemberState(Client& reader, const std::vector<std::string>& names, bool with_slots,
                                            const std::vector<std::string>& buffers = {});
// Writes `state` onto `names` and `buffers`, bit for bit; its slots too, if
// it holds any.
absl::Status WriteMemberState(Client& writer, const MemberState& state, const std::vector<std::string>& names,
                              const std::vector<std::string>& buffers = {});
// Copies member `from`'s weights onto `to`'s, and with `with_slots` its
// optimizer slots, bit for bit; and its buffers `buffers_from` onto
// `buffers_to`.
absl::Status InheritMember(Client& reader, Client& writer, const std::vector<std::string>& from,
                           const std::vector<std::string>& to, bool with_slots,
                           const std::vector<std::string>& buffers_from = {},
                           const std::vector<std::string>& buffers_to = {});

class PopulationStrategy : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

// The chief's report for a population: every member's test accuracy, the
// best member's (by validation fitness) as the job's, the lineage picture
// and summary.
absl::Status ReportPopulation(WorkerContext& context, const Dataset& test_set, TrainReport* report);

// The mode "population" (training_mode.h).
const TrainingMode& PopulationMode();

}  // namespace shoal

#endif  // SHOAL_STRATEGY_POPULATION_STRATEGY_H_
