// What a job's checkpoint holds, by variable name: tests check the values a
// job saved (its BatchNorm statistics, say) without a cluster.
#ifndef SHOAL_TESTS_SAVED_VALUES_H_
#define SHOAL_TESTS_SAVED_VALUES_H_

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "shoal/checkpoint/checkpoint.h"

namespace shoal {

inline std::map<std::string, torch::Tensor> SavedValues(const std::string& checkpoint) {
  CheckpointIndex index;
  auto all = LoadCheckpoint(checkpoint, &index);
  EXPECT_TRUE(all.ok()) << all.status();
  std::map<std::string, torch::Tensor> values;
  if (!all.ok()) return values;
  for (const auto& v : *all) values[v.name] = v.value;
  return values;
}

}  // namespace shoal

#endif  // SHOAL_TESTS_SAVED_VALUES_H_
