#include "shoal/core/codec.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>

namespace shoal {
namespace {

Request MakeRequest() {
  Request request;
  request.header.mutable_assign()->add_names("dense_1/kernel");
  request.header.mutable_assign()->add_names("dense_1/bias");
  request.tensors = {torch::arange(12, torch::kFloat32).reshape({3, 4}), torch::ones({4})};
  return request;
}

std::string Encoded(const Request& request) { return EncodeRequest(request).value().Flatten(); }

// A frame around a hand-built header and `body_bytes` of zeros: what an
// attacker could send without going through the encoder.
std::string Frame(const wire::RequestHeader& header, size_t body_bytes = 0) {
  std::string serialized = header.SerializeAsString();
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(serialized.size() >> (8 * i));
  return bytes + serialized + std::string(body_bytes, '\0');
}

// Resident memory of this process, in bytes.
int64_t ResidentBytes() {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (statm != nullptr) {
    if (std::fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

absl::Status Decode(const std::string& bytes, size_t max_bytes, Request* out) {
  absl::string_view chunk = bytes;
  return DecodeRequest(absl::MakeConstSpan(&chunk, 1), max_bytes, out);
}

TEST(CodecTest, RoundTripKeepsHeaderAndTensors) {
  Request decoded;
  ASSERT_TRUE(Decode(Encoded(MakeRequest()), 1 << 20, &decoded).ok());
  EXPECT_EQ(decoded.header.assign().names(1), "dense_1/bias");
  ASSERT_EQ(decoded.tensors.size(), 2u);
  EXPECT_TRUE(decoded.tensors[0].equal(torch::arange(12, torch::kFloat32).reshape({3, 4})));
  EXPECT_TRUE(decoded.tensors[1].equal(torch::ones({4})));
  EXPECT_EQ(decoded.header.tensors_size(), 0);  // metadata is consumed by decoding
}

TEST(CodecTest, DecodesAcrossChunkBoundaries) {
  std::string bytes = Encoded(MakeRequest());
  std::vector<absl::string_view> chunks;
  for (size_t i = 0; i < bytes.size(); i += 7) chunks.push_back(absl::string_view(bytes).substr(i, 7));
  Request decoded;
  ASSERT_TRUE(DecodeRequest(chunks, 1 << 20, &decoded).ok());
  EXPECT_TRUE(decoded.tensors[0].equal(torch::arange(12, torch::kFloat32).reshape({3, 4})));
}

TEST(CodecTest, WithChunkOwnersLargeTensorsPointIntoTheChunkAndKeepItAlive) {
  Request request;
  request.tensors = {torch::arange(4096, torch::kFloat32), torch::ones({3})};
  EncodedMessage encoded = EncodeRequest(request).value();
  auto header = std::make_shared<std::string>(encoded.header_frame);
  auto body = std::make_shared<std::string>(static_cast<const char*>(encoded.bodies[0].data_ptr()), 4096 * 4);
  auto tail = std::make_shared<std::string>(static_cast<const char*>(encoded.bodies[1].data_ptr()), 3 * 4);
  std::vector<absl::string_view> chunks = {*header, *body, *tail};
  std::vector<ChunkOwner> owners = {header, body, tail};
  Request decoded;
  ASSERT_TRUE(DecodeRequest(chunks, 1 << 20, &decoded, owners).ok());
  EXPECT_EQ(decoded.tensors[0].data_ptr(), static_cast<const void*>(body->data()));  // not copied
  EXPECT_NE(decoded.tensors[1].data_ptr(), static_cast<const void*>(tail->data()));  // small: copied
  std::weak_ptr<std::string> body_alive = body;
  owners.clear();
  body.reset();
  EXPECT_FALSE(body_alive.expired());  // the tensor holds the chunk
  EXPECT_TRUE(decoded.tensors[0].equal(torch::arange(4096, torch::kFloat32)));
  decoded.tensors.clear();
  EXPECT_TRUE(body_alive.expired());
}

TEST(CodecTest, EncodesNonContiguousTensorsByValue) {
  Request request;
  request.tensors = {torch::arange(6, torch::kFloat32).reshape({2, 3}).t()};
  Request decoded;
  ASSERT_TRUE(Decode(Encoded(request), 1 << 20, &decoded).ok());
  EXPECT_TRUE(decoded.tensors[0].equal(request.tensors[0]));
}

TEST(CodecTest, Int64TensorsRoundTripBesideFloatOnes) {
  Request request;
  request.tensors = {torch::arange(5, torch::kInt64).mul(int64_t{1} << 40), torch::ones({2, 2}),
                     torch::arange(2048, torch::kInt64)};
  EncodedMessage encoded = EncodeRequest(request).value();
  EXPECT_EQ(encoded.total_bytes, encoded.header_frame.size() + 5 * 8 + 4 * 4 + 2048 * 8);
  // With chunk owners the large int64 tensor is decoded in place, at its own dtype.
  auto header = std::make_shared<std::string>(encoded.header_frame);
  std::string rest;
  for (const auto& body : encoded.bodies) rest.append(static_cast<const char*>(body.data_ptr()), body.nbytes());
  auto tail = std::make_shared<std::string>(rest);
  std::vector<absl::string_view> chunks = {*header, *tail};
  std::vector<ChunkOwner> owners = {header, tail};
  Request decoded;
  ASSERT_TRUE(DecodeRequest(chunks, 1 << 20, &decoded, owners).ok());
  ASSERT_EQ(decoded.tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(decoded.tensors[i].scalar_type(), request.tensors[i].scalar_type());
    EXPECT_TRUE(decoded.tensors[i].equal(request.tensors[i]));
  }
}

TEST(CodecTest, RefusesTensorsOfOtherDtypesWhenEncoding) {
  for (auto dtype : {torch::kFloat64, torch::kInt32, torch::kUInt8}) {
    Request request;
    request.tensors = {torch::ones({2}, dtype)};
    absl::Status status = EncodeRequest(request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("float32 or int64"), std::string::npos) << status;
  }
}

TEST(CodecTest, TruncatedMessageIsDataLoss) {
  std::string bytes = Encoded(MakeRequest());
  Request decoded;
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, bytes.size() - 1}) {
    absl::Status status = Decode(bytes.substr(0, cut), 1 << 20, &decoded);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << "cut at " << cut << ": " << status;
  }
}

TEST(CodecTest, TrailingBytesAreDataLoss) {
  Request decoded;
  absl::Status status = Decode(Encoded(MakeRequest()) + "xx", 1 << 20, &decoded);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("announces"), std::string::npos);
}

TEST(CodecTest, GarbledHeaderIsDataLoss) {
  std::string bytes = Encoded(MakeRequest());
  for (size_t i = 4; i < 20; ++i) bytes[i] = static_cast<char>(0xff);
  Request decoded;
  EXPECT_EQ(Decode(bytes, 1 << 20, &decoded).code(), absl::StatusCode::kDataLoss);
}

TEST(CodecTest, WrongByteSizeForShapeIsDataLoss) {
  Request request = MakeRequest();
  EncodedMessage encoded = EncodeRequest(request).value();
  wire::RequestHeader header = request.header;
  auto* meta = header.add_tensors();
  meta->set_dtype(wire::DTYPE_FLOAT32);
  meta->add_shape(5);
  meta->set_byte_size(8);  // 5 floats need 20
  std::string serialized = header.SerializeAsString();
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(serialized.size() >> (8 * i));
  bytes += serialized + std::string(8, '\0');
  Request decoded;
  absl::Status status = Decode(bytes, 1 << 20, &decoded);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("tensor 0"), std::string::npos);
}

TEST(CodecTest, AnUnknownDtypeIsInvalidArgumentNamingItsNumber) {
  wire::RequestHeader header;
  auto* meta = header.add_tensors();
  meta->set_dtype(static_cast<wire::DType>(42));
  meta->add_shape(1);
  meta->set_byte_size(4);
  Request decoded;
  absl::Status status = Decode(Frame(header, 4), 1 << 20, &decoded);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("has dtype number 42"), std::string::npos) << status;
}

