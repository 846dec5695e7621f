#include "shoal/server/embedding_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <tuple>
#include <unordered_set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

// SplitMix64: a counter-based generator, so that row `id`'s initial value
// depends on (seed, id) only.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// "96 bytes", "4.2 MB", "25.3 GB".
std::string Size(double bytes) {
  if (bytes < 1e3) return absl::StrFormat("%.0f bytes", bytes);
  if (bytes < 1e6) return absl::StrFormat("%.1f kB", bytes / 1e3);
  return bytes >= 1e9 ? absl::StrFormat("%.1f GB", bytes / 1e9) : absl::StrFormat("%.1f MB", bytes / 1e6);
}

// Row-sized slots each sparse optimizer keeps.
int SlotsOf(const std::string& kind) { return kind == "sgd" ? 0 : kind == "adagrad" ? 1 : 2; }

// A dynamic table's row storage: its values and slots in the arenas, and
// its last push and id beside them. A freed row keeps its storage for the
// table's next new id (the arenas never shrink).
int64_t RowStorageBytes(const wire::TableDef& def) {
  return def.dim() * static_cast<int64_t>(sizeof(float)) * (1 + SlotsOf(def.optimizer().kind())) + 16 +
         (def.eviction() == "lfu" ? 4 : 0);  // lfu: its touch count
}

// What one row of a dynamic table takes in all.
double DynamicRowBytes(const wire::TableDef& def) {
  return static_cast<double>(RowStorageBytes(def) + EmbeddingTable::kIndexEntryBytes);
}

// The rows a shard of a dynamic table may hold: as many as fit in 90% of
// the memory the task does not hold already (`free_bytes`), and no more
// than its share of max_rows where that is set.
int64_t DynamicCapacity(const wire::TableDef& def, double free_bytes) {
  const auto fit = static_cast<int64_t>(std::min(0.9 * free_bytes / DynamicRowBytes(def), 9e18));
  if (def.max_rows() > 0) return std::min(fit, (def.max_rows() + def.num_shards() - 1) / def.num_shards());
  return fit;
}

// The shard that holds `id` among `shards`.
int64_t ShardOf(int64_t id, int64_t shards) { return ((id % shards) + shards) % shards; }

}  // namespace

bool SharedRowRoom::Take(int64_t bytes) {
  int64_t held = held_.load();
  do {
    if (held + bytes > limit_.load()) return false;
  } while (!held_.compare_exchange_weak(held, held + bytes));
  return true;
}

void RowArena::Unmap::operator()(float* chunk) const { munmap(chunk, bytes); }

RowArena::Chunk RowArena::NewChunk() const {
  const size_t bytes = static_cast<size_t>(kChunkRows * dim_) * sizeof(float);
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  return Chunk(static_cast<float*>(memory), Unmap{bytes});
}

void RowArena::Grow(int64_t rows) {
  if (rows <= rows_) return;
  while (static_cast<int64_t>(chunks_.size()) * kChunkRows < rows) chunks_.push_back(NewChunk());
  // Rows past rows_ have never been written, and fresh pages read as zeros
  // and take no memory until written: a fill of 0 writes nothing, and a
  // table's last chunk holds only the rows it uses.
  if (fill_ != 0) {
    for (int64_t row = rows_; row < rows; ++row) std::fill_n(Row(row), dim_, fill_);
  }
  rows_ = rows;
}

void EmbeddingTable::InitialRow(const wire::TableDef& def, int64_t id, float* row) {
  const uint64_t base = Mix(def.seed() ^ Mix(static_cast<uint64_t>(id)));
  const double scale = def.init_scale();
  for (int64_t j = 0; j < def.dim(); ++j) {
    const uint64_t bits = Mix(base + static_cast<uint64_t>(j));
    const double unit = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
    row[j] = static_cast<float>((2 * unit - 1) * scale);
  }
}

