// Bytes moved per step for embedding tables of 1M, 10M and 100M rows x 16
// (the last a dynamic table): each step pulls the rows of a batch's ids and
// pushes their gradients, over two in-process ps tasks. The ids are 26
// categorical features per example drawn Zipf-like (exponent 1.05, the
// shape of click logs) over the table's rows. What moves should grow with
// the distinct ids per batch and not with the table; the pulled dense
// alternative (the whole table each step) is printed beside it.
//
//   build/bench/embedding_bench [--steps 20] [--batch 1024] [--rows 1000000,10000000,100000000]
//
// Prints one JSON line per table: rows, dynamic, distinct ids per step,
// bytes per step (sent + received, framing included), bytes the table
// holds, the ratio of the two, and the ps tasks' rows held at the end.
//
//   build/bench/embedding_bench --eviction 1 [--max_rows 1000000] [--steps 40] [--batch 1024]
//
// The price of evict_when_full: one dynamic shard (Adagrad, 16 dims) takes
// pushes of a Zipf stream over 100M ids, whose tail keeps bringing new
// ids, once it is full (max_rows rows), and pushes per second are compared
// with the same stream into a shard that refuses new ids once full and one
// that is never full (no max_rows: it grows). The evicting shard runs twice,
// with eviction lru and lfu: each reports the share of a push's distinct
// ids that found their row held (the rest each evicted a row to get one).
// One JSON line.
//
//   build/bench/embedding_bench --checkpoint 1 [--rows 5000000] [--dir /tmp]
//
// What a checkpoint of a table costs the pushes that go on meanwhile: one
// fixed shard (Adagrad, 16 dims) takes pushes of a Zipf stream on another
// thread, as a ps task takes workers' pushes, while it is saved to a table
// checkpoint file (SaveTables) and restored from it. Pushes per second and
// the longest push during the save are compared with the same pushes
// without a save, measured just before; the save's and restore's rates with
// a plain write of as many bytes to the same folder (the disk's ceiling
// here) and the restore's with the file's size read twice (its check pass,
// then its set pass). One JSON line.
//
//   build/bench/embedding_bench --worker_side 1 [--steps 200] [--batch 1024]
//
// What a worker does with a batch's ids before it pulls, per step of batch
// x 26 Zipf ids over 10M rows (the click job's shape): finding the distinct
// ids (FindDistinctIds) against torch::_unique, which it replaced, in the
// same run, alternating; and the row cache's lookups and inserts (200,000
// rows of 17 floats, staleness 4) with its hit rate. One JSON line.
#include <algorithm>
#include <atomic>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "shoal/client/client.h"
#include "shoal/core/distinct_ids.h"
#include "shoal/model/embedding_bag.h"
#include "shoal/placement/placement.h"
#include "shoal/server/embedding_table.h"
#include "shoal/server/table_checkpoint.h"
#include "shoal/server/variable_service.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {
namespace {

constexpr int64_t kDim = 16;
constexpr int kFeatures = 26;

std::string Flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return fallback;
}

// Zipf-like ranks in [1, n] by inverting the continuous power law's CDF,
// scattered over [0, n) so that the hot ids are not the low ones.
class ZipfIds {
 public:
  ZipfIds(int64_t n, double exponent, uint64_t seed) : n_(n), exponent_(exponent), random_(seed) {}
  int64_t Next() {
    const double u = uniform_(random_);
    const double a = 1 - exponent_;
    const double rank = std::pow((std::pow(static_cast<double>(n_), a) - 1) * u + 1, 1 / a);
    const int64_t r = std::min<int64_t>(n_, std::max<int64_t>(1, static_cast<int64_t>(rank)));
    return static_cast<int64_t>((static_cast<unsigned __int128>(r) * 2654435761ULL) % static_cast<uint64_t>(n_));
  }

