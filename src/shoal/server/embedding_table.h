// EmbeddingTable: one ps task's shard of a row-sparse variable, pulled and
// pushed by row id (recommendation models' embedding tables).
//
// A table of `dim` columns is split by row over `num_shards` ps tasks: row
// `id` lives on shard `id mod num_shards` (ids below zero wrap the same
// way). A fixed table has `rows` rows and takes ids in [0, rows); a dynamic
// table (rows = 0) takes any int64 id and makes a row when a gradient first
// reaches it (after `min_count` sightings), dropping rows that no push has
// touched for `steps_to_live` pushes. A dynamic shard holds at most its
// share of `max_rows`, and the task's dynamic tables together hold no more
// rows (and sightings) than fit in 90% of the memory its variables and
// fixed tables leave (SharedRowRoom): a full shard admits no new id (its
// gradients are dropped, its pulls answered with its initial row) and says
// so once on stderr, so an unbounded id space ends as refused ids, not as a
// ps killed for memory.
// With `evict_when_full` it makes room instead: the rows and sightings no
// push has touched for longest go, 1/64 of the shard's room at a time (so
// the sweep's cost is spread over as many admissions), as a cache of the
// recently active ids would; the rows the current push touched stay.
//
// Rows start from the seed, not from the wire: row `id` starts uniform in
// [-init_scale, init_scale], drawn from (seed, id) alone, so every shard
// count gives the same table and nothing ships the whole table. A pull of a
// row a dynamic table does not hold answers that initial value and makes
// nothing: pulls never allocate.
//
// Optimizers, per touched row only (the sparse forms):
//   sgd        w -= lr g
//   adagrad    a += g^2; w -= lr g / (sqrt(a) + epsilon)        (TensorFlow's,
//              initial_accumulator_value 0.1, epsilon 1e-7)
//   lazy_adam  m, v of the touched rows only, bias-corrected by the table's
//              push count (TensorFlow Addons' LazyAdam)
//   ftrl       FTRL-Proximal as TensorFlow's ApplyFtrl: z, n per element,
//              l1, l2, learning_rate_power (-0.5), initial n 0.1
//
// Every request is validated whole (dtypes, shapes, ids in range and on
// this shard, distinct ids, finite gradients) before anything changes; an
// error names the table, the task and the first bad id.
//
// Thread safety: all methods may be called concurrently. Pushes to one
// table shard are serialised (rows of different pushes interleave by push,
// as asynchronous training's do); pulls run beside each other and wait for
// a push in progress.
#ifndef SHOAL_SERVER_EMBEDDING_TABLE_H_
#define SHOAL_SERVER_EMBEDDING_TABLE_H_

#include <torch/types.h>

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/wire.pb.h"

namespace shoal {

// Rows of `dim` floats in chunks, so that a table grows without copying
// what it holds and holds no more than it uses (plus one chunk). Chunks are
// mapped pages of their own, not the allocator's: a table is most of a ps
// task's memory and lives as long as the task, so its rows must not share
// (and pin) the heaps that requests' short-lived buffers come and go in.
class RowArena {
 public:
  explicit RowArena(int64_t dim, float fill = 0) : dim_(dim), fill_(fill) {}
  // Makes room for rows [0, rows), each new row set to `fill`. Never
  // shrinks: a smaller `rows` changes nothing.
  void Grow(int64_t rows);
  int64_t rows() const { return rows_; }
  float* Row(int64_t index) { return chunks_[index / kChunkRows].get() + (index % kChunkRows) * dim_; }
  const float* Row(int64_t index) const {
    return chunks_[index / kChunkRows].get() + (index % kChunkRows) * dim_;
  }
  int64_t bytes() const { return static_cast<int64_t>(chunks_.size()) * kChunkRows * dim_ * 4; }

 private:
  struct Unmap {
    size_t bytes;
    void operator()(float* chunk) const;
  };
  using Chunk = std::unique_ptr<float[], Unmap>;
  Chunk NewChunk() const;

