// libFuzzer target: a ps task's request handler (server/variable_service.h)
// on hostile requests, as they come off any transport once decoded: any
// header, with tensors of any dtype and shape. The server holds two dense
// variables (Adam and SGD), a counter, a fixed Adagrad table and a dynamic
// LazyAdam one. Every request must be answered (an error or a result), never
// crash, hang or allocate what its bytes do not bound; and a request that
// is refused must change nothing: the variables' values, versions and slots,
// the counter and the tables are compared before and after. An exception,
// which the handler answers as INTERNAL to keep the ps up, counts as a crash.
//
// Input: a u16 (little-endian) header length, the header (a serialized
// wire::RequestHeader), then tensors, each a dtype byte (0 float32, 1 int64,
// 2 float64), a rank byte (mod 4), a byte per dimension (mod 9), and its
// values' bytes (missing ones are zero).
//
//   fuzz/run.sh builds and runs it; `--write_seeds=DIR` writes a valid
//   request of each kind to start from.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "fuzz_support.h"
#include "shoal/core/crc32c.h"
#include "shoal/server/variable_service.h"

namespace {

using shoal::wire::RequestHeader;

shoal::VariableService& Service() {
  static shoal::VariableService* service = [] {
    shoal::VariableServiceOptions options{"/job:ps/task:0"};
    options.max_message_bytes = 1 << 20;
    auto* s = new shoal::VariableService(options);
    RequestHeader create;
    auto add = [&](const char* name, const char* kind, std::vector<int64_t> shape) {
      auto* v = create.mutable_create_variables()->add_variables();
      v->set_name(name);
      for (int64_t d : shape) v->add_shape(d);
      v->mutable_optimizer()->set_kind(kind);
      v->mutable_optimizer()->set_learning_rate(0.1);
    };
    add("w", "adam", {3, 2});
    add("b", "sgd", {2});
    shoal::Request request;
    request.header = create;
    request.tensors = {torch::ones({3, 2}), torch::zeros({2})};
    shoal::Response response;
    s->Handle(request, &response);
    if (response.header.status_code() != 0) {
      std::fprintf(stderr, "%s\n", response.header.status_message().c_str());
      std::abort();
    }
    s->store().AddToCounter("global_step", 5);
    if (!s->tables().Create(shoal::fuzz::TwoTables()).ok()) std::abort();
    return s;
  }();
  return *service;
}

// What a refused request must leave as it was.
std::vector<uint64_t> Fingerprint() {
  shoal::VariableService& service = Service();
  uint32_t crc = 0;
  auto add = [&](const torch::Tensor& t) {
    const torch::Tensor c = t.contiguous();
    crc = shoal::Crc32c(c.data_ptr(), c.nbytes(), crc);
  };
  std::vector<uint64_t> prints;
  std::vector<torch::Tensor> values;
  std::vector<int64_t> versions;
  if (!service.store().Read({"w", "b"}, &values, &versions).ok()) std::abort();
  for (const auto& v : values) add(v);
  prints.insert(prints.end(), versions.begin(), versions.end());
  std::vector<shoal::OptimizerSlots> slots;
  if (!service.store().ReadSlots({"w", "b"}, &slots).ok()) std::abort();
  for (const auto& s : slots) {
    for (const auto& t : s.tensors) add(t);
    prints.push_back(static_cast<uint64_t>(s.step));
  }
  prints.push_back(static_cast<uint64_t>(service.store().AddToCounter("global_step", 0)));
  shoal::fuzz::AddTablesFingerprint(service.tables(), &prints);
  prints.push_back(crc);
  return prints;
}

// Reads the input front to back; past its end, zeros.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  void Bytes(void* out, size_t n) {
    if (n == 0) return;  // an empty tensor's data may be null
    const size_t have = at_ < size_ ? std::min(n, size_ - at_) : 0;
    std::memcpy(out, data_ + at_, have);
    std::memset(static_cast<char*>(out) + have, 0, n - have);
    at_ += have;
  }
  std::string String(size_t n) {
    std::string s(n, '\0');
    Bytes(s.data(), n);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_, at_ = 0;
};

std::vector<torch::Tensor> ReadTensors(Reader& in) {
  std::vector<torch::Tensor> tensors;
  while (!in.done() && tensors.size() < 8) {
    const uint8_t kind = in.Byte() % 3;
    const int rank = in.Byte() % 4;
    std::vector<int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(in.Byte() % 9);
    const auto dtype = kind == 0 ? torch::kFloat32 : kind == 1 ? torch::kInt64 : torch::kFloat64;
    torch::Tensor t = torch::empty(shape, dtype);
    in.Bytes(t.data_ptr(), t.nbytes());
    tensors.push_back(t);
  }
  return tensors;
}

