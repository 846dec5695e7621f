// `shoal export`: a checkpoint to files that need no shoal to use.
//
//   model.pt          the trained model as TorchScript (Model::Script): every
//                     kind, a population's fittest member (or the one asked
//                     for), a gated ensemble whole, a click model's dense part;
//   tables/           a click model's embedding tables, for serving: per table
//                     and per shard the ids (int64 [n]) and their rows (float32
//                     [n, width]) as NPY pairs, streamed a chunk at a time
//                     from the checkpoint's table files (a table larger than
//                     memory is exported all the same), and manifest.json
//                     (docs/trained_model.md describes it). The optimizer's slots are
//                     left out.
// Nothing is written until the checkpoint has been read and checked, and
// each file appears whole or not at all (the tables' folder is renamed into
// place once complete).
#ifndef SHOAL_EXPORT_EXPORT_H_
#define SHOAL_EXPORT_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/config/config.h"

namespace shoal {

struct ExportOptions {
  // A checkpoint folder (ckpt-<step>), or a checkpoint directory: its
  // newest complete checkpoint, or with `step` its ckpt-<step>.
  std::string checkpoint;
  int64_t step = -1;
  int member = -1;  // population: the member (-1: the fittest)
  std::string out;  // the model file (its folder must exist)
  std::string tables_dir;  // click models; empty: "tables" beside `out`
};

struct ExportedTable {
  std::string name;
  int64_t width = 0;
  int64_t rows = 0;
  int shards = 0;
};

struct ExportResult {
  std::string checkpoint;  // the folder read
  int64_t step = 0;
  int member = -1;
  std::string model_file;
  std::string tables_dir;  // empty: the model has no tables
  std::vector<ExportedTable> tables;
};

// `config` says what the checkpoint holds (the model, the mode, the worker
// count), as for training. An error names the checkpoint, and the
// variable or file at fault: another model's checkpoint, a damaged shard,
// a member out of range, an output folder that does not exist.
absl::StatusOr<ExportResult> ExportCheckpoint(const JobConfig& config, const ExportOptions& options);

}  // namespace shoal

#endif  // SHOAL_EXPORT_EXPORT_H_