TEST(CodecTest, OversizedMessageIsResourceExhausted) {
  Request request;
  request.tensors = {torch::zeros({1024})};
  Request decoded;
  absl::Status status = Decode(Encoded(request), 1000, &decoded);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("limit"), std::string::npos);
}

TEST(CodecTest, AHeaderOfMillionsOfEmptyTensorsIsRefusedBeforeAnythingIsBuilt) {
  // The attack: a few bytes per entry, each of which would become a torch
  // tensor. 500,000 entries of shape [0] take 3.5 MB on the wire.
  std::string bytes;
  {
    wire::RequestHeader header;
    header.mutable_assign()->add_names("dense_1/kernel");
    for (int i = 0; i < 500000; ++i) {
      wire::TensorMeta* meta = header.add_tensors();
      meta->set_dtype(wire::DTYPE_FLOAT32);
      meta->add_shape(0);
    }
    bytes = Frame(header);
  }
  ASSERT_LT(bytes.size(), kMaxHeaderBytes);  // under the header limit: the tensor count is what refuses it
  const int64_t before = ResidentBytes();
  Request decoded;
  absl::Status status = Decode(bytes, 512u << 20, &decoded);
  const int64_t grown = ResidentBytes() - before;
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("65536 tensors"), std::string::npos) << status;
  EXPECT_TRUE(decoded.tensors.empty());
  EXPECT_EQ(decoded.header.tensors_size(), 0);
  EXPECT_LT(grown, int64_t{8} << 20) << "refusing the message grew the process by " << grown << " bytes";
}

TEST(CodecTest, TheMostTensorsAMessageMayCarryStillDecode) {
  wire::RequestHeader header;
  for (int i = 0; i < kMaxTensorsPerMessage; ++i) {
    wire::TensorMeta* meta = header.add_tensors();
    meta->set_dtype(wire::DTYPE_FLOAT32);
    meta->add_shape(1);
    meta->set_byte_size(4);
  }
  Request decoded;
  ASSERT_TRUE(Decode(Frame(header, 4 * kMaxTensorsPerMessage), 512u << 20, &decoded).ok());
  EXPECT_EQ(decoded.tensors.size(), static_cast<size_t>(kMaxTensorsPerMessage));
}

TEST(CodecTest, AnOversizedHeaderIsRefusedOnItsLength) {
  wire::RequestHeader header;
  header.mutable_lookup()->add_names(std::string(kMaxHeaderBytes, 'x'));
  Request decoded;
  absl::Status status = Decode(Frame(header), 512u << 20, &decoded);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("header of"), std::string::npos) << status;
}

TEST(CodecTest, AHeaderWhoseTagsDoNotParseIsDataLoss) {
  const std::string garbage = "\x7a\xff\xff\xff\xff\x0f";  // field 15, length-delimited, length past the end
  std::string bytes(4, '\0');
  bytes[0] = static_cast<char>(garbage.size());
  Request decoded;
  EXPECT_EQ(Decode(bytes + garbage, 1 << 20, &decoded).code(), absl::StatusCode::kDataLoss);
}

TEST(CodecTest, EncodingMoreTensorsThanAMessageMayCarryIsRefused) {
  Request request;
  request.tensors.assign(kMaxTensorsPerMessage + 1, torch::zeros({1}));
  EXPECT_EQ(EncodeRequest(request).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal
