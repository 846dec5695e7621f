#include "shoal/server/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

namespace shoal {
namespace {

// Trains one parameter with torch::optim and the same parameter with a shoal
// optimizer on identical gradients for 100 steps; they must agree.
void ExpectAgreesWithTorch(const wire::OptimizerConfig& config,
                           const std::function<std::unique_ptr<torch::optim::Optimizer>(torch::Tensor)>& make_torch) {
  torch::manual_seed(7);
  torch::Tensor initial = torch::randn({17, 5});
  torch::Tensor torch_param = initial.clone().requires_grad_(true);
  auto torch_optimizer = make_torch(torch_param);

  auto optimizer = Optimizer::Create(config);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  torch::Tensor value = initial.clone();
  OptimizerSlots slots = (*optimizer)->MakeSlots(value);

  torch::Tensor target = torch::randn({17, 5});
  for (int step = 0; step < 100; ++step) {
    // A gradient that depends on the parameter, like a real loss's: 2 (p - target) + noise.
    torch::Tensor grad = (2 * (torch_param.detach() - target) + 0.1 * torch::randn({17, 5})).contiguous();
    torch_param.mutable_grad() = grad.clone();
    torch_optimizer->step();
    torch::NoGradGuard no_grad;
    (*optimizer)->Apply(value, grad, slots);
  }
  torch::Tensor expected = torch_param.detach();
  double relative = ((value - expected).abs().max() / expected.abs().max()).item<double>();
  EXPECT_LT(relative, 1e-6) << config.DebugString();
  EXPECT_FALSE(value.equal(initial));  // it trained
}

wire::OptimizerConfig Config(const std::string& kind, double lr) {
  wire::OptimizerConfig c;
  c.set_kind(kind);
  c.set_learning_rate(lr);
  return c;
}

TEST(OptimizerTest, SgdMatchesTorch) {
  ExpectAgreesWithTorch(Config("sgd", 0.05), [](torch::Tensor p) {
    return std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.05));
  });
}

TEST(OptimizerTest, MomentumMatchesTorch) {
  wire::OptimizerConfig c = Config("momentum", 0.02);
  c.set_momentum(0.9);
  ExpectAgreesWithTorch(c, [](torch::Tensor p) {
    return std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{p},
                                               torch::optim::SGDOptions(0.02).momentum(0.9));
  });
}

TEST(OptimizerTest, NesterovMomentumMatchesTorch) {
  wire::OptimizerConfig c = Config("momentum", 0.02);
  c.set_momentum(0.8);
  c.set_nesterov(true);
  ExpectAgreesWithTorch(c, [](torch::Tensor p) {
    return std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{p},
                                               torch::optim::SGDOptions(0.02).momentum(0.8).nesterov(true));
  });
}

TEST(OptimizerTest, AdagradMatchesTorch) {
  wire::OptimizerConfig c = Config("adagrad", 0.1);
  c.set_initial_accumulator_value(0.1);
  ExpectAgreesWithTorch(c, [](torch::Tensor p) {
    return std::make_unique<torch::optim::Adagrad>(
        std::vector<torch::Tensor>{p}, torch::optim::AdagradOptions(0.1).initial_accumulator_value(0.1).eps(1e-10));
  });
}

TEST(OptimizerTest, AdamMatchesTorch) {
  ExpectAgreesWithTorch(Config("adam", 0.01), [](torch::Tensor p) {
    return std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{p}, torch::optim::AdamOptions(0.01));
  });
}

TEST(OptimizerTest, AdamWithWeightDecayMatchesTorch) {
  wire::OptimizerConfig c = Config("adam", 0.01);
  c.set_weight_decay(0.01);
  ExpectAgreesWithTorch(c, [](torch::Tensor p) {
    return std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{p},
                                                torch::optim::AdamOptions(0.01).weight_decay(0.01));
  });
}

TEST(OptimizerTest, RmsPropMatchesTorch) {
  ExpectAgreesWithTorch(Config("rmsprop", 0.01), [](torch::Tensor p) {
    return std::make_unique<torch::optim::RMSprop>(std::vector<torch::Tensor>{p}, torch::optim::RMSpropOptions(0.01));
  });
}

TEST(OptimizerTest, CenteredRmsPropWithMomentumMatchesTorch) {
  wire::OptimizerConfig c = Config("rmsprop", 0.005);
  c.set_momentum(0.5);
  c.set_centered(true);
  c.set_decay(0.9);
  ExpectAgreesWithTorch(c, [](torch::Tensor p) {
    return std::make_unique<torch::optim::RMSprop>(
        std::vector<torch::Tensor>{p}, torch::optim::RMSpropOptions(0.005).momentum(0.5).centered(true).alpha(0.9));
  });
}

TEST(OptimizerTest, FillsDefaults) {
  auto adam = Optimizer::Create(Config("adam", 0));
  ASSERT_TRUE(adam.ok());
  EXPECT_DOUBLE_EQ((*adam)->config().learning_rate(), 0.001);
  EXPECT_DOUBLE_EQ((*adam)->config().beta2(), 0.999);
  auto sgd = Optimizer::Create(wire::OptimizerConfig());
  ASSERT_TRUE(sgd.ok());
  EXPECT_EQ((*sgd)->config().kind(), "sgd");
}

TEST(OptimizerTest, RefusesBadHyperParameters) {
  EXPECT_EQ(Optimizer::Create(Config("adamw", 0.1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Optimizer::Create(Config("sgd", -1)).ok());
  wire::OptimizerConfig c = Config("adam", 0.1);
  c.set_beta1(1.5);
  auto status = Optimizer::Create(c).status();
  EXPECT_NE(status.message().find("beta1"), std::string::npos) << status;
  wire::OptimizerConfig n = Config("sgd", 0.1);
  n.set_nesterov(true);
  EXPECT_FALSE(Optimizer::Create(n).ok());
}

}  // namespace
}  // namespace shoal