double EmbeddingTable::UsableMemoryBytes() {
  double bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when unlimited
  double cgroup = 0;
  if (limit >> cgroup && cgroup > 0) bytes = std::min(bytes, cgroup);
  return bytes;
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(const wire::TableDef& def,
                                                                       const std::string& task_name,
                                                                       double memory_bytes, double memory_in_use,
                                                                       SharedRowRoom* room) {
  if (memory_bytes <= 0) memory_bytes = UsableMemoryBytes();
  const std::string where = absl::StrCat("table '", def.name(), "' on ", task_name);
  if (def.name().empty()) return absl::InvalidArgumentError(absl::StrCat("a table on ", task_name, " has no name"));
  if (def.dim() <= 0 || def.dim() > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dim ", def.dim(), " is not in [1, 65536]"));
  }
  if (def.rows() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": rows ", def.rows(), " is negative"));
  if (def.num_shards() <= 0 || def.shard() < 0 || def.shard() >= def.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shard ", def.shard(), " of ", def.num_shards(), " is not a shard"));
  }
  if (!(def.init_scale() >= 0) || !std::isfinite(def.init_scale())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": init_scale ", def.init_scale(), " is not >= 0"));
  }
  if (def.min_count() < 0 || def.steps_to_live() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": min_count and steps_to_live must be >= 0"));
  }
  if (def.max_rows() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": max_rows must be >= 0"));
  if (def.rows() > 0 && (def.min_count() > 1 || def.steps_to_live() > 0 || def.max_rows() > 0 ||
                         def.evict_when_full() || def.eviction() == "lfu")) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": min_count, steps_to_live, max_rows, evict_when_full and eviction are for dynamic tables ",
        "(rows: 0)"));
  }
  if (!def.eviction().empty() && def.eviction() != "lru" && def.eviction() != "lfu") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": eviction '", def.eviction(), "' is not lru or lfu"));
  }
  if (def.eviction() == "lfu" && !def.evict_when_full()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": eviction '", def.eviction(), "' chooses what a full table evicts: set evict_when_full"));
  }
  wire::TableDef filled = def;
  wire::OptimizerConfig& o = *filled.mutable_optimizer();
  if (o.kind().empty()) o.set_kind("sgd");
  const std::string& kind = o.kind();
  if (kind != "sgd" && kind != "adagrad" && kind != "lazy_adam" && kind != "ftrl") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": optimizer '", kind, "' has no sparse form (sgd, adagrad, lazy_adam, ftrl)"));
  }
  for (double v : {o.learning_rate(), o.beta1(), o.beta2(), o.epsilon(), o.initial_accumulator_value(), o.l1(),
                   o.l2(), o.learning_rate_power()}) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat(where, ": an optimizer field is not finite"));
  }
  if (o.learning_rate() < 0 || o.l1() < 0 || o.l2() < 0 || o.initial_accumulator_value() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": learning_rate, l1, l2 and initial_accumulator_value must be >= 0"));
  }
  if (o.beta1() < 0 || o.beta1() >= 1 || o.beta2() < 0 || o.beta2() >= 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": beta1 and beta2 must be in [0, 1)"));
  }
  if (o.learning_rate_power() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": learning_rate_power must be <= 0"));
  }
  if (o.learning_rate() == 0) o.set_learning_rate(kind == "lazy_adam" ? 0.001 : kind == "ftrl" ? 0.05 : 0.01);
  if (o.initial_accumulator_value() == 0 && (kind == "adagrad" || kind == "ftrl")) {
    o.set_initial_accumulator_value(0.1);
  }
  if (o.epsilon() == 0) o.set_epsilon(kind == "lazy_adam" ? 1e-8 : 1e-7);
  if (o.beta1() == 0) o.set_beta1(0.9);
  if (o.beta2() == 0) o.set_beta2(0.999);
  if (o.learning_rate_power() == 0) o.set_learning_rate_power(-0.5);
  if (filled.rows() > 0 && !filled.read_only()) {
    // A fixed table's shard is made whole, here: a size that cannot fit is
    // refused before anything is allocated (a typo'd row count, or a hostile
    // request, must not take the ps task down).
    const int slots = SlotsOf(kind);
    const double shard_rows = std::ceil(static_cast<double>(filled.rows()) / filled.num_shards());
    const double bytes = shard_rows * static_cast<double>(filled.dim()) * sizeof(float) * (1 + slots);
    if (bytes + memory_in_use > memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: its shard of %.0f rows x %d floats (with %s's %d slots) needs %s, %s than the %s of memory this "
          "task may use; spread it over more ps tasks, or make it dynamic (rows: 0)",
          where, shard_rows, filled.dim(), kind, slots, Size(bytes),
          memory_in_use > 0 ? absl::StrCat("which with the ", Size(memory_in_use), " this task holds already is more")
                            : "more",
          Size(memory_bytes)));
    }
  }
  int64_t capacity = 0;
  if (filled.rows() == 0 && !filled.read_only()) {
    // A dynamic table's rows come later, one by one, so its bound is set
    // now, from what the task's variables and other tables leave.
    capacity = DynamicCapacity(filled, memory_bytes - memory_in_use);
    if (capacity < 1) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: a dynamic table needs %s a row, and the %s this task holds already leave no room in the %s of "
          "memory it may use; spread the variables and tables over more ps tasks",
          where, Size(DynamicRowBytes(filled)), Size(memory_in_use), Size(memory_bytes)));
    }
  }
  auto table = std::make_unique<EmbeddingTable>(std::move(filled), task_name, capacity, capacity > 0 ? room : nullptr);
  if (table->dense_) {
    // This shard's rows: ids shard, shard + num_shards, ...
    const int64_t local = (table->def_.rows() - table->def_.shard() + table->def_.num_shards() - 1) /
                          table->def_.num_shards();
    table->values_.Grow(local);
    for (RowArena& slot : table->slots_) slot.Grow(local);
    for (int64_t i = 0; i < local; ++i) {
      InitialRow(table->def_, i * table->def_.num_shards() + table->def_.shard(), table->values_.Row(i));
    }
  }
  return table;
}

EmbeddingTable::Rule EmbeddingTable::RuleOf(const std::string& kind) {
  if (kind == "adagrad") return Rule::kAdagrad;
  if (kind == "lazy_adam") return Rule::kLazyAdam;
  if (kind == "ftrl") return Rule::kFtrl;
  return Rule::kSgd;  // Create() has refused any other
}

EmbeddingTable::EmbeddingTable(wire::TableDef def, std::string task_name, int64_t capacity, SharedRowRoom* room)
    : def_(std::move(def)),
      dense_(def_.rows() > 0 && !def_.read_only()),
      rule_(RuleOf(def_.optimizer().kind())),
      where_(absl::StrCat("table '", def_.name(), "' on ", task_name)),
      dim_(def_.dim()),
      capacity_(capacity),
      room_(room),
      row_storage_bytes_(RowStorageBytes(def_)),
      by_count_(def_.eviction() == "lfu"),
      values_(def_.dim()) {
  if (def_.read_only()) return;  // no optimizer state: nothing will be pushed
  const float initial_accumulator = static_cast<float>(def_.optimizer().initial_accumulator_value());
  if (rule_ == Rule::kAdagrad) slots_.emplace_back(dim_, initial_accumulator);
  if (rule_ == Rule::kLazyAdam) {
    slots_.emplace_back(dim_, 0.0f);
    slots_.emplace_back(dim_, 0.0f);
  }
  if (rule_ == Rule::kFtrl) {
    slots_.emplace_back(dim_, 0.0f);                  // z (TensorFlow's "linear")
    slots_.emplace_back(dim_, initial_accumulator);  // n (the accumulator)
  }
}

int64_t EmbeddingTable::Find(int64_t id) const {
  if (dense_) return id / def_.num_shards();
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second;
}