// One seed: a header and tensors as the input format has them.
std::string Seed(const RequestHeader& header, const std::vector<torch::Tensor>& tensors) {
  std::string bytes = header.SerializeAsString();
  std::string out;
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>(bytes.size() >> 8));
  out += bytes;
  for (const torch::Tensor& t : tensors) {
    out.push_back(t.scalar_type() == torch::kFloat32 ? 0 : t.scalar_type() == torch::kInt64 ? 1 : 2);
    out.push_back(static_cast<char>(t.dim()));
    for (int64_t d : t.sizes()) out.push_back(static_cast<char>(d));
    out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return out;
}

void WriteSeeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::pair<RequestHeader, std::vector<torch::Tensor>>> seeds;
  RequestHeader h;
  h.mutable_read()->add_names("w");
  seeds.push_back({h, {}});
  h.Clear();
  h.mutable_apply_gradients()->add_names("w");
  h.mutable_apply_gradients()->set_read_after(true);
  h.set_client_id(7);
  h.set_request_id(1);
  seeds.push_back({h, {torch::full({3, 2}, 0.5f)}});
  h.Clear();
  h.mutable_assign()->add_names("b");
  seeds.push_back({h, {torch::ones({2})}});
  h.Clear();
  h.mutable_counter()->mutable_counter()->set_name("global_step");
  h.mutable_counter()->mutable_counter()->set_delta(1);
  seeds.push_back({h, {}});
  h.Clear();
  h.mutable_pull_rows()->set_table("emb");
  seeds.push_back({h, {torch::tensor({0, 2, 998}, torch::kInt64)}});
  h.Clear();
  h.mutable_push_rows()->set_table("dyn");
  seeds.push_back({h, {torch::tensor({2, 4}, torch::kInt64), torch::ones({2, 2})}});
  h.Clear();
  h.mutable_push_rows()->set_table("emb");
  seeds.push_back({h, {torch::tensor({0, 6}, torch::kInt64), torch::ones({2, 4})}});
  h.Clear();
  auto* table = h.mutable_create_tables()->add_tables();
  table->set_name("t2");
  table->set_rows(50);
  table->set_dim(3);
  table->set_num_shards(1);
  table->mutable_optimizer()->set_kind("ftrl");
  seeds.push_back({h, {}});
  h.Clear();
  h.mutable_read_slots()->add_names("w");
  seeds.push_back({h, {}});
  h.Clear();
  h.mutable_assign_slots()->add_names("w");
  h.mutable_assign_slots()->add_counts(2);
  h.mutable_assign_slots()->add_steps(3);
  seeds.push_back({h, {torch::zeros({3, 2}), torch::zeros({3, 2})}});
  h.Clear();
  h.mutable_set_optimizer()->add_names("b");
  h.mutable_set_optimizer()->mutable_optimizer()->set_kind("momentum");
  seeds.push_back({h, {}});
  h.Clear();
  auto* variable = h.mutable_create_variables()->add_variables();
  variable->set_name("c");
  variable->add_shape(4);
  variable->mutable_optimizer()->set_kind("rmsprop");
  seeds.push_back({h, {torch::ones({4})}});
  h.Clear();
  h.mutable_accumulate()->add_names("w");
  seeds.push_back({h, {torch::ones({3, 2})}});
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(dir + "/seed_" + std::to_string(i), std::ios::binary) << Seed(seeds[i].first, seeds[i].second);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);  // headers with invalid UTF-8 are refused; not worth a line each
  shoal::fuzz::WriteSeedsIfAsked(*argc, *argv, WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  const size_t header_length = in.Byte() | (size_t{in.Byte()} << 8);
  shoal::Request request;
  if (!request.header.ParseFromString(in.String(header_length))) return 0;  // the codec refuses these
  request.tensors = ReadTensors(in);
  request.peer = "ipv4:127.0.0.1:5555";
  // Long polls wait until their deadline by design; the transports run them
  // on a bounded executor (transport/blocking_executor.h).
  if (shoal::VariableService::MayWait(request)) return 0;
  // A fixed table is made whole at create, up to what fits in the host's
  // memory (refused beyond: EmbeddingTableTest covers it); tables past 64 MB
  // would only measure this machine's memory, so they are left out here.
  for (const auto& table : request.header.create_tables().tables()) {
    if (static_cast<double>(table.rows()) * static_cast<double>(table.dim()) > (16 << 20)) return 0;
  }
  const std::vector<uint64_t> before = Fingerprint();
  shoal::Response response;
  Service().Handle(request, &response);
  if (response.header.status_code() == static_cast<int>(absl::StatusCode::kInternal)) {
    // The handler turns an exception into INTERNAL for the ps's sake; here it
    // is the bug it is.
    std::fprintf(stderr, "the request threw: %s\n", response.header.status_message().c_str());
    std::abort();
  }
  if (response.header.status_code() != 0 && Fingerprint() != before) {
    std::fprintf(stderr, "a refused request changed the server: %s\n", response.header.status_message().c_str());
    std::abort();
  }
  return 0;
}
