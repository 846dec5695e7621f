// shoal::Embedding and shoal::EmbeddingBag (include/shoal/embedding.h):
// ClusterClient's PullRows and PushRows, wired into autograd.
#include "shoal/embedding.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/distinct_ids.h"

namespace shoal {

std::tuple<torch::Tensor, torch::Tensor> UniqueIds(const torch::Tensor& ids) {
  DistinctIds found = FindDistinctIds(ids);
  return {std::move(found.values), std::move(found.inverse)};
}

EmbeddingImpl::EmbeddingImpl(ClusterClient* client, std::string table, std::optional<int64_t> padding_idx)
    : client_(client), table_(std::move(table)), padding_idx_(padding_idx) {
  if (client_ == nullptr) throw Error("INVALID_ARGUMENT", absl::StrCat("shoal::Embedding '", table_, "': no client"));
}

std::string EmbeddingImpl::Where(const char* layer) const { return absl::StrCat("shoal::", layer, " '", table_, "'"); }

EmbeddingImpl::Pulled EmbeddingImpl::Pull(const torch::Tensor& ids, const char* layer) {
  if (!ids.defined() || ids.is_floating_point() || ids.is_complex() || ids.scalar_type() == torch::kBool) {
    throw Error("INVALID_ARGUMENT", absl::StrCat(Where(layer), ": ids must be an integer tensor, not ",
                                                 ids.defined() ? std::string(ids.toString()) : "nothing"));
  }
  const torch::Tensor flat = ids.reshape(-1).to(torch::kInt64);
  torch::Tensor distinct, where;
  if (!padding_idx_) {
    DistinctIds found = FindDistinctIds(flat);
    distinct = found.values;
    where = found.inverse;
  } else {
    const torch::Tensor real = flat != *padding_idx_;
    DistinctIds found = FindDistinctIds(flat.masked_select(real));
    distinct = found.values;
    where = torch::full_like(flat, distinct.size(0));  // padding: the zero row after the pulled ones
    where.masked_scatter_(real, found.inverse);
  }
  // The ids are distinct now: the client need not look for repeats again.
  constexpr ClusterClient::RowIds kDistinct = ClusterClient::RowIds::kDistinct;
  torch::Tensor rows = client_->PullRows(table_, distinct, kDistinct);
  if (torch::GradMode::is_enabled()) {
    rows.requires_grad_();
    ClusterClient* client = client_;
    rows.register_hook([client, table = table_, distinct](const torch::Tensor& gradient) {
      client->PushRows(table, distinct, gradient.contiguous(), kDistinct);
    });
  }
  if (padding_idx_) rows = torch::cat({rows, rows.new_zeros({1, rows.size(1)})});
  return {rows, where};
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  Pulled pulled = Pull(ids, "Embedding");
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(pulled.rows.size(1));
  return pulled.rows.index_select(0, pulled.where).view(shape);
}

void EmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "shoal::Embedding(table=" << table_;
  if (padding_idx_) stream << ", padding_idx=" << *padding_idx_;
  stream << ")";
}

EmbeddingBagImpl::EmbeddingBagImpl(ClusterClient* client, std::string table, BagMode mode,
                                   std::optional<int64_t> padding_idx)
    : EmbeddingImpl(client, std::move(table), padding_idx), mode_(mode) {}

torch::Tensor EmbeddingBagImpl::forward(const torch::Tensor& ids, const torch::Tensor& offsets,
                                        const torch::Tensor& per_sample_weights) {
  if (ids.defined() && (ids.dim() == 2) == offsets.defined()) {
    throw Error("INVALID_ARGUMENT", absl::StrCat(Where("EmbeddingBag"),
                                                 ": give ids [batch, bag], or ids [n] with offsets (got ids of ",
                                                 ids.dim(), " dimensions", offsets.defined() ? " and offsets)" : ")"));
  }
  Pulled pulled = Pull(ids, "EmbeddingBag");
  auto options = torch::nn::functional::EmbeddingBagFuncOptions();
  if (mode_ == BagMode::kSum) options.mode(torch::kSum);  // (the options' own default is mean)
  if (padding_idx_) options.padding_idx(pulled.rows.size(0) - 1);
  if (per_sample_weights.defined()) options.per_sample_weights(per_sample_weights);
  // torch checks the bags (offsets in order and in range, weights shaped as
  // the ids, weights with sum only): its error, as the API's own.
  try {
    if (!offsets.defined()) {
      return torch::nn::functional::embedding_bag(pulled.where.view(ids.sizes()), pulled.rows, options);
    }
    options.offsets(offsets.to(torch::kInt64));
    return torch::nn::functional::embedding_bag(pulled.where, pulled.rows, options);
  } catch (const c10::Error& e) {
    throw Error("INVALID_ARGUMENT", absl::StrCat(Where("EmbeddingBag"), ": ", e.what_without_backtrace()));
  }
}

void EmbeddingBagImpl::pretty_print(std::ostream& stream) const {
  stream << "shoal::EmbeddingBag(table=" << table_ << ", mode=" << (mode_ == BagMode::kSum ? "sum" : "mean");
  if (padding_idx_) stream << ", padding_idx=" << *padding_idx_;
  stream << ")";
}

}  // namespace shoal