  static constexpr int64_t kChunkRows = 1 << 14;
  int64_t dim_;
  float fill_;
  int64_t rows_ = 0;
  std::vector<Chunk> chunks_;
};

// The memory a task's dynamic tables share: 90% of what its variables and
// fixed tables leave. A table takes a row's storage when its arenas grow
// (and keeps it: a freed row's storage waits for the table's next id), and
// an index entry for each row or sighting it holds (given back when one
// goes), so that tables without max_rows cannot together promise more
// memory than the task has. Thread-safe.
class SharedRowRoom {
 public:
  // Takes `bytes` if they fit under the limit; if not, takes nothing.
  bool Take(int64_t bytes);
  // Takes `bytes` whatever the limit (a restore whose room was checked).
  void Force(int64_t bytes) { held_ += bytes; }
  void Give(int64_t bytes) { held_ -= bytes; }
  void set_limit(int64_t bytes) { limit_ = bytes; }
  int64_t held() const { return held_; }
  int64_t limit() const { return limit_; }

 private:
  std::atomic<int64_t> held_{0};
  std::atomic<int64_t> limit_{std::numeric_limits<int64_t>::max()};
};

// A run of a shard's rows, as a checkpoint saves and restores them.
struct SavedRows {
  torch::Tensor ids;                 // int64 [k]
  torch::Tensor values;              // float32 [k, dim]
  std::vector<torch::Tensor> slots;  // float32 [k, dim] each
  // Dynamic tables: for each row, the shard's pushes since one last touched
  // it (int64 [k]) and how many pushes touched it (int32 [k]; 1 where the
  // table does not count them), so that a restored table expires and
  // evicts as the saved one would. Undefined for a fixed table, and in
  // checkpoints written before they were kept.
  torch::Tensor ages, touches;
  // Without values (undefined) the run is a dynamic table's sightings: ids
  // pushed fewer than min_count times, each with its age and count (in
  // `touches`), and no row or slot.
  bool sightings() const { return !values.defined(); }
};

class EmbeddingTable {
 public:
  // A dynamic table's id index entry (a hash-map node and its bucket), which
  // a row and a sighting each take.
  static constexpr int64_t kIndexEntryBytes = 48;

  // The memory a task's tables may take: its host's, or its cgroup's limit.
  static double UsableMemoryBytes();

  // Validates `def` (errors name the table and the field) and fills in the
  // optimizer's defaults. A fixed table's rows are made here, from the seed,
  // if they fit in `memory_bytes` (0: UsableMemoryBytes()) beside the
  // `memory_in_use` the task holds already (other tables, variables). A
  // dynamic table may hold as many rows as fit in 90% of what is left then
  // (or its share of max_rows, if fewer), and with `room` its rows and
  // sightings also take their bytes from the room its task's dynamic tables
  // share.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(const wire::TableDef& def,
                                                                const std::string& task_name,
                                                                double memory_bytes = 0, double memory_in_use = 0,
                                                                SharedRowRoom* room = nullptr);

  // rows [n, dim] float32: the current value of each id in `ids` (int64 [n]).
  absl::StatusOr<torch::Tensor> Pull(const torch::Tensor& ids) const;

  // Applies `gradients` ([n, dim] float32, finite) to the rows of `ids`
  // (int64 [n], distinct) with the table's optimizer. Returns the table's
  // push count after this one. A read-only table refuses (FailedPrecondition).
  absl::StatusOr<int64_t> Push(const torch::Tensor& ids, const torch::Tensor& gradients);