absl::Status EmbeddingTable::Check(const torch::Tensor& ids, const torch::Tensor* gradients, bool distinct) const {
  if (!ids.defined() || ids.scalar_type() != torch::kInt64 || ids.dim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ids must be a 1-D int64 tensor, got ",
                                                   ids.defined() ? std::string(ids.toString()) : "nothing",
                                                   ids.defined() ? absl::StrCat(" of ", ids.dim(), " dims") : ""));
  }
  const int64_t n = ids.size(0);
  const int64_t* id = ids.data_ptr<int64_t>();
  std::unordered_set<int64_t> seen;
  if (distinct) seen.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (def_.rows() > 0 && (id[i] < 0 || id[i] >= def_.rows())) {
      return absl::OutOfRangeError(absl::StrCat(where_, ": id ", id[i], " is outside the table's ", def_.rows(),
                                                " rows"));
    }
    if (ShardOf(id[i], def_.num_shards()) != def_.shard()) {
      return absl::InvalidArgumentError(absl::StrCat(where_, ": id ", id[i], " belongs to shard ",
                                                     ShardOf(id[i], def_.num_shards()), ", not ", def_.shard()));
    }
    if (distinct && !seen.insert(id[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": id ", id[i], " appears twice (combine its gradients first)"));
    }
  }
  if (gradients == nullptr) return absl::OkStatus();
  const torch::Tensor& g = *gradients;
  if (!g.defined() || g.scalar_type() != torch::kFloat32 || g.dim() != 2 || g.size(0) != n || g.size(1) != dim_) {
    return absl::InvalidArgumentError(absl::StrCat(
        where_, ": gradients must be float32 [", n, ", ", dim_, "] for ", n, " ids, got ",
        g.defined() ? absl::StrCat(std::string(g.toString()), " ", std::string(c10::str(g.sizes()))) : "nothing"));
  }
  const float* data = g.data_ptr<float>();
  for (int64_t i = 0; i < n * dim_; ++i) {
    if (!std::isfinite(data[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": the gradient of id ", id[i / dim_], " is not finite (", data[i], ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> EmbeddingTable::Pull(const torch::Tensor& ids) const {
  torch::Tensor contiguous_ids = ids.defined() ? ids.contiguous() : ids;
  absl::Status checked = Check(contiguous_ids, nullptr, /*distinct=*/false);
  if (!checked.ok()) return checked;
  const int64_t n = contiguous_ids.size(0);
  const int64_t* id = contiguous_ids.data_ptr<int64_t>();
  torch::Tensor rows = torch::empty({n, dim_}, torch::kFloat32);
  float* out = rows.data_ptr<float>();
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = Find(id[i]);
    if (index < 0) {
      InitialRow(def_, id[i], out + i * dim_);
    } else {
      std::memcpy(out + i * dim_, values_.Row(index), dim_ * sizeof(float));
    }
  }
  return rows;
}

int64_t EmbeddingTable::FindOrAdmit(int64_t id) {
  auto it = index_.find(id);
  if (it != index_.end()) {
    last_push_[it->second] = pushes_;
    if (by_count_) touches_[it->second] += touches_[it->second] < UINT32_MAX;
    return it->second;
  }
  // A full shard admits nothing new, and its rows and the sightings it
  // remembers (each smaller than a row) stay within its capacity together.
  if (def_.min_count() > 1) {
    auto sighting = sightings_.find(id);
    if (sighting == sightings_.end()) {
      if (!HasRoom(Entry::kSighting)) return Refuse();
      sighting = sightings_.emplace(id, Sighting{0, 0}).first;
    }
    sighting->second.last_push = pushes_;
    if (++sighting->second.count < def_.min_count()) return -1;
    sightings_.erase(sighting);  // its room and its index entry become the row's
    if (!HasRoom(Entry::kRowFromSighting)) {
      sightings_.emplace(id, Sighting{def_.min_count() - 1, pushes_});
      return Refuse();
    }
  } else if (!HasRoom(Entry::kRow)) {
    return Refuse();
  }
  return MakeRow(id);
}

int64_t EmbeddingTable::Refuse() {
  if (refused_++ > 0) return -1;
  if (room_ != nullptr && room_->held() + kIndexEntryBytes + row_storage_bytes_ > room_->limit()) {
    absl::FPrintF(stderr,
                  "shoal: %s cannot admit new ids: the dynamic tables on its task hold %s, all of the %s they "
                  "share (90%% of the memory its variables and fixed tables leave); their gradients are dropped "
                  "and their pulls answered with initial rows. Give the tables max_rows to split the room, add "
                  "ps tasks, set steps_to_live, or let the rows untouched longest make room (evict_when_full)\n",
                  where_, Size(static_cast<double>(room_->held())), Size(static_cast<double>(room_->limit())));
  } else {
    absl::FPrintF(stderr,
                  "shoal: %s is full (%d rows on this shard): new ids are not admitted, their gradients dropped "
                  "and their pulls answered with initial rows; raise max_rows, add ps tasks, set steps_to_live, "
                  "or let the rows untouched longest make room (evict_when_full)\n",
                  where_, capacity_);
  }
  return -1;
}

bool EmbeddingTable::HasRoom(Entry entry) {
  const bool counting_sightings = entry == Entry::kSighting;
  auto fits = [&] {
    const auto held = static_cast<int64_t>(index_.size() + (counting_sightings ? sightings_.size() : 0));
    return held < capacity_ && (room_ == nullptr || room_->Take(SharedBytesOf(entry)));
  };
  if (fits()) return true;
  if (!def_.evict_when_full()) return false;
  // A restore may have left more than the room (rows are never lost to
  // one), and the shared room may be full of other tables' rows: this
  // shard's own untouched rows make room either way.
  while (!fits()) {
    if (!EvictOldest()) return false;
  }
  return true;
}

int64_t EmbeddingTable::SharedBytesOf(Entry entry) const {
  const int64_t storage = free_rows_.empty() ? row_storage_bytes_ : 0;  // a freed row's storage is reused
  if (entry == Entry::kSighting) return kIndexEntryBytes;
  if (entry == Entry::kRowFromSighting) return storage;  // the sighting's index entry becomes the row's
  return kIndexEntryBytes + storage;
}

void EmbeddingTable::GiveIndexEntries(int64_t entries) {
  if (room_ != nullptr) room_->Give(entries * kIndexEntryBytes);
}

int64_t EmbeddingTable::shared_bytes() const {
  if (room_ == nullptr) return 0;
  std::shared_lock<std::shared_mutex> lock(mu_);
  return static_cast<int64_t>(index_.size() + sightings_.size()) * kIndexEntryBytes +
         values_.rows() * row_storage_bytes_;
}

bool EmbeddingTable::EvictOldest() {
  if (nothing_to_evict_at_ == pushes_) return false;  // this push touched every row: no second sweep
  // Rows are walked by index (last_push_ and row_ids_ side by side, a free
  // row marked kFreeRow), not through the id map: a sweep streams through
  // memory instead of chasing a node per row. The candidates are ranked in
  // buckets (no per-row list, which for a large shard would take
  // gigabytes): by age in pushes (lru), or by touch count and, among equal
  // counts, by age (lfu: 32 count classes of 32 age buckets, so that of
  // the rows touched once the oldest go, not the newest). A row or
  // sighting this push touched ranks kBuckets and stays. Then the lowest
  // buckets go.
  constexpr int64_t kBuckets = 1024, kCountClasses = 32;
  const int64_t age_buckets = by_count_ ? kBuckets / kCountClasses : kBuckets;
  int64_t oldest = pushes_;
  for (int64_t last : last_push_) oldest = std::min(oldest, last);
  for (const auto& [id, sighting] : sightings_) oldest = std::min(oldest, sighting.last_push);
  const int64_t width = std::max<int64_t>(1, (pushes_ - oldest + age_buckets - 1) / age_buckets);
  auto rank = [&](int64_t last_push, int64_t count) {
    if (last_push >= pushes_) return kBuckets;
    const int64_t age = (last_push - oldest) / width;
    return by_count_ ? std::min(count, kCountClasses - 1) * age_buckets + age : age;
  };
  auto row_rank = [&](int64_t index) { return rank(last_push_[index], by_count_ ? touches_[index] : 0); };
  std::vector<int64_t> counts(kBuckets + 1, 0);
  for (int64_t index = 0; index < static_cast<int64_t>(last_push_.size()); ++index) ++counts[row_rank(index)];
  for (const auto& [id, sighting] : sightings_) ++counts[rank(sighting.last_push, sighting.count)];
  if (std::all_of(counts.begin(), counts.end() - 1, [](int64_t n) { return n == 0; })) {
    nothing_to_evict_at_ = pushes_;  // only what no push touched since an earlier push may go
    return false;
  }
  // Every bucket before `boundary` goes whole, and of it what the goal still needs.
  const int64_t goal = std::max<int64_t>(1, capacity_ / 64);
  int64_t boundary = 0, below = 0;
  while (boundary < kBuckets - 1 && below + counts[boundary] < goal) below += counts[boundary++];
  int64_t boundary_share = goal - below;
  int64_t gone = 0;
  auto goes = [&](int64_t b) {
    if (b > boundary || (b == boundary && boundary_share == 0)) return false;
    if (b == boundary) --boundary_share;
    ++gone;
    return true;
  };
  for (int64_t index = 0; index < static_cast<int64_t>(last_push_.size()); ++index) {
    if (!goes(row_rank(index))) continue;
    FreeRow(index);
    ++evicted_;
  }
  for (auto it = sightings_.begin(); it != sightings_.end();) {
    if (!goes(rank(it->second.last_push, it->second.count))) {
      ++it;
      continue;
    }
    it = sightings_.erase(it);
    GiveIndexEntries(1);
  }
  if (gone > 0 && !said_evicting_) {
    said_evicting_ = true;
    absl::FPrintF(stderr,
                  "shoal: %s is full (%d rows on this shard): the rows no push has touched %s now make room for "
                  "new ids (evict_when_full)\n",
                  where_, capacity_, by_count_ ? "as often (eviction: lfu)" : "for longest");
  }
  return gone > 0;
}

int64_t EmbeddingTable::MakeRow(int64_t id) {
  int64_t index;
  if (!free_rows_.empty()) {
    index = free_rows_.back();
    free_rows_.pop_back();
  } else {
    index = values_.rows();
    values_.Grow(index + 1);
    for (RowArena& slot : slots_) slot.Grow(index + 1);
    last_push_.push_back(0);
    row_ids_.push_back(0);
    if (by_count_) touches_.push_back(0);
  }
  row_ids_[index] = id;
  if (walking_ && index < walk_end_) made_during_walk_[index] = true;
  InitialRow(def_, id, values_.Row(index));
  const float initial_accumulator = static_cast<float>(def_.optimizer().initial_accumulator_value());
  for (size_t s = 0; s < slots_.size(); ++s) {
    const bool accumulator = rule_ == Rule::kAdagrad || (rule_ == Rule::kFtrl && s == 1);
    std::fill_n(slots_[s].Row(index), dim_, accumulator ? initial_accumulator : 0.0f);
  }
  index_[id] = index;
  last_push_[index] = pushes_;
  if (by_count_) touches_[index] = 1;
  return index;
}

void EmbeddingTable::FreeRow(int64_t index) {
  index_.erase(row_ids_[index]);
  last_push_[index] = kFreeRow;
  free_rows_.push_back(index);
  GiveIndexEntries(1);
}

void EmbeddingTable::Evict() {
  const int64_t ttl = def_.steps_to_live();
  for (int64_t index = 0; index < static_cast<int64_t>(last_push_.size()); ++index) {
    if (pushes_ - last_push_[index] > ttl) FreeRow(index);  // (a free row's mark is in the future)
  }
  for (auto it = sightings_.begin(); it != sightings_.end();) {
    if (pushes_ - it->second.last_push <= ttl) {
      ++it;
      continue;
    }
    it = sightings_.erase(it);
    GiveIndexEntries(1);
  }
}

void EmbeddingTable::ApplyRow(int64_t index, const float* g) {
  const wire::OptimizerConfig& o = def_.optimizer();
  const float lr = static_cast<float>(o.learning_rate());
  float* w = values_.Row(index);
  if (rule_ == Rule::kSgd) {
    for (int64_t j = 0; j < dim_; ++j) w[j] -= lr * g[j];
  } else if (rule_ == Rule::kAdagrad) {
    float* a = slots_[0].Row(index);
    const float eps = static_cast<float>(o.epsilon());
    for (int64_t j = 0; j < dim_; ++j) {
      a[j] += g[j] * g[j];
      w[j] -= lr * g[j] / (std::sqrt(a[j]) + eps);
    }
  } else if (rule_ == Rule::kLazyAdam) {
    float* m = slots_[0].Row(index);
    float* v = slots_[1].Row(index);
    const double b1 = o.beta1(), b2 = o.beta2();
    const float step = static_cast<float>(o.learning_rate() * std::sqrt(1 - std::pow(b2, pushes_)) /
                                          (1 - std::pow(b1, pushes_)));
    const float eps = static_cast<float>(o.epsilon());
    const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
    for (int64_t j = 0; j < dim_; ++j) {
      m[j] = fb1 * m[j] + (1 - fb1) * g[j];
      v[j] = fb2 * v[j] + (1 - fb2) * g[j] * g[j];
      w[j] -= step * m[j] / (std::sqrt(v[j]) + eps);
    }
  } else {  // ftrl
    float* z = slots_[0].Row(index);
    float* n = slots_[1].Row(index);
    const float power = static_cast<float>(-o.learning_rate_power());  // 0.5: sqrt
    const float l1 = static_cast<float>(o.l1()), l2 = static_cast<float>(o.l2());
    for (int64_t j = 0; j < dim_; ++j) {
      const float n_new = n[j] + g[j] * g[j];
      const float root_new = power == 0.5f ? std::sqrt(n_new) : std::pow(n_new, power);
      const float root_old = power == 0.5f ? std::sqrt(n[j]) : std::pow(n[j], power);
      const float sigma = (root_new - root_old) / lr;
      z[j] += g[j] - sigma * w[j];
      n[j] = n_new;
      const float quadratic = root_new / lr + 2 * l2;
      w[j] = std::abs(z[j]) > l1 ? ((z[j] > 0 ? l1 : -l1) - z[j]) / quadratic : 0.0f;
    }
  }
}

absl::StatusOr<int64_t> EmbeddingTable::Push(const torch::Tensor& ids, const torch::Tensor& gradients) {
  if (def_.read_only()) {
    return absl::FailedPreconditionError(absl::StrCat(where_, " is read-only: pushes are refused"));
  }
  torch::Tensor contiguous_ids = ids.defined() ? ids.contiguous() : ids;
  torch::Tensor contiguous_gradients = gradients.defined() ? gradients.contiguous() : gradients;
  absl::Status checked = Check(contiguous_ids, &contiguous_gradients, /*distinct=*/true);
  if (!checked.ok()) return checked;
  const int64_t n = contiguous_ids.size(0);
  const int64_t* id = contiguous_ids.data_ptr<int64_t>();
  const float* g = contiguous_gradients.data_ptr<float>();
  std::unique_lock<std::shared_mutex> lock(mu_);
  ++pushes_;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = dense_ ? Find(id[i]) : FindOrAdmit(id[i]);
    if (index >= 0) ApplyRow(index, g + i * dim_);  // not admitted yet: its gradient is dropped
  }
  // Eviction sweeps the table: every steps_to_live / 4 pushes keeps its cost
  // small per push and a row's life within 1.25 steps_to_live.
  const int64_t ttl = def_.steps_to_live();
  if (def_.rows() == 0 && ttl > 0 && pushes_ % std::max<int64_t>(1, ttl / 4) == 0) Evict();
  return pushes_;
}

SavedRows EmbeddingTable::CopyRows(const std::vector<int64_t>& indexes) const {
  const auto k = static_cast<int64_t>(indexes.size());
  SavedRows saved;
  saved.ids = torch::empty({k}, torch::kInt64);
  saved.values = torch::empty({k, dim_}, torch::kFloat32);
  for (size_t s = 0; s < slots_.size(); ++s) saved.slots.push_back(torch::empty({k, dim_}, torch::kFloat32));
  if (!dense_) {
    saved.ages = torch::empty({k}, torch::kInt64);
    saved.touches = torch::empty({k}, torch::kInt32);
  }
  for (int64_t i = 0; i < k; ++i) {
    const int64_t index = indexes[i];
    saved.ids.data_ptr<int64_t>()[i] = dense_ ? index * def_.num_shards() + def_.shard() : row_ids_[index];
    std::memcpy(saved.values.data_ptr<float>() + i * dim_, values_.Row(index), dim_ * sizeof(float));
    for (size_t s = 0; s < slots_.size(); ++s) {
      std::memcpy(saved.slots[s].data_ptr<float>() + i * dim_, slots_[s].Row(index), dim_ * sizeof(float));
    }
    if (!dense_) {
      saved.ages.data_ptr<int64_t>()[i] = pushes_ - last_push_[index];
      saved.touches.data_ptr<int32_t>()[i] =
          by_count_ ? static_cast<int32_t>(std::min<uint32_t>(touches_[index], INT32_MAX)) : 1;
    }
  }
  return saved;
}

SavedRows EmbeddingTable::CopySightings() const {
  const auto k = static_cast<int64_t>(sightings_.size());
  SavedRows seen;
  seen.ids = torch::empty({k}, torch::kInt64);
  seen.ages = torch::empty({k}, torch::kInt64);
  seen.touches = torch::empty({k}, torch::kInt32);
  int64_t i = 0;
  for (const auto& [id, sighting] : sightings_) {
    seen.ids.data_ptr<int64_t>()[i] = id;
    seen.ages.data_ptr<int64_t>()[i] = pushes_ - sighting.last_push;
    seen.touches.data_ptr<int32_t>()[i] = static_cast<int32_t>(std::min<int64_t>(sighting.count, INT32_MAX));
    ++i;
  }
  return seen;
}

absl::Status EmbeddingTable::ForEachChunk(
    int64_t chunk_rows, const std::function<absl::Status(const SavedRows& rows, int64_t pushes)>& write) const {
  std::lock_guard<std::mutex> one_walk(walk_mu_);
  // Rows are walked by index, which a row keeps while it lives: a dense
  // table's row `index` holds id index * shards + shard; any other's, the
  // id row_ids_ names, unless free. A row made during the walk (at an index
  // past walk_end_, or a freed one made again, marked by MakeRow) is left
  // out: its id may have been written already, from the row it had before.
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    walking_ = true;
    walk_end_ = dense_ ? values_.rows() : static_cast<int64_t>(last_push_.size());
    made_during_walk_.assign(dense_ ? 0 : walk_end_, false);
  }
  absl::Cleanup walk_over = [this] {
    std::unique_lock<std::shared_mutex> lock(mu_);
    walking_ = false;
    made_during_walk_ = {};
  };
  int64_t next = 0;
  bool wrote_any = false;
  std::vector<int64_t> indexes;
  while (true) {
    SavedRows saved;
    int64_t pushes;
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      indexes.clear();
      for (; next < walk_end_ && static_cast<int64_t>(indexes.size()) < chunk_rows; ++next) {
        if (!dense_ && (last_push_[next] == kFreeRow || made_during_walk_[next])) continue;
        indexes.push_back(next);
      }
      // An empty shard writes one empty chunk, so that a restore knows the
      // table and drops rows made since.
      if (indexes.empty() && wrote_any) break;
      saved = CopyRows(indexes);
      pushes = pushes_;
    }
    // Written without the lock: pushes go on meanwhile.
    SHOAL_RETURN_IF_ERROR(write(saved, pushes));
    wrote_any = true;
  }
  if (dense_ || def_.min_count() <= 1) return absl::OkStatus();
  // The sightings, as they are now: a map cannot be walked a chunk at a
  // time between pushes (one may rehash it), so they are copied whole under
  // the lock and written in chunks.
  SavedRows seen;
  int64_t pushes;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    seen = CopySightings();
    pushes = pushes_;
  }
  for (int64_t begin = 0; begin < seen.ids.numel(); begin += chunk_rows) {
    const int64_t k = std::min(chunk_rows, seen.ids.numel() - begin);
    SavedRows part;
    part.ids = seen.ids.narrow(0, begin, k);
    part.ages = seen.ages.narrow(0, begin, k);
    part.touches = seen.touches.narrow(0, begin, k);
    SHOAL_RETURN_IF_ERROR(write(part, pushes));
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckRestore(const wire::TableChunk& chunk, const SavedRows& rows) const {
  const torch::Tensor& ids = rows.ids;
  if (chunk.pushes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": the checkpoint gives the shard ", chunk.pushes(), " pushes (fewer than none)"));
  }
  const bool ages_wrong = rows.ages.defined() &&
                          (rows.ages.lt(0).any().item<bool>() || rows.touches.lt(1).any().item<bool>());
  if (rows.sightings()) {  // no rows: only their ages and counts to check
    if (!rows.ages.defined() || ages_wrong) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": the checkpoint gives a sighting a negative age or count below one, or none"));
    }
    return absl::OkStatus();
  }
  if (chunk.dim() != dim_) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": the checkpoint's rows are ", chunk.dim(),
                                                   " wide, the table's ", dim_, " (model.click.dim changed?)"));
  }
  if (!def_.read_only() &&
      (chunk.optimizer() != def_.optimizer().kind() || chunk.slots() != static_cast<int>(slots_.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": the checkpoint's rows were trained by '",
                                                   chunk.optimizer(), "' (", chunk.slots(), " slots), the table's by '",
                                                   def_.optimizer().kind(), "' (", slots_.size(), ")"));
  }
  if (ages_wrong) {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": the checkpoint gives a row a negative age or no touches"));
  }
  if (def_.rows() > 0) {
    const int64_t* id = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      if (id[i] < 0 || id[i] >= def_.rows()) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": the checkpoint holds id ", id[i],
                                                       ", outside the table's ", def_.rows(), " rows"));
      }
    }
  }
  return absl::OkStatus();
}

