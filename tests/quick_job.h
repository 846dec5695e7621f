// The small end-to-end job the training tests share: the default MLP on a
// Fashion-MNIST subset (12,000 training and 2,000 test examples), 2 epochs,
// with start-up and step deadlines short enough for a test to fail fast.
#ifndef SHOAL_TESTS_QUICK_JOB_H_
#define SHOAL_TESTS_QUICK_JOB_H_

#include <string>

#include "shoal/config/config.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

// Switches `config` to `mode` with the mode's default optimizer, as a config
// naming only the mode gets.
inline void SwitchMode(JobConfig& config, const std::string& mode) {
  config.training.mode = mode;
  config.training.optimizer = DefaultOptimizer(mode);
}

inline JobConfig QuickJob(const std::string& mode = "async") {
  JobConfig config = DefaultJobConfig();
  SwitchMode(config, mode);
  config.data.train_examples = 12000;
  config.data.test_examples = 2000;
  config.training.epochs = 2;
  config.transport.startup_timeout_s = 60;
  config.training.sync_timeout_s = 30;
  return config;
}

}  // namespace shoal

#endif  // SHOAL_TESTS_QUICK_JOB_H_
