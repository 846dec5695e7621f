// Trains a network this program defines, with shoal, in any training mode:
//
//   train_my_net [--mode async|sync|ssp|downpour|model_average|easgd] [--max_steps N]
//
// The job is the main job's (2 ps, 2 workers, Fashion-MNIST) with this
// program's network in place of the built-in MLP, and a hook of its own.
#include <shoal/shoal.h>

#include <cstdlib>
#include <iostream>
#include <string>

// A small convolutional network, as any libtorch program would write it.
struct MyNet : torch::nn::Module {
  MyNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(8 * 14 * 14, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Prints the chief's loss now and then.
class PrintLoss : public shoal::Hook {
 public:
  bool AfterStep(const shoal::Step& step, std::string* reason) override {
    if (step.chief && step.local_step % 200 == 0) {
      std::cout << "step " << step.global_step << ": loss " << step.loss << std::endl;
    }
    return false;
  }
};

int main(int argc, char** argv) {
  std::string mode = "async", max_steps = "0";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mode") mode = argv[i + 1];
    else if (flag == "--max_steps") max_steps = argv[i + 1];
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  try {
    shoal::Job job;
    job.Set("training.mode", mode).Set("training.epochs", "1").Set("training.max_steps", max_steps);
    job.SetModule(shoal::Module::Of<MyNet>("MyNet"));
    job.AddHook(std::make_shared<PrintLoss>());
    const shoal::Report report = job.Train();
    std::cout << "MyNet, " << mode << ": " << report.global_step << " steps in " << report.seconds
              << " s, test accuracy " << 100 * report.test_accuracy << "%" << std::endl;
  } catch (const shoal::Error& e) {
    std::cerr << "shoal: " << e.code() << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
