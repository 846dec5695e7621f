// GatedEnsemble: K worker networks and a master network that weighs them.
//
// Worker network k is an Mlp under the scope "net_<k>/"; with a shared trunk
// ("trunk/", an Mlp whose last layer is activated too) every network reads
// the trunk's features instead of the input. The master ("master/") reads the
// worker networks' logits, concatenated (and optionally the input), and gives
// one weight per network and example: softmax (they sum to 1) or sigmoid
// (each in [0, 1]).
//
// One training step, as the formulas below define it:
//   loss_k = mean_b(s_bk * CE_b(logits_k)), where s_bk = w_bk (per_sample) or
//            mean_b(w_bk) (batch_mean); w is a constant here, so no gradient
//            flows from a worker's loss into the master;
//   master loss = mean_bk((w_bk - c_bk)^2), c_bk = 1 if network k classifies
//            example b correctly (mse), or the softmax cross-entropy against
//            c normalised per example, uniform when no network is right
//            (cross_entropy);
//   by default the master's input logits are constants too; with
//   master_loss_to_workers the master loss also flows back into the networks
//   through their logits, as one TensorFlow graph computing every gradient
//   at once would. Gradients of shared (trunk) parameters add up.
//
// OneGraphStep computes all of this in one autograd graph: the reference the
// distributed strategy (strategy/gated_strategy.h), which splits the same
// formulas between tasks, is tested against.
//
// Not thread-safe: one ensemble per thread.
#ifndef SHOAL_MODEL_GATED_ENSEMBLE_H_
#define SHOAL_MODEL_GATED_ENSEMBLE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shoal/data/dataset.h"
#include "shoal/model/mlp.h"

namespace shoal {

struct GatedModelConfig {
  // Hidden layer sizes of each worker network; the input and output sizes
  // come from model.layers. Empty: one network per worker task, each with
  // model.layers' hidden sizes.
  std::vector<std::vector<int64_t>> networks;
  std::vector<int64_t> trunk;                // hidden sizes of a shared trunk; empty: none
  std::vector<int64_t> master_hidden = {64};
  std::string output = "softmax";            // softmax | sigmoid
  std::string scale = "batch_mean";          // batch_mean | per_sample
  std::string master_loss = "mse";           // mse | cross_entropy (needs softmax)
  bool master_sees_input = false;            // the master reads the input features besides the logits
  bool master_loss_to_workers = false;       // the master's loss also trains the networks, through their logits
};

// `config` with its networks spelled out (one per worker task when empty),
// checked: an error names the key.
absl::StatusOr<GatedModelConfig> ResolveGatedConfig(const GatedModelConfig& config, const MlpConfig& base,
                                                    int num_workers);

// What one step of the whole ensemble gave.
struct GatedStepResult {
  std::vector<torch::Tensor> gradients;  // in GatedEnsemble::variables() order
  torch::Tensor weights;                 // the master's [B, K]
  double master_loss = 0;
  std::vector<double> network_losses;     // unscaled mean cross-entropy of each network
  std::vector<double> network_accuracies; // on the batch
};

// What the ensemble and its parts get right on a dataset.
struct GatedAccuracy {
  double gated_vote = 0;        // the vote weighted by the master
  double uniform_average = 0;   // argmax of the networks' mean softmax
  std::vector<double> networks; // each network alone
  double any_right = 0;         // examples some network gets right: what a perfect gate could reach
  std::vector<double> mean_weights;  // the master's mean weight for each network
};

class GatedEnsemble {
 public:
  // `config` must come from ResolveGatedConfig; `base` gives the input and
  // output sizes, activation and seed (each part is seeded apart).
  GatedEnsemble(const MlpConfig& base, const GatedModelConfig& config);

  int num_networks() const { return static_cast<int>(networks_.size()); }
  const GatedModelConfig& config() const { return config_; }

  // Every variable (trunk, networks, master), and the groups a task owns.
  const std::vector<std::string>& variable_names() const { return names_; }
  const std::vector<torch::Tensor>& variables() const { return variables_; }
  std::vector<VariableSpec> VariableSpecs() const;
  void Load(const std::vector<torch::Tensor>& values);
  Mlp* trunk() { return trunk_.get(); }  // null without a shared trunk
  Mlp& network(int k) { return *networks_[k]; }
  Mlp& master() { return *master_; }

  // Network k's logits [B, C] (through the trunk if there is one).
  torch::Tensor NetworkLogits(int k, const torch::Tensor& images);
  // The master's weights [B, K] for the networks' logits on `images`.
  torch::Tensor MasterWeights(const std::vector<torch::Tensor>& logits, const torch::Tensor& images);

  // Forward and backward of the whole ensemble on one batch, in one graph.
  GatedStepResult OneGraphStep(const torch::Tensor& images, const torch::Tensor& labels);

  // Class predictions by the master-weighted vote.
  torch::Tensor Predict(const torch::Tensor& images);
  GatedAccuracy Evaluate(const Dataset& data, int64_t batch_size = 1000);

 private:
  GatedModelConfig config_;
  std::unique_ptr<Mlp> trunk_;
  std::vector<std::unique_ptr<Mlp>> networks_;
  std::unique_ptr<Mlp> master_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> variables_;
};

// The formulas, shared by OneGraphStep and the distributed strategy.

// [B, K] float: 1 where network k's argmax is the label.
torch::Tensor Correctness(const std::vector<torch::Tensor>& logits, const torch::Tensor& labels);
// The master's loss for `weights` [B, K] against `correctness` [B, K].
torch::Tensor MasterLoss(const torch::Tensor& weights, const torch::Tensor& correctness, const std::string& kind);
// s [B, K]: what scales each network's per-example loss (weights detached).
torch::Tensor NetworkScales(const torch::Tensor& weights, const std::string& scale);
// mean_b(scale_b * CE_b(logits)).
torch::Tensor ScaledNetworkLoss(const torch::Tensor& logits, const torch::Tensor& labels, const torch::Tensor& scale);
// Per example, the class with the largest summed weight of the networks
// voting for it.
torch::Tensor WeightedVote(const std::vector<torch::Tensor>& logits, const torch::Tensor& weights);

}  // namespace shoal

#endif  // SHOAL_MODEL_GATED_ENSEMBLE_H_