  // Checkpoints (server/table_checkpoint.h). The rows this shard held when
  // the walk began, `chunk_rows` at a time, to `write` with the shard's push
  // count when the chunk was copied (at most one chunk in memory; an empty
  // shard: one empty chunk). Only the copy holds the table's lock, not
  // `write`, so pushes go on between chunks and wait at most one chunk's
  // copy: as TensorFlow's saver reads variables that training updates, each
  // row is one push's state and rows of later chunks may be later pushes'.
  // Rows made during the walk are left out and rows dropped are skipped, so
  // no id comes twice even where an id is dropped and made again. Then,
  // for a table with min_count, its sightings (SavedRows::sightings: copied
  // whole, 20 bytes each, then written a chunk at a time) so that a
  // restore does not make their ids start counting again. One walk at a
  // time; stops at `write`'s first error.
  absl::Status ForEachChunk(int64_t chunk_rows,
                            const std::function<absl::Status(const SavedRows& rows, int64_t pushes)>& write) const;
  // Whether a checkpoint chunk of this table could be restored here: its
  // rows as wide and its slots those of this optimizer (any optimizer's,
  // for a read-only table, which leaves the slots), every id inside a
  // fixed table (InvalidArgument naming the table, the file's figure and
  // the table's). Changes nothing.
  absl::Status CheckRestore(const wire::TableChunk& chunk, const SavedRows& rows) const;
  // A restore either replaces a shard's rows (the whole checkpoint: the
  // table goes back to it, DropRowsToRestore first) or adds some (`only`:
  // an evaluator's chosen ids). The rows it makes for `ids`: every id of
  // this shard when replacing; else those of `only` it does not hold yet.
  int64_t RowsRestoreMakes(const torch::Tensor& ids, const std::vector<int64_t>* only, bool replacing) const;
  // Whether a dynamic table has room for the `rows` a restore makes under
  // its bound (beside the rows it holds, unless replacing them):
  // ResourceExhausted naming the table and the figures if not.
  absl::Status CheckRoomToRestore(int64_t rows, bool replacing) const;
  // How much more of the shared room the table holds once a restore made
  // `rows` rows (negative: less): each takes an index entry, and storage
  // beyond what the table's arenas hold already if replacing (the rows it
  // drops leave theirs), or at most its own storage if not.
  int64_t SharedBytesToRestore(int64_t rows, bool replacing) const;
  // Before a restore that replaces the rows: drops every row and sighting
  // of a dynamic shard (their storage stays, for the rows restored) and the
  // push count, which the checkpoint's chunks set again.
  void DropRowsToRestore();
  // What a new row takes from its task's SharedRowRoom at most (0: the
  // table takes nothing from it: a fixed or read-only table).
  int64_t shared_bytes_per_row() const { return room_ == nullptr ? 0 : kIndexEntryBytes + row_storage_bytes_; }
  // What it holds of the shared room, counted from its rows, sightings and
  // arenas (the room counts it as they change).
  int64_t shared_bytes() const;
  // Sets the rows and slots of the chunk's ids that map to this shard
  // (others are left to their own shards), making a dynamic or read-only
  // table's rows; with `only` (sorted), of those ids alone. The push count
  // becomes at least that of a chunk that brought rows here, and each row's
  // age and touch count are the saved ones (without them: touched once, by
  // the chunk's last push). CheckRestore first. Returns the rows set.
  // A chunk of sightings (restored whole only, and only to a dynamic table
  // with min_count) sets none: each id without a row or sighting here is
  // remembered as seen its saved count of times, while the shard has room
  // for it (a sighting never takes a row's room; the rest are forgotten).
  int64_t Restore(const wire::TableChunk& chunk, const SavedRows& rows, const std::vector<int64_t>* only = nullptr);

  const wire::TableDef& def() const { return def_; }
  // Rows held (a fixed table: all of its shard).
  int64_t size() const;
  int64_t pushes() const;
  // Dynamic tables: new ids a full shard did not admit (max_rows).
  int64_t refused_admissions() const;
  // Dynamic tables with evict_when_full: rows dropped to make room.
  int64_t evicted_when_full() const;
  // The three at one moment (a pull's answer carries them).
  struct Occupancy {
    int64_t rows_held = 0;
    int64_t ids_refused = 0;
    int64_t rows_evicted = 0;
  };
  Occupancy occupancy() const;
  // Bytes of row and slot storage held.
  int64_t bytes() const;

  // The value every row `id` starts from.
  static void InitialRow(const wire::TableDef& def, int64_t id, float* row);

  // `capacity`: the rows a dynamic table's shard may hold; `room`: the
  // memory it shares with its task's other dynamic tables (or nullptr).
  EmbeddingTable(wire::TableDef def, std::string task_name, int64_t capacity, SharedRowRoom* room = nullptr);

