// GatedEnsemble: K worker networks and a master network that weighs them.
//
// Worker network k lives under the scope "net_<k>/": a built-in MLP (its
// hidden sizes), a built-in CNN or a TorchScript file. With a shared trunk
// ("trunk/", an MLP whose last layer is activated too) every MLP network
// reads the trunk's features instead of the input. The master ("master/", by
// default an MLP, or any model) reads the worker networks' logits,
// concatenated (and optionally the input, flattened), and gives one weight
// per network and example: softmax (they sum to 1) or sigmoid (each in
// [0, 1]). The input and class widths of the built-in MLP parts come from
// `model:` (an MLP's layers or a CNN's input_shape and classes).
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

#include <optional>

#include "absl/status/status.h"
#include "shoal/data/dataset.h"
#include "shoal/model/mlp.h"
#include "shoal/model/model_factory.h"

namespace shoal {

// One network of a gated ensemble: an MLP with these hidden sizes (in YAML a
// list, `[256, 128]`), or a model of its own (a mapping with the keys of
// `model:`, such as `{kind: torchscript, path: net_1.pt}`).
struct GatedNetworkConfig {
  std::vector<int64_t> hidden;
  std::optional<ModelConfig> model;
};

struct GatedModelConfig {
  // The worker networks. Empty: one per worker task, each the `model:`
  // (an MLP or a CNN, seeded apart; TorchScript networks are listed here,
  // one file each, since copies of one file would start alike).
  std::vector<GatedNetworkConfig> networks;
  std::vector<int64_t> trunk;                // hidden sizes of a shared trunk (MLP networks only); empty: none
  std::vector<int64_t> master_hidden = {64};
  // The master as a model of its own (a TorchScript module mapping
  // [B, K * classes (+ input features)] to [B, K]); unset: an MLP with
  // master_hidden.
  std::optional<ModelConfig> master;
  std::string output = "softmax";            // softmax | sigmoid
  std::string scale = "batch_mean";          // batch_mean | per_sample
  std::string master_loss = "mse";           // mse | cross_entropy (needs softmax)
  bool master_sees_input = false;            // the master reads the input features besides the logits
  bool master_loss_to_workers = false;       // the master's loss also trains the networks, through their logits
};

// One line for logs: "3 networks (torchscript a.pt; cnn conv 16-32 dense 64
// (BatchNorm); mlp 784-256-10), master mlp 30-64-3". `config` resolved.
std::string GatedSummary(const ModelConfig& base, const GatedModelConfig& config);

// `config` with its networks spelled out (one per worker task when empty),
// checked: an error names the key.
absl::StatusOr<GatedModelConfig> ResolveGatedConfig(const GatedModelConfig& config, const ModelConfig& base,
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
  // The cross-entropy of the master-weighted mixture of the networks'
  // softmax outputs (weights normalised per example): the ensemble's loss.
  double mixture_loss = 0;
  std::vector<double> mean_weights;  // the master's mean weight for each network
};

class GatedEnsemble {
 public:
  // `config` must come from ResolveGatedConfig; `base` gives the built-in
  // parts' input and output widths, activation and seed (each part is seeded
  // apart). Fails when a TorchScript part cannot be loaded.
  static absl::StatusOr<std::unique_ptr<GatedEnsemble>> Create(const ModelConfig& base,
                                                               const GatedModelConfig& config);

  int num_networks() const { return static_cast<int>(networks_.size()); }
  int64_t classes() const { return classes_; }
  const GatedModelConfig& config() const { return config_; }

  // Every variable (trunk, networks, master) and every buffer, in that order.
  const std::vector<std::string>& variable_names() const { return names_; }
  const std::vector<torch::Tensor>& variables() const { return variables_; }
  const std::vector<std::string>& buffer_names() const { return buffer_names_; }
  std::vector<torch::Tensor> BufferValues() const;
  std::vector<VariableSpec> VariableSpecs() const;  // the buffers' too, after the variables
  void Load(const std::vector<torch::Tensor>& values);
  void LoadBuffers(const std::vector<torch::Tensor>& values);
  Mlp* trunk() { return trunk_.get(); }  // null without a shared trunk
  Model& network(int k) { return *networks_[k]; }
  Model& master() { return *master_; }
  // Dropout and BatchNorm in training or evaluation mode, for every part.
  void SetTraining(bool training);

  // One forward pass of every part on two examples of `data`, in evaluation
  // mode, before any training: an error names the part whose output does
  // not fit ([B, classes] logits for a network, [B, K] for the master), or
  // labels beyond the classes.
  absl::Status CheckShapes(const Dataset& data);

  // Network k's logits [B, C] (through the trunk if there is one).
  torch::Tensor NetworkLogits(int k, const torch::Tensor& images);
  // The master's weights [B, K] for the networks' logits on `images`.
  torch::Tensor MasterWeights(const std::vector<torch::Tensor>& logits, const torch::Tensor& images);

  // Forward and backward of the whole ensemble on one batch, in one graph.
  GatedStepResult OneGraphStep(const torch::Tensor& images, const torch::Tensor& labels);

  // The whole ensemble as one TorchScript module: submodules trunk (if
  // any), net_0 ... net_<K-1> and master, and forward(x) giving the master
  // -weighted votes [B, classes] (each class's summed weight of the networks
  // whose argmax it is), whose argmax is Predict's class.
  absl::StatusOr<torch::jit::Module> Script() const;
  // Class predictions by the master-weighted vote (in the parts' current mode).
  torch::Tensor Predict(const torch::Tensor& images);
  // In evaluation mode; leaves the parts in training mode.
  GatedAccuracy Evaluate(const Dataset& data, int64_t batch_size = 1000);

 private:
  GatedEnsemble(const GatedModelConfig& config, int64_t classes) : config_(config), classes_(classes) {}

  GatedModelConfig config_;
  int64_t classes_;
  std::unique_ptr<Mlp> trunk_;
  std::vector<std::unique_ptr<Model>> networks_;
  std::unique_ptr<Model> master_;
  std::vector<std::string> names_, buffer_names_;
  std::vector<torch::Tensor> variables_, buffers_;
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