 private:
  int64_t n_;
  double exponent_;
  std::mt19937_64 random_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Pushes per second of `steps` pushes of the stream into a dynamic shard
// with `max_rows` (0: none) and evict_when_full as given, after pushes that
// filled it (or, with no max_rows, as many as filling took the capped one).
// `eviction`: lru or lfu, with evict.
struct EvictionRun {
  double pushes_per_second = 0;
  int64_t rows_held = 0, refused = 0, evicted = 0, warm_up_pushes = 0;
  int64_t distinct_ids = 0;  // over the timed pushes
};
EvictionRun PushStream(int64_t max_rows, bool evict, int64_t warm_up_pushes, int64_t steps, int64_t batch,
                       const std::string& eviction = "") {
  wire::TableDef def;
  def.set_name("emb");
  def.set_dim(kDim);
  def.set_num_shards(1);
  def.set_seed(1);
  def.set_init_scale(0.05);
  def.mutable_optimizer()->set_kind("adagrad");
  def.set_max_rows(max_rows);
  def.set_evict_when_full(evict);
  def.set_eviction(eviction);
  auto table = EmbeddingTable::Create(def, "/job:ps/task:0").value();
  ZipfIds draw(100'000'000, 1.05, 42);
  auto next_ids = [&] {  // a batch's distinct ids
    torch::Tensor ids = torch::empty({batch * kFeatures}, torch::kInt64);
    int64_t* id = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) id[i] = draw.Next();
    return std::get<0>(torch::_unique2(ids));
  };
  auto push = [&](const torch::Tensor& ids, const torch::Tensor& gradients) {
    if (!table->Push(ids, gradients).ok()) std::abort();
  };
  auto gradients_for = [](const torch::Tensor& ids) { return torch::full({ids.numel(), kDim}, 0.01f); };
  EvictionRun run;
  // Full once it has turned a new id away or evicted for one (a shard that
  // evicts hovers just below max_rows).
  auto full = [&] { return table->refused_admissions() + table->evicted_when_full() > 0; };
  while (max_rows > 0 ? !full() : run.warm_up_pushes < warm_up_pushes) {
    const torch::Tensor ids = next_ids();
    push(ids, gradients_for(ids));
    ++run.warm_up_pushes;
  }
  // Only the pushes are timed, not drawing the ids.
  const int64_t evicted_before = table->evicted_when_full(), refused_before = table->refused_admissions();
  double seconds = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const torch::Tensor ids = next_ids(), gradients = gradients_for(ids);
    run.distinct_ids += ids.numel();
    const auto start = std::chrono::steady_clock::now();
    push(ids, gradients);
    seconds += SecondsSince(start);
  }
  run.pushes_per_second = steps / seconds;
  run.rows_held = table->size();
  run.refused = table->refused_admissions() - refused_before;
  run.evicted = table->evicted_when_full() - evicted_before;
  return run;
}

int RunEviction(int argc, char** argv) {
  int64_t steps = 40, batch = 1024, max_rows = 1'000'000;
  (void)absl::SimpleAtoi(Flag(argc, argv, "steps", "40"), &steps);
  (void)absl::SimpleAtoi(Flag(argc, argv, "batch", "1024"), &batch);
  (void)absl::SimpleAtoi(Flag(argc, argv, "max_rows", "1000000"), &max_rows);
  const EvictionRun evicting = PushStream(max_rows, /*evict=*/true, 0, steps, batch, "lru");
  const EvictionRun by_count = PushStream(max_rows, /*evict=*/true, 0, steps, batch, "lfu");
  const EvictionRun refusing = PushStream(max_rows, /*evict=*/false, 0, steps, batch);
  const EvictionRun growing = PushStream(0, false, evicting.warm_up_pushes, steps, batch);
  std::printf(
      "{\"max_rows\": %lld, \"batch\": %lld, \"warm_up_pushes\": %lld, \"pushes_per_second\": "
      "{\"evicting\": %.1f, \"refusing\": %.1f, \"growing\": %.1f}, \"evicting_vs_growing\": %.3f, "
      "\"refusing_vs_growing\": %.3f, \"evicted_per_push\": %.0f, \"refused_per_push\": %.0f, "
      "\"rows_held\": {\"evicting\": %lld, \"refusing\": %lld, \"growing\": %lld}, "
      "\"lfu\": {\"pushes_per_second\": %.1f, \"evicted_per_push\": %.0f, \"vs_lru_pushes\": %.3f}, "
      "\"ids_found_held\": {\"lru\": %.4f, \"lfu\": %.4f}}\n",
      static_cast<long long>(max_rows), static_cast<long long>(batch),
      static_cast<long long>(evicting.warm_up_pushes), evicting.pushes_per_second, refusing.pushes_per_second,
      growing.pushes_per_second, evicting.pushes_per_second / growing.pushes_per_second,
      refusing.pushes_per_second / growing.pushes_per_second, static_cast<double>(evicting.evicted) / steps,
      static_cast<double>(refusing.refused) / steps, static_cast<long long>(evicting.rows_held),
      static_cast<long long>(refusing.rows_held), static_cast<long long>(growing.rows_held),
      by_count.pushes_per_second, static_cast<double>(by_count.evicted) / steps,
      by_count.pushes_per_second / evicting.pushes_per_second,
      1 - static_cast<double>(evicting.evicted) / static_cast<double>(evicting.distinct_ids),
      1 - static_cast<double>(by_count.evicted) / static_cast<double>(by_count.distinct_ids));
  return 0;
}