 private:
  // Where `id`'s row lives: its index in the arenas, or -1 (not held).
  int64_t Find(int64_t id) const;
  // Validates ids (and gradients, if given) whole; names the first bad one.
  absl::Status Check(const torch::Tensor& ids, const torch::Tensor* gradients, bool distinct) const;
  // Dynamic tables: the row for `id`, made if admitted now; -1 if not yet.
  int64_t FindOrAdmit(int64_t id);
  // Tables that are not dense: a new row for `id` (not yet held), from its
  // initial value.
  // Whether a restore sets `id` here: it maps to this shard, and `only`
  // (sorted), if given, lists it.
  bool Restores(int64_t id, const std::vector<int64_t>* only) const;
  int64_t MakeRow(int64_t id);
  // A new id a full shard does not admit: counted, said once on stderr; -1.
  int64_t Refuse();
  // What a dynamic table makes for a new id: a sighting (below min_count),
  // a row in place of its sighting, or a row.
  enum class Entry { kSighting, kRowFromSighting, kRow };
  // Dynamic tables: whether the shard has room for `entry` (rows and
  // sightings count against its capacity together when it is a sighting,
  // rows alone otherwise) and the shared room for its bytes, which it then
  // takes; made with evict_when_full by EvictOldest.
  bool HasRoom(Entry entry);
  // What `entry` takes from the shared room: an index entry, and row
  // storage unless a freed row's is there to reuse.
  int64_t SharedBytesOf(Entry entry) const;
  // evict_when_full: drops the rows and sightings untouched longest, about
  // capacity_ / 64 of them; none this push touched. False if none could go.
  bool EvictOldest();
  // Dynamic tables: drops rows (and sightings) untouched for steps_to_live pushes.
  void Evict();
  // A checkpoint's copies (mu_ held): the rows at `indexes`, with their ages
  // and touch counts if dynamic; every sighting, with its age and count.
  SavedRows CopyRows(const std::vector<int64_t>& indexes) const;
  SavedRows CopySightings() const;
  // Restore's part for a chunk of sightings (lock held).
  void RestoreSightings(const wire::TableChunk& chunk, const SavedRows& saved);
  // Forgets row `index`'s id and makes it free for the next new id.
  void FreeRow(int64_t index);
  // Gives `entries` rows' or sightings' index entries back to the shared room.
  void GiveIndexEntries(int64_t entries);
  void ApplyRow(int64_t index, const float* gradient);

  // The optimizer, resolved once from def_.optimizer().kind() (not per row).
  enum class Rule { kSgd, kAdagrad, kLazyAdam, kFtrl };
  static Rule RuleOf(const std::string& kind);

  const wire::TableDef def_;
  // Rows at index id / shards, all made at creation: a fixed table that is
  // not read-only. Otherwise rows are made as ids come (a dynamic table's
  // pushes, a read-only table's restore) and found through `index_`.
  const bool dense_;
  const Rule rule_;
  const std::string where_;  // "table 'name' on /job:ps/task:0"
  const int64_t dim_;
  const int64_t capacity_;  // dynamic tables: the rows this shard may hold
  SharedRowRoom* const room_;  // dynamic tables' shared memory, or nullptr
  const int64_t row_storage_bytes_;  // a row's values, slots, last push and id
  const bool by_count_;  // eviction: lfu
  mutable std::shared_mutex mu_;  // pushes exclusive; pulls shared
  RowArena values_;
  std::vector<RowArena> slots_;  // adagrad: accumulator; lazy_adam: m, v; ftrl: z, n
  int64_t pushes_ = 0;
  int64_t refused_ = 0;
  int64_t evicted_ = 0;
  bool said_evicting_ = false;
  int64_t nothing_to_evict_at_ = -1;  // the push whose rows were all touched by it
  // Tables that are not dense only.
  std::unordered_map<int64_t, int64_t> index_;  // id -> row index
  std::vector<int64_t> free_rows_;
  // Per row index: the push that last touched it (kFreeRow: a free row),
  // and its id.
  static constexpr int64_t kFreeRow = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> last_push_;
  std::vector<int64_t> row_ids_;
  std::vector<uint32_t> touches_;  // eviction lfu only: the pushes that touched each row
  // A checkpoint's walk (ForEachChunk): one at a time, and while it runs,
  // which of the rows it may still reach (those below walk_end_) were made
  // since it began, to be left out. Not the table's state, hence mutable.
  mutable std::mutex walk_mu_;
  mutable bool walking_ = false;
  mutable int64_t walk_end_ = 0;
  mutable std::vector<bool> made_during_walk_;
  struct Sighting {
    int64_t count;
    int64_t last_push;
  };
  std::unordered_map<int64_t, Sighting> sightings_;  // ids seen, not admitted yet
};

