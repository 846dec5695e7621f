// Every task of a cluster serving in this process over the in-process
// transport, for tests that run strategies or clients by hand.
#ifndef SHOAL_TESTS_INPROC_SERVERS_H_
#define SHOAL_TESTS_INPROC_SERVERS_H_

#include <memory>
#include <set>
#include <vector>

#include "shoal/config/config.h"
#include "shoal/session/task_runner.h"
#include "shoal/session/worker_session.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {

struct InProcServers {
  // Serves every task of `cluster` but those in `absent` (never started).
  InProcServers(const JobConfig& config, const ClusterSpec& cluster, const std::set<TaskId>& absent = {})
      : transport(&network) {
    for (const TaskId& task : cluster.AllTasks()) {
      if (absent.count(task)) continue;
      services.push_back(MakeVariableService(config, task));
      servers.push_back(transport.Serve(cluster.AddressOf(task).value(), services.back().get()).value());
    }
  }

  InProcNetwork network;
  InProcTransport transport;
  std::vector<std::unique_ptr<VariableService>> services;
  std::vector<std::unique_ptr<ServerHandle>> servers;
};

// The chief of a one-worker job on `config.cluster.ps` in-process ps tasks,
// run by hand: its servers, client and context (`max_steps` global steps).
// Construction throws (failing the test) if the job cannot be set up.
struct InProcChief {
  InProcChief(const JobConfig& job, int64_t max_steps)
      : config(job),
        cluster(ClusterSpec::Local(config.cluster.ps, 1)),
        data(LoadData(config).value()),
        servers(config, cluster),
        client(Client::Create(cluster, &servers.transport, MakePlacement(config, cluster).value()).value()),
        context(MakeWorkerContext(config, cluster, TaskId{"worker", 0}, client.get(), data.train, max_steps)) {}

  JobConfig config;  // the context points at this copy
  ClusterSpec cluster;
  DataSplits data;
  InProcServers servers;
  std::unique_ptr<Client> client;
  WorkerContext context;
};

}  // namespace shoal

#endif  // SHOAL_TESTS_INPROC_SERVERS_H_