bool EmbeddingTable::Restores(int64_t id, const std::vector<int64_t>* only) const {
  return ShardOf(id, def_.num_shards()) == def_.shard() &&
         (only == nullptr || std::binary_search(only->begin(), only->end(), id));
}

int64_t EmbeddingTable::RowsRestoreMakes(const torch::Tensor& ids, const std::vector<int64_t>* only,
                                         bool replacing) const {
  if (dense_) return 0;
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t rows = 0;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (!Restores(id[i], only)) continue;
    if (replacing || Find(id[i]) < 0) ++rows;
  }
  return rows;
}

absl::Status EmbeddingTable::CheckRoomToRestore(int64_t rows, bool replacing) const {
  if (dense_ || def_.read_only()) return absl::OkStatus();  // a read-only copy holds what it is asked for
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t kept = replacing ? 0 : static_cast<int64_t>(index_.size());
  if (kept + rows <= capacity_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      where_, ": the checkpoint brings ", rows, replacing ? " rows to this shard, more" : " new rows to this shard, ",
      replacing ? "" : absl::StrCat("which with the ", kept, " it holds are more"), " than the ", capacity_,
      " it may hold (its share of max_rows, or what fits beside its task's variables and other tables); restore ",
      "onto more ps tasks, or raise max_rows"));
}

