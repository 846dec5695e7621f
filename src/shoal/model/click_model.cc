#include "shoal/model/click_model.h"

#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/model/script_builder.h"

namespace shoal {

wire::OptimizerConfig DefaultTableOptimizer() {
  wire::OptimizerConfig o;
  o.set_kind("adagrad");
  o.set_learning_rate(0.05);
  // The loss is the batch's mean, so a row's gradient is a batch-size
  // fraction of its examples' sum; from TensorFlow's accumulator of 0.1 a
  // row seen a few times would barely move. From 1e-8 each row's steps
  // are scaled by its own gradients (one pass over 10M generated
  // examples, 1M ids a feature: test AUC 0.7655 at 0.1's best rate, 0.7730;
  // bench/click_accuracy.sh).
  o.set_initial_accumulator_value(1e-8);
  return o;
}

absl::Status ValidateClickConfig(const ClickConfig& config, const std::string& path) {
  if (config.arch != "wide_deep" && config.arch != "dlrm" && config.arch != "torchscript") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.click.arch '", config.arch, "' is unknown; known: wide_deep, dlrm, torchscript"));
  }
  if (config.arch == "torchscript" && path.empty()) {
    return absl::InvalidArgumentError("model.click.arch torchscript needs model.path (the dense part)");
  }
  if (config.pooling != "sum" && config.pooling != "mean") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.click.pooling '", config.pooling, "' is unknown; known: sum, mean"));
  }
  if (config.eviction != "lru" && config.eviction != "lfu") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.click.eviction '", config.eviction, "' is unknown; known: lru, lfu"));
  }
  if (config.eviction == "lfu" && !config.evict_when_full) {
    return absl::InvalidArgumentError("model.click.eviction lfu chooses what a full table evicts: set evict_when_full");
  }
  for (auto [key, value, least] : {std::tuple{"integer_features", config.integer_features, 0},
                                   std::tuple{"categorical_features", config.categorical_features, 1},
                                   std::tuple{"bag_size", config.bag_size, 1}, std::tuple{"rows", config.rows, 0},
                                   std::tuple{"dim", config.dim, 1}, std::tuple{"min_count", config.min_count, 0},
                                   std::tuple{"steps_to_live", config.steps_to_live, 0},
                                   std::tuple{"max_rows", config.max_rows, 0},
                                   std::tuple{"cache_rows", config.cache_rows, 0},
                                   std::tuple{"cache_staleness", config.cache_staleness, 0}}) {
    if (value < least) {
      return absl::InvalidArgumentError(absl::StrCat("model.click.", key, " = ", value, " must be >= ", least));
    }
  }
  if (config.arch == "dlrm" && config.integer_features == 0) {
    return absl::InvalidArgumentError("model.click.arch dlrm needs integer features (its bottom MLP reads them)");
  }
  if (!(config.init_scale >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("model.click.init_scale = ", config.init_scale, " must be >= 0"));
  }
  for (auto [key, layers] : {std::pair{"hidden", &config.hidden}, std::pair{"bottom", &config.bottom}}) {
    for (size_t i = 0; i < layers->size(); ++i) {
      if ((*layers)[i] <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.click.", key, "[", i, "] = ", (*layers)[i], " must be positive"));
      }
    }
  }
  return absl::OkStatus();
}

torch::Tensor ClickDenseFeatures(const torch::Tensor& integers) {
  return torch::log1p(integers.clamp_min(0).to(torch::kFloat32));
}

namespace {

// An MLP of `layers` (ReLU between), its names under `scope`.
std::unique_ptr<Mlp> MakeMlp(std::vector<int64_t> layers, uint64_t seed, const std::string& scope,
                             bool activate_output) {
  MlpConfig mlp;
  mlp.layers = std::move(layers);
  mlp.seed = seed;
  mlp.scope = scope;
  mlp.activate_output = activate_output;
  return std::make_unique<Mlp>(mlp);
}

std::vector<int64_t> Layers(int64_t in, const std::vector<int64_t>& hidden, int64_t out) {
  std::vector<int64_t> layers = {in};
  layers.insert(layers.end(), hidden.begin(), hidden.end());
  layers.push_back(out);
  return layers;
}

}  // namespace

ClickModel::ClickModel(const ClickConfig& config, wire::TableDef table)
    : config_(config),
      bag_(table, config.bag_size, config.pooling == "mean" ? Pooling::kMean : Pooling::kSum,
           config.cache_rows > 0 ? std::make_unique<RowCache>(config.cache_rows, table.dim(), config.cache_staleness)
                                 : nullptr) {}

