// shoal::Module: a program's own torch::nn::Module, handed to shoal to train
// (Job::SetModule in shoal/shoal.h). Part of shoal's public C++ API.
//
// torch::nn::Module has no virtual forward(), so a Module carries the
// function that runs it beside the function that builds it:
//
//   struct Net : torch::nn::Module {
//     Net() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
//     torch::Tensor forward(torch::Tensor x) { return fc(x.flatten(1)); }
//     torch::nn::Linear fc{nullptr};
//   };
//   job.SetModule(shoal::Module::Of<Net>("net"));
#ifndef SHOAL_MODULE_H_
#define SHOAL_MODULE_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace shoal {

struct Module {
  std::string name;  // for logs and errors
  // Builds a fresh module. shoal calls it once per copy it needs (each
  // worker, the chief's evaluation, each population member) under
  // torch::manual_seed(model.seed), from any thread, one call at a time.
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  // Runs the module built by `make` on a batch: logits (classification) or
  // values (model.loss mse).
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)> forward;
  // Where Job::Train (and the chief's Job::RunTask) writes the trained
  // values at the end, by parameter and buffer name; may be null.
  std::shared_ptr<torch::nn::Module> trained;

  // The Module of type M, built by `make` (default: M's default constructor)
  // and run by M::forward.
  template <typename M>
  static Module Of(std::string name, std::function<std::shared_ptr<M>()> make = [] { return std::make_shared<M>(); }) {
    Module module;
    module.name = std::move(name);
    module.make = [make] { return std::static_pointer_cast<torch::nn::Module>(make()); };
    module.forward = [](torch::nn::Module& m, const torch::Tensor& x) { return static_cast<M&>(m).forward(x); };
    return module;
  }

  // `net` itself, as Keras' fit and PyTorch's own loop train a model: every
  // copy shoal trains starts from net's values (M(), then net's parameters
  // and buffers copied in), and Job::Train writes the trained values back
  // into net.
  //   auto net = std::make_shared<Net>();
  //   job.SetModule(shoal::Module::Of("net", net)).Train();   // net is trained
  template <typename M>
  static Module Of(std::string name, std::shared_ptr<M> net) {
    Module module = Of<M>(std::move(name), [net] {
      auto copy = std::make_shared<M>();
      CopyValues(*net, *copy);
      return copy;
    });
    module.trained = net;
    return module;
  }

  // Copies `from`'s parameters and buffers into `to`'s of the same names.
  static void CopyValues(const torch::nn::Module& from, torch::nn::Module& to) {
    torch::NoGradGuard no_grad;
    const auto parameters = from.named_parameters(), buffers = from.named_buffers();
    for (auto& p : to.named_parameters()) p.value().copy_(parameters[p.key()]);
    for (auto& b : to.named_buffers()) b.value().copy_(buffers[b.key()]);
  }
};

}  // namespace shoal

#endif  // SHOAL_MODULE_H_
