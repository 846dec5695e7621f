#include "shoal/population/policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal {
namespace {

bool Listed(const PopulationConfig& config, const std::string& name) {
  return std::find(config.explore.begin(), config.explore.end(), name) != config.explore.end();
}

double Uniform(std::mt19937_64& rng, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
double LogUniform(std::mt19937_64& rng, double lo, double hi) { return std::exp(Uniform(rng, std::log(lo), std::log(hi))); }

int PickUniform(std::mt19937_64& rng, const std::vector<int>& from) {
  return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
}

// A prior: [lo, hi], log-uniform for scales, uniform otherwise.
struct Prior {
  double lo, hi;
  bool log_uniform;
};

// Draws one value from its prior, or perturbs it by x0.8 or x1.2: past the
// prior (the PBT paper's explore) unless `clamp`.
double Move(std::mt19937_64& rng, double value, const Prior& prior, double resample_probability, bool resample_only,
            bool clamp) {
  if (resample_only || Uniform(rng, 0, 1) < resample_probability) {
    return prior.log_uniform ? LogUniform(rng, prior.lo, prior.hi) : Uniform(rng, prior.lo, prior.hi);
  }
  const double factor = Uniform(rng, 0, 1) < 0.5 ? 0.8 : 1.2;
  return clamp ? std::clamp(value * factor, prior.lo, prior.hi) : value * factor;
}

Hyperparameters Perturb(const PopulationConfig& c, const Hyperparameters& h, std::mt19937_64& rng,
                        bool resample_only) {
  Hyperparameters out = h;
  auto move = [&](double value, const std::vector<double>& range, bool log_uniform) {
    return Move(rng, value, Prior{range[0], range[1], log_uniform}, c.resample_probability, resample_only,
                c.explore_clamp);
  };
  if (Listed(c, "learning_rate")) out.learning_rate = move(h.learning_rate, c.learning_rate_range, true);
  if (Listed(c, "momentum")) out.momentum = std::min(move(h.momentum, c.momentum_range, false), kMaxMomentum);
  if (Listed(c, "weight_decay")) out.weight_decay = move(h.weight_decay, c.weight_decay_range, true);
  if (Listed(c, "batch_size")) {
    out.batch_size = std::max<int64_t>(1, std::llround(move(static_cast<double>(h.batch_size), c.batch_size_range, true)));
  }
  return out;
}

}  // namespace

std::string Hyperparameters::ToString() const {
  return absl::StrFormat("lr %.3g, momentum %.3g, weight decay %.3g, batch %d", learning_rate, momentum,
                         weight_decay, batch_size);
}

ExploitDecision DecideExploit(const PopulationConfig& config, int me, const std::vector<MemberStatus>& members,
                              std::mt19937_64& rng) {
  ExploitDecision decision;
  std::vector<int> others, rated;  // reachable others; reachable and evaluated (me included)
  const MemberStatus* mine = nullptr;
  for (const MemberStatus& m : members) {
    if (m.member == me) mine = &m;
    if (!m.reachable) continue;
    if (m.member != me) others.push_back(m.member);
    if (m.evaluated) rated.push_back(m.member);
  }
  auto status = [&](int member) -> const MemberStatus& {
    return *std::find_if(members.begin(), members.end(), [&](const MemberStatus& m) { return m.member == member; });
  };
  auto copy = [&](int source, std::string reason) {
    decision.exploit = true;
    decision.source = source;
    decision.reason = std::move(reason);
  };
  if (config.policy == "random") {
    if (!others.empty() && Uniform(rng, 0, 1) < config.probability) {
      copy(PickUniform(rng, others), absl::StrCat("random (p = ", config.probability, ")"));
    }
    return decision;
  }
  if (mine == nullptr || !mine->evaluated) {  // the rest compare fitness
    decision.reason = "no fitness of its own yet";
    return decision;
  }
  std::vector<int> rated_others;
  for (int m : rated) {
    if (m != me) rated_others.push_back(m);
  }
  if (rated_others.empty()) return decision;
  if (config.policy == "loss_threshold") {
    int best = me;
    for (int m : rated) {
      if (status(m).fitness > status(best).fitness) best = m;
    }
    if (best == me) return decision;
    if (config.loss_threshold > 0 && mine->loss > config.loss_threshold) {
      copy(best, absl::StrFormat("own loss %.4f above the threshold %.4f", mine->loss, config.loss_threshold));
    } else if (mine->loss > status(best).loss + config.loss_margin) {
      copy(best, absl::StrFormat("own loss %.4f above the best's %.4f by more than %.4f", mine->loss,
                                 status(best).loss, config.loss_margin));
    }
  } else if (config.policy == "truncation") {
    // The quantile is taken over the whole (reachable) population, so every
    // member must be ranked: until each has a fitness, nobody decides.
    for (int m : others) {
      if (!status(m).evaluated) {
        decision.reason = absl::StrCat("member ", m, " has no fitness yet");
        return decision;
      }
    }
    std::vector<int> ranked = rated;  // best first
    std::stable_sort(ranked.begin(), ranked.end(),
                     [&](int a, int b) { return status(a).fitness > status(b).fitness; });
    const size_t cut = std::max<size_t>(1, static_cast<size_t>(std::floor(config.fraction * ranked.size())));
    const auto position = std::find(ranked.begin(), ranked.end(), me) - ranked.begin();
    if (ranked.size() >= 2 && static_cast<size_t>(position) >= ranked.size() - cut) {
      // Only from a fitter member: one tied with it (often a member that
      // copied it and carries its fitness) would give it back values no
      // better than its own, and its hyper-parameters for nothing.
      std::vector<int> top;
      for (auto it = ranked.begin(); it != ranked.begin() + std::min(cut, ranked.size() - cut); ++it) {
        if (status(*it).fitness > mine->fitness) top.push_back(*it);
      }
      if (top.empty()) {
        decision.reason = absl::StrFormat("in the bottom %.0f%% but tied with the top (fitness %.4f)",
                                          100 * config.fraction, mine->fitness);
        return decision;
      }
      copy(PickUniform(rng, top), absl::StrFormat("in the bottom %.0f%% (fitness %.4f)", 100 * config.fraction,
                                                  mine->fitness));
      decision.copy_hyperparameters = true;
    }
  } else if (config.policy == "tournament") {
    const int rival = PickUniform(rng, rated_others);
    if (status(rival).fitness > mine->fitness) {
      copy(rival, absl::StrFormat("lost a tournament (%.4f against %.4f)", mine->fitness, status(rival).fitness));
    }
  }
  return decision;
}

std::string RefuseStaleDonor(const PopulationConfig& config, const MemberStatus& mine, const MemberStatus& donor,
                             const MemberStatus& donor_now) {
  const std::string measured =
      absl::StrFormat("member %d measured %.4f (loss %.4g) now", donor.member, donor_now.fitness, donor_now.loss);
  if (!std::isfinite(donor_now.loss) || !std::isfinite(donor_now.fitness)) return measured + ": it has diverged";
  if (config.policy == "random") return "";
  if (donor_now.fitness <= mine.fitness) {
    return absl::StrFormat("%s, where it had published %.4f: no better than this member's %.4f", measured,
                           donor.fitness, mine.fitness);
  }
  return "";
}

Hyperparameters Explore(const PopulationConfig& config, const Hyperparameters& current, std::mt19937_64& rng) {
  return Perturb(config, current, rng, /*resample_only=*/false);
}

Hyperparameters DrawInitial(const PopulationConfig& config, const Hyperparameters& base, std::mt19937_64& rng) {
  if (!config.draw_initial) return base;
  return Perturb(config, base, rng, /*resample_only=*/true);
}

Hyperparameters HyperparametersOf(const wire::OptimizerConfig& optimizer, int64_t batch_size) {
  Hyperparameters h;
  h.learning_rate = optimizer.learning_rate();
  h.momentum = optimizer.momentum();
  h.weight_decay = optimizer.weight_decay();
  h.batch_size = batch_size;
  return h;
}

wire::OptimizerConfig WithHyperparameters(wire::OptimizerConfig optimizer, const Hyperparameters& h) {
  optimizer.set_learning_rate(h.learning_rate);
  optimizer.set_momentum(h.momentum);
  optimizer.set_weight_decay(h.weight_decay);
  return optimizer;
}

}  // namespace shoal