// The tables one task hosts. Thread-safe; tables are never dropped.
class TableStore {
 public:
  // `memory_bytes`: what its tables may take together (0: the task's
  // usable memory, EmbeddingTable::UsableMemoryBytes()).
  explicit TableStore(std::string task_name, double memory_bytes = 0)
      : task_name_(std::move(task_name)),
        memory_bytes_(memory_bytes > 0 ? memory_bytes : EmbeddingTable::UsableMemoryBytes()) {}

  // Creates each table. One that exists with the same definition is left
  // alone (created=false), so a restarted chief does not reset training; a
  // different definition is AlreadyExists naming what differs. All or
  // nothing: every definition is checked first. A fixed table must fit
  // beside the tables held and `other_bytes` (the task's variables), and a
  // dynamic table's bound leaves them their room. Several dynamic tables
  // without max_rows each count only the rows the others hold when it is
  // made, but together they stay within the room they share (SharedRowRoom,
  // 90% of what `other_bytes` and the fixed tables leave): give them
  // max_rows to split it between them.
  absl::StatusOr<std::vector<bool>> Create(const std::vector<wire::TableDef>& defs, double other_bytes = 0);
  // The task's variables now hold `bytes` (values and slots): the dynamic
  // tables' shared room leaves them that much. Rows held already stay; a
  // room now smaller than they are admits no new row until some go.
  void VariablesHold(double bytes);
  // Whether variables of `new_bytes` (values and slots) fit in the task's
  // memory beside the `variable_bytes` it holds and its tables (fixed ones,
  // and the dynamic ones' shared room as far as it is held):
  // ResourceExhausted naming the figures if not.
  absl::Status CheckRoomForVariables(double variable_bytes, double new_bytes) const;
  // Whether the tables have room for the rows a restore would make
  // (`rows` per table; EmbeddingTable::RowsRestoreMakes): each under its
  // own bound, and the dynamic ones together in the room they share.
  // ResourceExhausted naming the figures.
  absl::Status CheckRoomToRestore(const std::map<EmbeddingTable*, int64_t>& rows, bool replacing) const;

  // The table `name`, or NotFound naming it and this task.
  absl::StatusOr<EmbeddingTable*> Find(const std::string& name) const;
  // Every table, by name.
  std::vector<EmbeddingTable*> All() const;
  // The room its dynamic tables share.
  const SharedRowRoom& shared_room() const { return room_; }
  // Held by a save or restore of the tables (server/table_checkpoint.h) for
  // its whole length, so that one never walks a table the other is
  // replacing.
  std::unique_lock<std::mutex> LockForCheckpoint() const { return std::unique_lock<std::mutex>(checkpoint_mu_); }

 private:
  // Sets room_'s limit from other_bytes_ and the fixed tables (mu_ held).
  void SetRoomLimit();
  // What the tables outside the shared room hold: fixed and read-only ones (mu_ held).
  double FixedTableBytes() const;

  const std::string task_name_;
  const double memory_bytes_;  // resolved: never 0
  SharedRowRoom room_;
  mutable std::shared_mutex mu_;
  mutable std::mutex checkpoint_mu_;
  double other_bytes_ = 0;  // the variables' bytes, as last told
  std::map<std::string, std::unique_ptr<EmbeddingTable>> tables_;
};

}  // namespace shoal

#endif  // SHOAL_SERVER_EMBEDDING_TABLE_H_