absl::StatusOr<std::unique_ptr<ClickModel>> ClickModel::Create(const ClickConfig& config, const std::string& path,
                                                               uint64_t seed, const std::string& scope) {
  wire::TableDef table;
  table.set_name(scope + "embeddings");
  table.set_rows(config.rows);
  table.set_dim(config.dim + (config.arch == "wide_deep" ? 1 : 0));  // the wide weight rides in the last column
  table.set_seed(seed);
  table.set_init_scale(config.init_scale);
  *table.mutable_optimizer() = config.optimizer;
  table.set_min_count(config.min_count);
  table.set_steps_to_live(config.steps_to_live);
  table.set_max_rows(config.max_rows);
  table.set_evict_when_full(config.evict_when_full);
  table.set_eviction(config.eviction);
  std::unique_ptr<ClickModel> model(new ClickModel(config, std::move(table)));
  const int64_t integers = config.integer_features, features = config.categorical_features, dim = config.dim;
  auto add = [&model](const std::vector<std::string>& names, const std::vector<torch::Tensor>& params) {
    model->names_.insert(model->names_.end(), names.begin(), names.end());
    model->params_.insert(model->params_.end(), params.begin(), params.end());
  };
  if (config.arch == "wide_deep") {
    torch::NoGradGuard no_grad;
    model->wide_kernel_ = torch::zeros({integers, 1}).requires_grad_(true);
    add({scope + "wide/kernel"}, {model->wide_kernel_});
    model->deep_ = MakeMlp(Layers(features * dim + integers, config.hidden, 1), seed + 1, scope + "deep/", false);
    add(model->deep_->variable_names(), model->deep_->variables());
  } else if (config.arch == "dlrm") {
    model->bottom_ = MakeMlp(Layers(integers, config.bottom, dim), seed + 1, scope + "bottom/", true);
    add(model->bottom_->variable_names(), model->bottom_->variables());
    const int64_t vectors = features + 1;
    model->top_ = MakeMlp(Layers(vectors * (vectors - 1) / 2 + dim, config.hidden, 1), seed + 2, scope + "top/", false);
    add(model->top_->variable_names(), model->top_->variables());
  } else {
    SHOAL_ASSIGN_OR_RETURN(model->dense_, TorchScriptModel::Load(path, scope + "dense/"));
    add(model->dense_->variable_names(), model->dense_->variables());
  }
  return model;
}

const std::vector<std::string>& ClickModel::buffer_names() const {
  return dense_ ? dense_->buffer_names() : Model::buffer_names();
}

const std::vector<torch::Tensor>& ClickModel::buffers() const {
  return dense_ ? dense_->buffers() : Model::buffers();
}

void ClickModel::SetTraining(bool training) {
  if (dense_) dense_->SetTraining(training);
}

absl::StatusOr<torch::Tensor> ClickModel::CategoricalColumns(const torch::Tensor& input) const {
  const int64_t columns = config_.integer_features + config_.categorical_features * config_.bag_size;
  if (input.dim() != 2 || input.scalar_type() != torch::kInt64 || input.size(1) != columns) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the click model takes int64 [N, ", columns, "] (", config_.integer_features, " integer features, then ",
        config_.categorical_features, " categorical features of ", config_.bag_size, " ids each); the batch is ",
        c10::toString(input.scalar_type()), " ", ShapeString(input.sizes())));
  }
  return input.narrow(1, config_.integer_features, columns - config_.integer_features);
}