// Microseconds per call of `work` over `batches`, the median of 5 rounds.
double MedianMicros(const std::vector<torch::Tensor>& batches, const std::function<void(const torch::Tensor&)>& work) {
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (const torch::Tensor& batch : batches) work(batch);
    rounds.push_back(SecondsSince(start) * 1e6 / static_cast<double>(batches.size()));
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[2];
}

int RunWorkerSide(int argc, char** argv) {
  int64_t steps = 200, batch = 1024;
  (void)absl::SimpleAtoi(Flag(argc, argv, "steps", "200"), &steps);
  (void)absl::SimpleAtoi(Flag(argc, argv, "batch", "1024"), &batch);
  torch::set_num_threads(1);  // as a worker runs
  ZipfIds draw(10'000'000, 1.05, 42);
  std::vector<torch::Tensor> batches;
  for (int64_t step = 0; step < steps; ++step) {
    torch::Tensor ids = torch::empty({batch * kFeatures}, torch::kInt64);
    for (int64_t i = 0; i < ids.numel(); ++i) ids.data_ptr<int64_t>()[i] = draw.Next();
    batches.push_back(ids);
  }
  // Both must find the same ids, and map every id back to itself.
  int64_t distinct_ids = 0;
  for (const torch::Tensor& ids : batches) {
    const DistinctIds found = FindDistinctIds(ids);
    const torch::Tensor torch_found = std::get<0>(torch::_unique(ids, /*sorted=*/false));
    if (found.values.numel() != torch_found.numel() || !found.values.index_select(0, found.inverse).equal(ids)) {
      std::fprintf(stderr, "FindDistinctIds disagrees with torch::_unique\n");
      return 1;
    }
    distinct_ids += found.values.numel();
  }
  const double shoal_micros = MedianMicros(batches, [](const torch::Tensor& ids) { (void)FindDistinctIds(ids); });
  const double torch_micros = MedianMicros(
      batches, [](const torch::Tensor& ids) { (void)torch::_unique(ids, /*sorted=*/false, /*return_inverse=*/true); });
  // The row cache: each step looks up its distinct ids and takes in the rows it missed.
  constexpr int64_t kCachedDim = kDim + 1;  // the wide & deep table's row: 16 + the wide weight
  std::vector<torch::Tensor> distinct;
  for (const torch::Tensor& ids : batches) distinct.push_back(FindDistinctIds(ids).values);
  RowCache cache(200'000, kCachedDim, /*staleness=*/4);
  int64_t step = 0;
  const double cache_micros = MedianMicros(distinct, [&](const torch::Tensor& ids) {
    torch::Tensor rows = torch::empty({ids.numel(), kCachedDim});
    const torch::Tensor missed = ids.masked_select(cache.Lookup(ids, ++step, rows).logical_not());
    cache.Insert(missed, torch::ones({missed.numel(), kCachedDim}), step);
  });
  std::printf(
      "{\"batch\": %lld, \"ids_per_step\": %lld, \"distinct_ids_per_step\": %.0f, \"distinct_micros\": "
      "{\"shoal\": %.1f, \"torch_unique\": %.1f}, \"torch_unique_vs_shoal\": %.2f, \"row_cache\": "
      "{\"rows\": 200000, \"staleness\": 4, \"micros_per_step\": %.1f, \"hit_rate\": %.4f}}\n",
      static_cast<long long>(batch), static_cast<long long>(batch * kFeatures),
      static_cast<double>(distinct_ids) / static_cast<double>(steps), shoal_micros, torch_micros,
      torch_micros / shoal_micros, cache_micros,
      static_cast<double>(cache.hits()) / static_cast<double>(cache.lookups()));
  return 0;
}

// GB/s of writing `bytes` to a new file at `path` with plain fwrite calls
// of 4 MiB, closed (not synced: the save is not either), then removed.
double PlainWriteGbps(const std::string& path, int64_t bytes) {
  std::vector<char> block(4 << 20, 1);
  const auto start = std::chrono::steady_clock::now();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) std::abort();
  for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(block.size())) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(block.size())));
    if (std::fwrite(block.data(), 1, n, file) != n) std::abort();
  }
  std::fclose(file);
  const double seconds = SecondsSince(start);
  std::filesystem::remove(path);
  return static_cast<double>(bytes) / seconds / 1e9;
}

