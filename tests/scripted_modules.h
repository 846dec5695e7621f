// Modules scripted with libtorch's own TorchScript compiler, as a Python
// user's torch.jit.script would build them, for the tests that load
// TorchScript files.
#ifndef SHOAL_TESTS_SCRIPTED_MODULES_H_
#define SHOAL_TESTS_SCRIPTED_MODULES_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

namespace shoal {

namespace fs = std::filesystem;

// A linear layer as a scripted submodule: parameters `weight` [in, out] and `bias`.
inline torch::jit::Module ScriptedLinear(int64_t in, int64_t out) {
  torch::jit::Module linear("Linear");
  linear.register_parameter("weight", torch::randn({in, out}) * (1.0 / std::sqrt(static_cast<double>(in))), false);
  linear.register_parameter("bias", torch::zeros({out}), false);
  linear.define(R"(
def forward(self, x):
    return torch.addmm(self.bias, x, self.weight)
)");
  return linear;
}

// 784 -> 32 -> 10 with ReLU, saved to `path`: names fc1.weight ... fc2.bias.
inline void SaveScriptedMlp(const fs::path& path, uint64_t seed = 7) {
  torch::manual_seed(seed);
  torch::jit::Module net("Net");
  net.register_module("fc1", ScriptedLinear(784, 32));
  net.register_module("fc2", ScriptedLinear(32, 10));
  net.define(R"(
def forward(self, x):
    return self.fc2.forward(torch.relu(self.fc1.forward(x.flatten(1))))
)");
  net.save(path.string());
}

// BatchNorm over `features` as torch.nn.BatchNorm1d keeps it: weight and
// bias trained, running_mean, running_var and num_batches_tracked (int64)
// updated by every training forward pass.
inline torch::jit::Module ScriptedBatchNorm(int64_t features) {
  torch::jit::Module bn("BatchNorm");
  bn.register_parameter("weight", torch::ones({features}), false);
  bn.register_parameter("bias", torch::zeros({features}), false);
  bn.register_buffer("running_mean", torch::zeros({features}));
  bn.register_buffer("running_var", torch::ones({features}));
  bn.register_buffer("num_batches_tracked", torch::zeros({}, torch::kInt64));
  bn.register_attribute("training", c10::BoolType::get(), true);  // as every Python module has
  bn.define(R"(
def forward(self, x):
    if self.training:
        self.num_batches_tracked.add_(1)
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, self.training,
                            0.1, 1e-5, False)
)");
  return bn;
}

// 784 -> 32 -> BatchNorm -> ReLU -> 10, saved to `path`.
inline void SaveScriptedBatchNormMlp(const fs::path& path, uint64_t seed = 7) {
  torch::manual_seed(seed);
  torch::jit::Module net("Net");
  net.register_module("fc1", ScriptedLinear(784, 32));
  net.register_module("bn1", ScriptedBatchNorm(32));
  net.register_module("fc2", ScriptedLinear(32, 10));
  net.define(R"(
def forward(self, x):
    return self.fc2.forward(torch.relu(self.bn1.forward(self.fc1.forward(x.flatten(1)))))
)");
  net.save(path.string());
}

// in -> out, one linear layer (a gated ensemble's master: the networks'
// logits to one weight per network), saved to `path`.
inline void SaveScriptedLinear(const fs::path& path, int64_t in, int64_t out, uint64_t seed = 7) {
  torch::manual_seed(seed);
  torch::jit::Module net("Net");
  net.register_module("fc", ScriptedLinear(in, out));
  net.define(R"(
def forward(self, x):
    return self.fc.forward(x.flatten(1))
)");
  net.save(path.string());
}

}  // namespace shoal

#endif  // SHOAL_TESTS_SCRIPTED_MODULES_H_