absl::Status ClickModel::Pull(const torch::Tensor& input) {
  SHOAL_ASSIGN_OR_RETURN(const torch::Tensor ids, CategoricalColumns(input));
  if (client_ == nullptr) return absl::FailedPreconditionError("the click model's tables have no client (Bind)");
  SHOAL_RETURN_IF_ERROR(bag_.Pull(*client_, ids));
  pulled_input_ = input;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<torch::Tensor>> ClickModel::TableIds(const torch::Tensor& input) const {
  SHOAL_ASSIGN_OR_RETURN(const torch::Tensor ids, CategoricalColumns(input));
  SHOAL_ASSIGN_OR_RETURN(torch::Tensor keys, bag_.DistinctKeys(ids));
  return std::vector<torch::Tensor>{std::move(keys)};
}

absl::Status ClickModel::Push(const wire::DataProgress* progress, wire::ProgressAnswer* answer) {
  if (client_ == nullptr) return absl::FailedPreconditionError("the click model's tables have no client (Bind)");
  return bag_.Push(*client_, progress, answer);
}

RowTables::CacheStats ClickModel::cache_stats() const {
  const RowCache* cache = bag_.cache();
  return cache == nullptr ? CacheStats{} : CacheStats{cache->lookups(), cache->hits()};
}

torch::Tensor ClickModel::Forward(const torch::Tensor& input) {
  if (!pulled_input_.defined() || !input.is_same(pulled_input_)) {
    throw std::logic_error("ClickModel::Forward: the batch's rows were not pulled (RowTables::Pull first)");
  }
  const int64_t n = input.size(0), dim = config_.dim;
  const torch::Tensor dense = ClickDenseFeatures(input.narrow(1, 0, config_.integer_features));
  const torch::Tensor pooled = bag_.Pooled();  // [N, features, dim (+ 1)]
  if (config_.arch == "wide_deep") {
    const torch::Tensor embeddings = pooled.narrow(2, 0, dim).reshape({n, -1});
    const torch::Tensor wide = pooled.select(2, dim).sum(1) + torch::mm(dense, wide_kernel_).view({n});
    return wide + deep_->Forward(torch::cat({embeddings, dense}, 1)).view({n});
  }
  if (config_.arch == "dlrm") {
    const torch::Tensor bottom = bottom_->Forward(dense);                        // [N, dim]
    const torch::Tensor vectors = torch::cat({bottom.unsqueeze(1), pooled}, 1);  // [N, F + 1, dim]
    const torch::Tensor dots = torch::bmm(vectors, vectors.transpose(1, 2));     // [N, F + 1, F + 1]
    const int64_t count = vectors.size(1);
    const torch::Tensor pairs = torch::tril_indices(count, count, -1);
    const torch::Tensor interactions = dots.index({torch::indexing::Slice(), pairs[0], pairs[1]});
    return top_->Forward(torch::cat({bottom, interactions}, 1)).view({n});
  }
  return dense_->Forward(torch::cat({pooled.reshape({n, -1}), dense}, 1)).reshape({n});
}

absl::StatusOr<torch::jit::Module> ClickModel::Script() const {
  ScriptBuilder builder("ClickDense");
  std::string source = absl::StrCat(
      "def forward(self, integers: Tensor, pooled: Tensor) -> Tensor:\n", "    n = pooled.size(0)\n",
      "    dense = torch.log1p(integers.clamp_min(0).float())\n");
  auto add_mlp = [&builder](const char* name, const Mlp& mlp) -> absl::Status {
    SHOAL_ASSIGN_OR_RETURN(torch::jit::Module scripted, mlp.Script());
    builder.AddModule(name, scripted);
    return absl::OkStatus();
  };
  const int64_t dim = config_.dim;
  if (config_.arch == "wide_deep") {
    const std::string wide = builder.AddParameter("wide/kernel", wide_kernel_);
    SHOAL_RETURN_IF_ERROR(add_mlp("deep", *deep_));
    absl::StrAppend(&source, "    embeddings = pooled.narrow(2, 0, ", dim, ").reshape([n, -1])\n",
                    "    wide = pooled.select(2, ", dim, ").sum(1) + torch.mm(dense, self.", wide, ").view([n])\n",
                    "    return wide + self.deep.forward(torch.cat([embeddings, dense], 1)).view([n])\n");
  } else if (config_.arch == "dlrm") {
    SHOAL_RETURN_IF_ERROR(add_mlp("bottom", *bottom_));
    SHOAL_RETURN_IF_ERROR(add_mlp("top", *top_));
    const int64_t count = config_.categorical_features + 1;
    absl::StrAppend(&source, "    bottom = self.bottom.forward(dense)\n",
                    "    vectors = torch.cat([bottom.unsqueeze(1), pooled], 1)\n",
                    "    dots = torch.bmm(vectors, vectors.transpose(1, 2))\n", "    pairs = torch.tril_indices(",
                    count, ", ", count, ", -1)\n", "    interactions = dots[:, pairs[0], pairs[1]]\n",
                    "    return self.top.forward(torch.cat([bottom, interactions], 1)).view([n])\n");
  } else {
    SHOAL_ASSIGN_OR_RETURN(torch::jit::Module dense, dense_->Script());
    builder.AddModule("dense", dense);
    absl::StrAppend(&source, "    return self.dense.forward(torch.cat([pooled.reshape([n, -1]), dense], 1)).reshape([n])\n");
  }
  return builder.Finish(source);
}

}  // namespace shoal