int64_t EmbeddingTable::SharedBytesToRestore(int64_t rows, bool replacing) const {
  if (room_ == nullptr) return 0;
  if (!replacing) return rows * shared_bytes_per_row();
  std::shared_lock<std::shared_mutex> lock(mu_);
  const auto entries = static_cast<int64_t>(index_.size() + sightings_.size());
  return (rows - entries) * kIndexEntryBytes + std::max<int64_t>(0, rows - values_.rows()) * row_storage_bytes_;
}

void EmbeddingTable::DropRowsToRestore() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  pushes_ = 0;
  nothing_to_evict_at_ = -1;
  if (dense_) return;  // a fixed table's every row comes back
  for (int64_t index = 0; index < static_cast<int64_t>(last_push_.size()); ++index) {
    if (last_push_[index] != kFreeRow) FreeRow(index);
  }
  GiveIndexEntries(static_cast<int64_t>(sightings_.size()));
  sightings_.clear();
}

int64_t EmbeddingTable::Restore(const wire::TableChunk& chunk, const SavedRows& saved,
                                const std::vector<int64_t>* only) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (saved.sightings()) {
    // An evaluator's chosen ids need rows, not sightings.
    if (only == nullptr && !dense_ && !def_.read_only() && def_.min_count() > 1) RestoreSightings(chunk, saved);
    return 0;
  }
  const int64_t* id = saved.ids.data_ptr<int64_t>();
  const bool with_stats = saved.ages.defined();
  int64_t taken = 0;
  for (int64_t i = 0; i < saved.ids.numel(); ++i) {
    if (!Restores(id[i], only)) continue;
    int64_t index = Find(id[i]);
    if (index < 0) {
      if (room_ != nullptr) room_->Force(SharedBytesOf(Entry::kRow));  // the restore's check pass found room
      index = MakeRow(id[i]);
    }
    std::memcpy(values_.Row(index), saved.values.data_ptr<float>() + i * dim_, dim_ * sizeof(float));
    for (size_t s = 0; s < slots_.size(); ++s) {
      std::memcpy(slots_[s].Row(index), saved.slots[s].data_ptr<float>() + i * dim_, dim_ * sizeof(float));
    }
    if (!dense_) {
      // Ages count back from the push count of the shard that saved them
      // (a file without them: touched by its last push).
      last_push_[index] =
          with_stats ? std::max<int64_t>(0, chunk.pushes() - saved.ages.data_ptr<int64_t>()[i]) : chunk.pushes();
      if (with_stats && by_count_) touches_[index] = static_cast<uint32_t>(saved.touches.data_ptr<int32_t>()[i]);
    }
    ++taken;
  }
  // The push count of the shard the rows came from (another shard's chunk,
  // whose rows all map elsewhere, says nothing of this one's).
  if (taken > 0) pushes_ = std::max(pushes_, chunk.pushes());
  return taken;
}

