#include "shoal/core/codec.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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

TEST(CodecTest, RefusesNonFloatTensorsWhenEncoding) {
  Request request;
  request.tensors = {torch::ones({2}, torch::kInt64)};
  absl::Status status = EncodeRequest(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("float32"), std::string::npos);
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

TEST(CodecTest, UnknownDtypeIsInvalidArgument) {
  wire::RequestHeader header;
  auto* meta = header.add_tensors();
  meta->set_dtype(static_cast<wire::DType>(7));
  meta->add_shape(1);
  meta->set_byte_size(4);
  std::string serialized = header.SerializeAsString();
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(serialized.size() >> (8 * i));
  bytes += serialized + std::string(4, '\0');
  Request decoded;
  EXPECT_EQ(Decode(bytes, 1 << 20, &decoded).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CodecTest, OversizedMessageIsResourceExhausted) {
  Request request;
  request.tensors = {torch::zeros({1024})};
  Request decoded;
  absl::Status status = Decode(Encoded(request), 1000, &decoded);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("limit"), std::string::npos);
}

}  // namespace
}  // namespace shoal
