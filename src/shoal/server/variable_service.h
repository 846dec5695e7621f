// VariableService: what every task's server does with a Request.
//
// The transport-agnostic core of a server (like TensorFlow's GrpcWorker minus
// gRPC): a transport decodes a message, calls Handle(), and sends back the
// Response. Handle() never fails as a call: the server's verdict is written
// into the response header's status, so a bad request is an answer, not a
// broken connection, and the server keeps running.
//
// Thread safety: Handle() may be called from many threads at once.
#ifndef SHOAL_SERVER_VARIABLE_SERVICE_H_
#define SHOAL_SERVER_VARIABLE_SERVICE_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "shoal/core/message.h"
#include "shoal/server/data_leases.h"
#include "shoal/server/request_ledger.h"
#include "shoal/server/embedding_table.h"
#include "shoal/server/variable_store.h"
#include "shoal/telemetry/prometheus_metrics.h"
#include "shoal/telemetry/trace.h"

namespace shoal {

struct VariableServiceOptions {
  std::string task_name;                       // "/job:ps/task:0"
  size_t max_message_bytes = 512ull << 20;     // tensor payload per request
  // Where save_shard writes (checkpoint.dir); empty: this task writes no files.
  std::string checkpoint_dir;
  // Whether a shutdown from `peer` (Request::peer) comes from one of the
  // job's own tasks; unset: any caller the transport let in may end the job.
  std::function<bool(const std::string& peer)> is_job_peer;
  // The memory this task's variables and tables may take together (0: the
  // host's, or its cgroup's limit).
  double memory_bytes = 0;
};

class VariableService {
 public:
  explicit VariableService(VariableServiceOptions options)
      : options_(std::move(options)),
        store_(options_.task_name),
        tables_(options_.task_name, options_.memory_bytes),
        ledger_(options_.task_name),
        leases_(options_.task_name),
        incarnation_(DrawIncarnation()) {}

  // Serves one request. Always fills response->header.status_code.
  void Handle(const Request& request, Response* response);

  // Whether Handle() may block on `request` (a long poll of a counter, or an
  // apply_accumulated that waits for gradients): transports whose serving
  // threads are few run such requests on a thread of their own, so that the
  // request that would end the wait is never queued behind it.
  static bool MayWait(const Request& request);
  // Whether Handle() may hold its thread for long on `request`: it may wait
  // (MayWait), or it writes or reads a checkpoint, or makes tables (seconds
  // for large ones). Transports run these off their serving threads too, so
  // that a save never stalls the pushes and pulls queued behind it.
  static bool TakesLong(const Request& request);
  // Whether `request` changes anything (everything but reads, lookups and
  // counter reads): numbered ones are then applied at most once.
  static bool Changes(const Request& request);

  // Notified when a Shutdown request arrives.
  absl::Notification& shutdown_requested() { return shutdown_requested_; }
  VariableStore& store() { return store_; }
  TableStore& tables() { return tables_; }
  const VariableServiceOptions& options() const { return options_; }
  // This server's incarnation, in every response header.
  uint64_t incarnation() const { return incarnation_; }
  // Watching (telemetry/): each request counted in `metrics` and put on
  // `tracer`'s track `track`, as it asks (null: not). Set before serving.
  void Watch(std::unique_ptr<ServerMetrics> metrics, Tracer* tracer, int track);
  // Says, in answer to an `endpoints` request, that this task also serves
  // over transport `kind` at `port` (on the host of its address).
  void AdvertiseFastEndpoint(const std::string& kind, int port);

 private:
  // The table a pull_rows / push_rows (`op`) names, once its request carries
  // `tensors` tensors (`which`: what they are, for the error).
  absl::StatusOr<EmbeddingTable*> TableFor(absl::string_view op, const std::string& name, const Request& request,
                                           size_t tensors, absl::string_view which);
  void HandleUnwatched(const Request& request, Response* response);
  absl::Status Dispatch(const Request& request, Response* response);
  // Dispatch, with an exception turned into an error for that request alone.
  absl::Status DispatchGuarded(const Request& request, Response* response);
  // Writes the verdict, and this server's incarnation, into the header.
  void Conclude(const absl::Status& status, Response* response) const;
  // An apply that asked for the values after it (read_after) gets them, as
  // does a repeat of an elastic update (the values before it are gone).
  void ReadAfterApply(const Request& request, Response* response, bool repeat);
  // Leased data: a table's rows on this task keep a watermark and a ledger
  // of their own (a DataLeases that hands out no leases), made at the
  // table's first push with places, from the lease table last restored.
  absl::StatusOr<DataLeases*> RowLeases(const std::string& table);
  // Puts a checkpoint's lease table back on every table's rows too, with
  // each table's own marks where the restore carries this task's (`marks`).
  absl::Status RestoreRowLeases(const wire::LeaseTableState& state, const wire::TaskMarks* marks);
  // The tables to `path` (SaveTables), with no row push admitted meanwhile,
  // and the rows' watermarks then into `marks`.
  absl::StatusOr<bool> SaveTablesWithMarks(const std::string& path, int64_t from_epoch, wire::TaskMarks* marks);
  // Every table this task holds, with its rows' ledger (empty if none).
  void AddTableLedgers(wire::LedgerResponse* ledger);
  static uint64_t DrawIncarnation();

  const VariableServiceOptions options_;
  VariableStore store_;
  TableStore tables_;
  RequestLedger ledger_;
  DataLeases leases_;  // leased data: the lease table (counter task) and every task's progress
  absl::Mutex row_leases_mu_;
  std::map<std::string, std::unique_ptr<DataLeases>> row_leases_ ABSL_GUARDED_BY(row_leases_mu_);
  std::optional<wire::LeaseTableState> restored_leases_ ABSL_GUARDED_BY(row_leases_mu_);
  std::optional<wire::TaskMarks> restored_marks_ ABSL_GUARDED_BY(row_leases_mu_);  // with restored_leases_, if it had them
  const uint64_t incarnation_;
  absl::Mutex endpoint_mu_;
  std::string fast_kind_ ABSL_GUARDED_BY(endpoint_mu_);
  int fast_port_ ABSL_GUARDED_BY(endpoint_mu_) = 0;
  std::unique_ptr<ServerMetrics> metrics_;
  Tracer* tracer_ = nullptr;
  int track_ = 0;
  std::once_flag shutdown_once_;
  absl::Notification shutdown_requested_;
};

// Reads the server's verdict out of a response header.
absl::Status ResponseStatus(const wire::ResponseHeader& header);

}  // namespace shoal

#endif  // SHOAL_SERVER_VARIABLE_SERVICE_H_