void EmbeddingTable::RestoreSightings(const wire::TableChunk& chunk, const SavedRows& saved) {
  const int64_t* id = saved.ids.data_ptr<int64_t>();
  const int64_t* age = saved.ages.data_ptr<int64_t>();
  const int32_t* count = saved.touches.data_ptr<int32_t>();
  bool taken = false;
  for (int64_t i = 0; i < saved.ids.numel(); ++i) {
    if (!Restores(id[i], nullptr) || Find(id[i]) >= 0 || sightings_.count(id[i]) > 0) continue;
    // Room as a push would find it, but never made by dropping a row.
    if (static_cast<int64_t>(index_.size() + sightings_.size()) >= capacity_ ||
        (room_ != nullptr && !room_->Take(SharedBytesOf(Entry::kSighting)))) {
      break;
    }
    sightings_.emplace(id[i], Sighting{count[i], std::max<int64_t>(0, chunk.pushes() - age[i])});
    taken = true;
  }
  if (taken) pushes_ = std::max(pushes_, chunk.pushes());
}

int64_t EmbeddingTable::size() const { return occupancy().rows_held; }

EmbeddingTable::Occupancy EmbeddingTable::occupancy() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Occupancy{dense_ ? values_.rows() : static_cast<int64_t>(index_.size()), refused_, evicted_};
}

