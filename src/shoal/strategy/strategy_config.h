// What the training strategies read of a job's configuration: the model,
// the training and local-replica options, the population and gated
// ensembles, checkpoints and deadlines. JobConfig (config/config.h) adds the
// sections only the session and the command line read.
#ifndef SHOAL_STRATEGY_STRATEGY_CONFIG_H_
#define SHOAL_STRATEGY_STRATEGY_CONFIG_H_

#include <string>
#include <vector>

#include "shoal/checkpoint/checkpoint.h"
#include "shoal/model/gated_ensemble.h"
#include "shoal/model/model_factory.h"
#include "shoal/population/policy.h"
#include "shoal/transport/transport.h"
#include "shoal/wire.pb.h"

namespace shoal {

struct TrainingConfig {
  // async | sync | ssp, a local-replica mode (downpour | model_average |
  // easgd), population, or gated (a master network weighing K networks)
  std::string mode = "async";
  int epochs = 5;
  int64_t max_steps = 0;  // 0: epochs * train_examples / batch_size
  int64_t batch_size = 64;
  wire::OptimizerConfig optimizer;  // default adam, learning_rate 0.001
  bool use_locking = false;
  uint64_t seed = 1;
  // sync (SyncReplicas): gradients averaged per step; 0 = every worker. Fewer
  // than the workers leaves the rest as backups, whose late gradients are
  // dropped. More than the workers is refused.
  int replicas_to_aggregate = 0;
  double sync_timeout_s = 60;  // a step that cannot complete in this time fails, naming who is missing
  // async, sync, ssp: the chief publishes the model's buffers (BatchNorm
  // statistics) to the ps every this many of its steps, and at its last.
  int64_t buffer_publish_steps = 50;
  // ssp (stale synchronous parallel): a worker runs at most `staleness` steps
  // ahead of the slowest; 0 is bulk-synchronous, negative is unbounded (async).
  int staleness = 2;
};

// Local replicas (DistBelief): each worker trains its own copy of the model
// with `optimizer` and exchanges with the ps only now and then.
struct LocalReplicaConfig {
  wire::OptimizerConfig optimizer;  // trains the local copy; default: adam 0.001
  // downpour: fetch the global values every n_fetch steps; push the summed
  // gradients every n_push steps (the ps applies training.optimizer, adagrad
  // unless the config names one).
  int n_fetch = 4;
  int n_push = 4;
  // model_average: after warmup_steps (averaged every step), average the
  // local copies every interval_steps at a barrier. block_momentum > 0 turns
  // on BMUF: bg = m*bg + block_learning_rate*(global - average); global -= bg.
  int interval_steps = 8;
  int warmup_steps = 0;
  double block_momentum = 0;
  double block_learning_rate = 1;
  // easgd: every tau steps, d = alpha*(x - centre); x -= d; centre += d.
  // alpha 0 means 0.9 / workers. rho > 0 adds rho*(x - centre) to each local
  // gradient (the elastic penalty, with the last centre read).
  int tau = 8;
  double alpha = 0;
  double rho = 0;
};

struct StrategyConfig {
  ModelConfig model;
  TrainingConfig training;
  LocalReplicaConfig local;
  PopulationConfig population;
  GatedModelConfig gated;  // mode gated (model/gated_ensemble.h)
  CheckpointConfig checkpoint;
  TransportConfig transport;
};

}  // namespace shoal

#endif  // SHOAL_STRATEGY_STRATEGY_CONFIG_H_
