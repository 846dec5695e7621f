// Model: what every strategy, hook and report trains and evaluates, whatever
// builds it (the built-in MLP or CNN, a TorchScript file). Its trainable
// parameters and its buffers are bound to variable names (a scope, such as a
// population member's "worker_3/", prefixes each), which is how they are
// placed on and pulled from the ps.
//
// Not thread-safe: one model per worker thread.
#ifndef SHOAL_MODEL_MODEL_H_
#define SHOAL_MODEL_MODEL_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/data/dataset.h"
#include "shoal/placement/placement.h"

namespace shoal {

class RowTables;

class Model {
 public:
  virtual ~Model() = default;

  // Names and parameters of the trainable variables, in one fixed order that
  // every other list (values, gradients, specs) follows.
  virtual const std::vector<std::string>& variable_names() const = 0;
  virtual const std::vector<torch::Tensor>& variables() const = 0;
  std::vector<VariableSpec> VariableSpecs() const;
  int64_t NumParameters() const;

  // Buffers: state the forward pass keeps that nobody trains (BatchNorm's
  // running statistics, float32, and its num_batches_tracked, int64), named
  // and scoped like the variables, in one fixed order. None by default.
  virtual const std::vector<std::string>& buffer_names() const;
  virtual const std::vector<torch::Tensor>& buffers() const;
  std::vector<VariableSpec> BufferSpecs() const;
  // Copies of the buffers, and loading values into them (same order, shapes
  // and dtypes as buffers()).
  std::vector<torch::Tensor> BufferValues() const;
  void LoadBuffers(const std::vector<torch::Tensor>& values);

  // Copies `values` (same order and shapes as variables()) into the model.
  void Load(const std::vector<torch::Tensor>& values);

  // Everything the ps keeps of the model: the variables' names, then the
  // buffers'; and loading values in that order (what evaluation reads).
  std::vector<std::string> StateNames() const;
  std::vector<std::vector<int64_t>> StateShapes() const;
  void LoadState(const std::vector<torch::Tensor>& values);
  // Each parameter's gradient after backward(), in variables() order (zeros
  // for a parameter the loss did not reach).
  std::vector<torch::Tensor> Gradients() const;

  // The model's output for a batch: logits for classification, values for
  // regression.
  virtual torch::Tensor Forward(const torch::Tensor& input) = 0;

  // What training minimises: softmax cross-entropy against int64 class
  // labels (the default), mean squared error against float32 targets, or
  // logistic loss (binary cross-entropy of one logit per example) against
  // float32 0/1 labels (clicks).
  enum class LossKind { kCrossEntropy, kMeanSquaredError, kLogistic };
  void set_loss(LossKind loss) { loss_ = loss; }
  LossKind loss() const { return loss_; }
  bool classifies() const { return loss_ == LossKind::kCrossEntropy; }
  bool predicts_clicks() const { return loss_ == LossKind::kLogistic; }
  // The mean loss of `output` (Forward's) against `labels`: for mean
  // squared error the targets [N] or [N, k] are compared with the output
  // reshaped to them.
  torch::Tensor Loss(const torch::Tensor& output, const torch::Tensor& labels) const;
  // Training (dropout on) or evaluating; a model without such layers ignores it.
  virtual void SetTraining(bool /*training*/) {}
  // The embedding tables the model reaches by id on the ps (row_tables.h),
  // whose rows must be pulled before each Forward; none by default.
  virtual RowTables* row_tables() { return nullptr; }

  // The model as a TorchScript module holding copies of its current values
  // (variables as parameters, buffers as buffers), in evaluation mode, whose
  // forward() gives what Forward gives in evaluation: what a job's run
  // folder and `shoal export` save, for torch.jit.load and
  // torch::jit::load without shoal. Unimplemented, saying why, for a model
  // that has no TorchScript form.
  virtual absl::StatusOr<torch::jit::Module> Script() const;

 private:
  LossKind loss_ = LossKind::kCrossEntropy;
};

// A model's figures on a data set, in evaluation mode's forward passes.
struct Evaluation {
  double accuracy = 0;  // classification only; clicks: predicted (logit > 0) right
  double loss = 0;      // the model's own loss, averaged over the examples
  double auc = 0;       // clicks only (model/click_metrics.h; 0 when one class is absent)
};
// One pass over `data` in batches, pulling each batch's rows first for a
// model with row tables (bound to a client); the caller sets the model's
// mode. The error of a pull that failed.
absl::StatusOr<Evaluation> Evaluate(Model& model, const Dataset& data, int64_t batch_size = 1000);

// "[2, 1, 28, 28]": a shape, for errors.
std::string ShapeString(c10::IntArrayRef sizes);

// model.Forward(input), with a forward pass that throws (a c10::Error, or
// the TorchScript interpreter's runtime_error) turned into InvalidArgument
// naming `what`, the input's shape and the error's first line.
absl::StatusOr<torch::Tensor> ForwardOrError(Model& model, const torch::Tensor& input, const std::string& what);

// Mean softmax cross-entropy of `logits` against int64 `labels`.
torch::Tensor CrossEntropyLoss(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace shoal

#endif  // SHOAL_MODEL_MODEL_H_