int64_t EmbeddingTable::refused_admissions() const { return occupancy().ids_refused; }

int64_t EmbeddingTable::evicted_when_full() const { return occupancy().rows_evicted; }

int64_t EmbeddingTable::pushes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return pushes_;
}

int64_t EmbeddingTable::bytes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t total = values_.bytes();
  for (const RowArena& slot : slots_) total += slot.bytes();
  return total;
}

namespace {

// What must match for a table to be the same one: all but the optimizer's
// hyper-parameters, which a restarted chief may have changed. A table asked
// for again with another admission or eviction rule would otherwise keep
// its first one without a word. Defaults compare as the table applies them.
std::string Differs(const wire::TableDef& a, const wire::TableDef& b) {
  if (a.rows() != b.rows()) return absl::StrCat("rows ", a.rows(), " vs ", b.rows());
  if (a.dim() != b.dim()) return absl::StrCat("dim ", a.dim(), " vs ", b.dim());
  if (a.shard() != b.shard() || a.num_shards() != b.num_shards()) {
    return absl::StrCat("shard ", a.shard(), " of ", a.num_shards(), " vs ", b.shard(), " of ", b.num_shards());
  }
  if (a.seed() != b.seed()) return absl::StrCat("seed ", a.seed(), " vs ", b.seed());
  if (a.init_scale() != b.init_scale()) return absl::StrCat("init_scale ", a.init_scale(), " vs ", b.init_scale());
  if (a.optimizer().kind() != b.optimizer().kind()) {
    return absl::StrCat("optimizer ", a.optimizer().kind(), " vs ", b.optimizer().kind());
  }
  if (a.read_only() != b.read_only()) return absl::StrCat("read_only ", a.read_only(), " vs ", b.read_only());
  const auto at_once = [](int64_t min_count) { return std::max<int64_t>(min_count, 1); };
  if (at_once(a.min_count()) != at_once(b.min_count())) {
    return absl::StrCat("min_count ", a.min_count(), " vs ", b.min_count());
  }
  if (a.steps_to_live() != b.steps_to_live()) {
    return absl::StrCat("steps_to_live ", a.steps_to_live(), " vs ", b.steps_to_live());
  }
  if (a.max_rows() != b.max_rows()) return absl::StrCat("max_rows ", a.max_rows(), " vs ", b.max_rows());
  if (a.evict_when_full() != b.evict_when_full()) {
    return absl::StrCat("evict_when_full ", a.evict_when_full(), " vs ", b.evict_when_full());
  }
  const auto policy = [](const std::string& eviction) { return eviction.empty() ? std::string("lru") : eviction; };
  if (policy(a.eviction()) != policy(b.eviction())) {
    return absl::StrCat("eviction ", policy(a.eviction()), " vs ", policy(b.eviction()));
  }
  return "";
}

}  // namespace

