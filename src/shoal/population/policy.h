// Population-based training's decisions, apart from any I/O: which member
// to copy (exploit) and how to perturb the hyper-parameters (explore).
// Deterministic given the random generator, so tests drive them directly.
#ifndef SHOAL_POPULATION_POLICY_H_
#define SHOAL_POPULATION_POLICY_H_

#include <random>
#include <string>
#include <vector>

#include "shoal/wire.pb.h"

namespace shoal {

// Populations (mode population): every member trains its own model under its
// own scope (worker_<m>/...), readable by every task; a policy decides when a
// member copies another's weights (exploit) and perturbs its hyper-parameters
// (explore), as population-based training does.
struct PopulationConfig {
  int workers_per_member = 1;          // > 1: data-parallel members (asynchronous within a member)
  std::string variables_on = "member";  // member: on the member's first worker task; ps: on the ps tasks
  // none | random | loss_threshold | truncation | tournament
  std::string policy = "truncation";
  int64_t ready_steps = 0;       // consult the policy every N member steps; 0: 1 for random, else eval_steps
  int64_t eval_steps = 100;      // measure fitness on the validation split every N member steps
  double probability = 0.15;     // random: chance per step of copying a uniformly chosen other member
  double loss_threshold = 0;     // loss_threshold: copy the best when own validation loss exceeds this (0: off)
  double loss_margin = 0.1;      // ... or exceeds the best member's by this margin
  double fraction = 0.25;        // truncation: the bottom fraction copies from the top fraction
  std::vector<std::string> explore = {"learning_rate"};  // also momentum, weight_decay, batch_size
  double resample_probability = 0.25;
  // Whether a perturbed value (x0.8 or x1.2) is clamped to its prior's range.
  // false, the PBT paper's: perturbations go past the prior; momentum stays
  // below 1 either way.
  bool explore_clamp = false;
  bool draw_initial = true;      // each member draws its explored hyper-parameters from the priors
  // Priors: log-uniform for learning_rate, weight_decay, batch_size; uniform for momentum.
  std::vector<double> learning_rate_range = {1e-4, 1e-1};
  std::vector<double> momentum_range = {0.5, 0.99};
  std::vector<double> weight_decay_range = {1e-6, 1e-2};
  std::vector<double> batch_size_range = {16, 256};
  bool inherit_slots = false;    // exploit also copies the optimizer slots, bit for bit
  int64_t validation_examples = 5000;  // carved from the end of the training set, never trained on
  int64_t peer_cache_steps = 0;  // reuse a peer's values read within this many member steps (0: always read)
  double peer_timeout_s = 5;     // a peer that does not answer in this time is skipped, with a warning
  std::string lineage_dir = "population";  // member_<m>.jsonl lineage logs and lineage.svg
};

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

// Why a copy that DecideExploit chose should not go ahead, or "" if it
// should. The copier measures the donor's weights as they are now on its
// own validation split (`donor_now`) just before copying: a published
// fitness can predate a divergence (a member restored from a checkpoint,
// or one whose steps blew up since it was measured), and copying on it
// spreads the divergence (PBT's stale-fitness hazard). A policy that ranks
// copies only a donor that still beats the copier's own fitness; random,
// which ranks nobody, only a donor whose loss is finite.
std::string RefuseStaleDonor(const PopulationConfig& config, const MemberStatus& mine, const MemberStatus& donor,
                             const MemberStatus& donor_now);

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
