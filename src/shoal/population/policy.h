// Population-based training's decisions, apart from any I/O: which member
// to copy (exploit) and how to perturb the hyper-parameters (explore).
// Deterministic given the random generator, so tests drive them directly.
#ifndef SHOAL_POPULATION_POLICY_H_
#define SHOAL_POPULATION_POLICY_H_

#include <random>
#include <string>
#include <vector>

#include "shoal/config/config.h"

namespace shoal {

struct Hyperparameters {
  double learning_rate = 0;
  double momentum = 0;
  double weight_decay = 0;
  int64_t batch_size = 0;

  std::string ToString() const;
  bool operator==(const Hyperparameters& o) const {
    return learning_rate == o.learning_rate && momentum == o.momentum && weight_decay == o.weight_decay &&
           batch_size == o.batch_size;
  }
};

// What a member knows of another (or of itself) when it decides.
struct MemberStatus {
  int member = 0;
  bool reachable = true;   // its variables answered
  bool evaluated = false;  // it has published a fitness
  double fitness = 0;      // validation accuracy: higher is better
  double loss = 0;         // validation loss
};

struct ExploitDecision {
  bool exploit = false;
  int source = -1;
  bool copy_hyperparameters = false;  // truncation copies them; the others keep their own
  std::string reason;                 // for the lineage log
};

// `members` holds every member, `me` among them. Unreachable members are
// never chosen; members without a fitness are left out of the comparisons.
ExploitDecision DecideExploit(const PopulationConfig& config, int me, const std::vector<MemberStatus>& members,
                              std::mt19937_64& rng);

// Perturbed momentum never reaches 1 (a momentum of 1 never forgets).
inline constexpr double kMaxMomentum = 0.999;

// Each hyper-parameter named in config.explore: with probability
// resample_probability drawn afresh from its prior, else multiplied by 0.8
// or 1.2, past the prior's range unless config.explore_clamp (momentum at
// most kMaxMomentum either way).
Hyperparameters Explore(const PopulationConfig& config, const Hyperparameters& current, std::mt19937_64& rng);

// A member's starting point: `base`, with each explored hyper-parameter drawn
// from its prior when config.draw_initial.
Hyperparameters DrawInitial(const PopulationConfig& config, const Hyperparameters& base, std::mt19937_64& rng);

// The hyper-parameters of an optimizer config and batch size, and back.
Hyperparameters HyperparametersOf(const wire::OptimizerConfig& optimizer, int64_t batch_size);
wire::OptimizerConfig WithHyperparameters(wire::OptimizerConfig optimizer, const Hyperparameters& h);

}  // namespace shoal

#endif  // SHOAL_POPULATION_POLICY_H_