absl::StatusOr<std::vector<bool>> TableStore::Create(const std::vector<wire::TableDef>& defs, double other_bytes) {
  std::vector<std::unique_ptr<EmbeddingTable>> made(defs.size());
  std::unique_lock<std::shared_mutex> lock(mu_);
  // What the task holds already, and the tables this request made so far:
  // a fixed table is refused if it does not fit beside them.
  double in_use = other_bytes;
  for (const auto& [name, table] : tables_) in_use += static_cast<double>(table->bytes());
  for (size_t i = 0; i < defs.size(); ++i) {
    auto existing = tables_.find(defs[i].name());
    if (existing != tables_.end()) {
      // Compare with the defaults filled in, as the table holds them.
      wire::TableDef filled = defs[i];
      if (filled.optimizer().kind().empty()) filled.mutable_optimizer()->set_kind("sgd");
      const std::string differs = Differs(existing->second->def(), filled);
      if (!differs.empty()) {
        return absl::AlreadyExistsError(absl::StrCat("table '", defs[i].name(), "' exists on ", task_name_,
                                                     " with another definition: ", differs));
      }
      continue;
    }
    for (size_t j = 0; j < i; ++j) {
      if (defs[j].name() == defs[i].name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", defs[i].name(), "' is defined twice in one request to ", task_name_));
      }
    }
    SHOAL_ASSIGN_OR_RETURN(made[i], EmbeddingTable::Create(defs[i], task_name_, memory_bytes_, in_use, &room_));
    in_use += static_cast<double>(made[i]->bytes());
  }
  std::vector<bool> created(defs.size(), false);
  for (size_t i = 0; i < defs.size(); ++i) {
    if (made[i] == nullptr) continue;
    tables_[defs[i].name()] = std::move(made[i]);
    created[i] = true;
  }
  other_bytes_ = other_bytes;
  SetRoomLimit();
  return created;
}

void TableStore::VariablesHold(double bytes) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  other_bytes_ = bytes;
  SetRoomLimit();
}

absl::Status TableStore::CheckRoomForVariables(double variable_bytes, double new_bytes) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const double tables = FixedTableBytes() + static_cast<double>(room_.held());
  if (variable_bytes + tables + new_bytes <= memory_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "variables on %s: the new ones need %s (values and optimizer slots), which with the %s of variables and %s "
      "of tables this task holds already is more than the %s of memory it may use; spread them over more ps "
      "tasks, or make a large one an embedding table",
      task_name_, Size(new_bytes), Size(variable_bytes), Size(tables), Size(memory_bytes_)));
}

void TableStore::SetRoomLimit() {
  // 90% of what the variables and the fixed (and read-only) tables leave,
  // as a dynamic table's own bound is.
  const double fixed = other_bytes_ + FixedTableBytes();
  room_.set_limit(static_cast<int64_t>(std::max(0.0, std::min(0.9 * (memory_bytes_ - fixed), 9e18))));
}

double TableStore::FixedTableBytes() const {
  double bytes = 0;
  for (const auto& [name, table] : tables_) {
    if (table->shared_bytes_per_row() == 0) bytes += static_cast<double>(table->bytes());
  }
  return bytes;
}

absl::Status TableStore::CheckRoomToRestore(const std::map<EmbeddingTable*, int64_t>& rows, bool replacing) const {
  int64_t shared_bytes = 0;
  for (const auto& [table, made] : rows) {
    SHOAL_RETURN_IF_ERROR(table->CheckRoomToRestore(made, replacing));
    shared_bytes += table->SharedBytesToRestore(made, replacing);
  }
  if (room_.held() + shared_bytes <= room_.limit()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the dynamic tables on ", task_name_, ": the checkpoint's rows need ", Size(static_cast<double>(shared_bytes)),
      " more, which with the ", Size(static_cast<double>(room_.held())), " their rows hold already is more than the ",
      Size(static_cast<double>(room_.limit())),
      " they share (90% of the memory the task's variables and fixed tables leave); restore onto more ps tasks"));
}

std::vector<EmbeddingTable*> TableStore::All() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<EmbeddingTable*> all;
  for (const auto& [name, table] : tables_) all.push_back(table.get());
  return all;
}

absl::StatusOr<EmbeddingTable*> TableStore::Find(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("table '", name, "' not found on ", task_name_));
  return it->second.get();
}

}  // namespace shoal