int RunCheckpoint(int argc, char** argv) {
  int64_t rows = 5'000'000;
  (void)absl::SimpleAtoi(Flag(argc, argv, "rows", "5000000"), &rows);
  const std::filesystem::path dir = Flag(argc, argv, "dir", std::filesystem::temp_directory_path().string());
  const std::string file = (dir / absl::StrCat("embedding_bench_", ::getpid(), ".ckpt")).string();
  TableStore store("/job:ps/task:0");
  wire::TableDef def;
  def.set_name("emb");
  def.set_rows(rows);
  def.set_dim(kDim);
  def.set_num_shards(1);
  def.set_seed(1);
  def.set_init_scale(0.05);
  def.mutable_optimizer()->set_kind("adagrad");
  if (!store.Create({def}).ok()) return 1;
  EmbeddingTable* table = store.Find("emb").value();

  // The pusher: a batch's distinct ids (1024 x 26 draws) per push, drawn
  // ahead so that only the pushes take its time.
  std::vector<torch::Tensor> batches;
  ZipfIds draw(rows, 1.05, 42);
  for (int b = 0; b < 16; ++b) {
    torch::Tensor ids = torch::empty({1024 * kFeatures}, torch::kInt64);
    for (int64_t i = 0; i < ids.numel(); ++i) ids.data_ptr<int64_t>()[i] = draw.Next();
    batches.push_back(std::get<0>(torch::_unique2(ids)));
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> pushes{0};
  std::atomic<double> longest{0};
  std::thread pusher([&] {
    for (size_t b = 0; !stop; ++b) {
      const torch::Tensor& ids = batches[b % batches.size()];
      const auto start = std::chrono::steady_clock::now();
      if (!table->Push(ids, torch::full({ids.numel(), kDim}, 0.01f)).ok()) std::abort();
      const double took = SecondsSince(start);
      if (took > longest) longest = took;
      ++pushes;
    }
  });
  // A window: pushes/s and the longest push while `during` runs.
  struct Window {
    double seconds, pushes_per_second, longest_push_s;
  };
  auto window = [&](const std::function<void()>& during) {
    const int64_t before = pushes;
    longest = 0;
    const auto start = std::chrono::steady_clock::now();
    during();
    const double seconds = SecondsSince(start);
    return Window{seconds, static_cast<double>(pushes - before) / seconds, longest};
  };
  const Window quiet = window([] { std::this_thread::sleep_for(std::chrono::seconds(3)); });
  // This host's page cache makes a file's first writes several times slower
  // than later ones, and moves between runs: plain writes and saves take
  // turns, three rounds, and the medians are compared.
  std::vector<double> plain_write, save_seconds;
  Window saving{0, 0, 0};
  int64_t file_bytes = 0;
  for (int round = 0; round < 3; ++round) {
    plain_write.push_back(PlainWriteGbps(file, file_bytes > 0 ? file_bytes : table->bytes()));
    bool saved_ok = false;
    const Window save = window([&] { saved_ok = SaveTables(store, file).ok(); });
    if (!saved_ok) return 1;
    save_seconds.push_back(save.seconds);
    saving.seconds += save.seconds;
    saving.pushes_per_second += save.pushes_per_second * save.seconds;
    saving.longest_push_s = std::max(saving.longest_push_s, save.longest_push_s);
    file_bytes = static_cast<int64_t>(std::filesystem::file_size(file));
    if (round < 2) std::filesystem::remove(file);
  }
  saving.pushes_per_second /= saving.seconds;
  stop = true;
  pusher.join();
  const auto restore_start = std::chrono::steady_clock::now();
  const absl::StatusOr<int64_t> restored = RestoreTables(store, {file});
  const double restore_seconds = SecondsSince(restore_start);
  std::filesystem::remove(file);
  if (!restored.ok() || *restored != rows) return 1;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double plain_write_gbps = median(plain_write), save_s = median(save_seconds);
  const double save_gbps = static_cast<double>(file_bytes) / save_s / 1e9;
  std::printf(
      "{\"rows\": %lld, \"file_bytes\": %lld, \"save_s\": %.2f, \"save_gbps\": %.3f, "
      "\"plain_write_gbps\": %.3f, \"save_vs_plain_write\": %.3f, \"restore_s\": %.2f, "
      "\"restore_rows_per_s\": %.0f, \"restore_read_gbps\": %.3f, "
      "\"pushes_per_second\": {\"quiet\": %.1f, \"during_save\": %.1f}, \"during_save_vs_quiet\": %.3f, "
      "\"longest_push_s\": {\"quiet\": %.4f, \"during_save\": %.4f}}\n",
      static_cast<long long>(rows), static_cast<long long>(file_bytes), save_s, save_gbps, plain_write_gbps,
      save_gbps / plain_write_gbps, restore_seconds, static_cast<double>(rows) / restore_seconds,
      2.0 * static_cast<double>(file_bytes) / restore_seconds / 1e9, quiet.pushes_per_second,
      saving.pushes_per_second, saving.pushes_per_second / quiet.pushes_per_second, quiet.longest_push_s,
      saving.longest_push_s);
  return 0;
}

int Run(int argc, char** argv) {
  if (Flag(argc, argv, "eviction", "0") == "1") return RunEviction(argc, argv);
  if (Flag(argc, argv, "checkpoint", "0") == "1") return RunCheckpoint(argc, argv);
  if (Flag(argc, argv, "worker_side", "0") == "1") return RunWorkerSide(argc, argv);
  int64_t steps = 20, batch = 1024;
  (void)absl::SimpleAtoi(Flag(argc, argv, "steps", "20"), &steps);
  (void)absl::SimpleAtoi(Flag(argc, argv, "batch", "1024"), &batch);
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(Flag(argc, argv, "rows", "1000000,10000000,100000000"), ',')) {
    int64_t rows = 0;
    if (absl::SimpleAtoi(s, &rows) && rows > 0) sizes.push_back(rows);
  }
  for (int64_t rows : sizes) {
    const bool dynamic = rows >= 100'000'000;  // too big to hold whole here: rows made as touched
    InProcNetwork network;
    InProcTransport transport(&network);
    const ClusterSpec cluster = ClusterSpec::Local(2, 1);
    std::vector<std::unique_ptr<VariableService>> services;
    std::vector<std::unique_ptr<ServerHandle>> servers;
    for (const TaskId& task : cluster.Tasks("ps")) {
      services.push_back(std::make_unique<VariableService>(VariableServiceOptions{task.ToString()}));
      servers.push_back(transport.Serve(cluster.AddressOf(task).value(), services.back().get()).value());
    }
    auto placement = std::make_shared<const Placement>(Placement::Create({}, cluster, PlacementOptions{}).value());
    auto client = Client::Create(cluster, &transport, placement).value();
    wire::TableDef table;
    table.set_name("emb");
    table.set_rows(dynamic ? 0 : rows);
    table.set_dim(kDim);
    table.set_seed(1);
    table.set_init_scale(0.05);
    table.mutable_optimizer()->set_kind("adagrad");
    if (!client->CreateTables({table}).ok()) return 1;
    ZipfIds draw(rows, 1.05, 42);
    int64_t distinct = 0;
    const int64_t before = client->bytes_sent() + client->bytes_received();
    for (int64_t step = 0; step < steps; ++step) {
      torch::Tensor ids = torch::empty({batch * kFeatures}, torch::kInt64);
      int64_t* id = ids.data_ptr<int64_t>();
      for (int64_t i = 0; i < ids.numel(); ++i) id[i] = draw.Next();
      distinct += std::get<0>(torch::_unique2(ids)).numel();
      auto rows_pulled = client->PullRows("emb", ids);
      if (!rows_pulled.ok()) return 1;
      if (!client->PushRows("emb", ids, torch::full_like(*rows_pulled, 0.01f)).ok()) return 1;
    }
    const double bytes_per_step = static_cast<double>(client->bytes_sent() + client->bytes_received() - before) / steps;
    const double table_bytes = static_cast<double>(rows) * kDim * 4;
    int64_t held = 0;
    for (auto& service : services) held += service->tables().Find("emb").value()->size();
    std::printf(
        "{\"rows\": %lld, \"dynamic\": %s, \"batch\": %lld, \"distinct_ids_per_step\": %.0f, "
        "\"bytes_per_step\": %.0f, \"bytes_per_distinct_id\": %.1f, \"table_bytes\": %.0f, "
        "\"table_bytes_over_step_bytes\": %.1f, \"rows_held\": %lld}\n",
        static_cast<long long>(rows), dynamic ? "true" : "false", static_cast<long long>(batch),
        static_cast<double>(distinct) / steps, bytes_per_step, bytes_per_step / (static_cast<double>(distinct) / steps),
        table_bytes, table_bytes / bytes_per_step, static_cast<long long>(held));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) { return shoal::Run(argc, argv); }
