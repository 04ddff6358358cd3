// SPDX-License-Identifier: BSD-3-Clause
// Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/) from the library's own
// encoders: valid frames of each protocol, so that the fuzzers start from inputs that get past
// the first checks. Run from the build tree: chorus_fuzz_corpus <source>/fuzz/corpus
// (fuzz/README.md). Regression seeds (inputs that once crashed a target) are committed next to
// these by hand and are not written here.

#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../examples/02_train_fashion_mnist/fashion_mnist.hpp"
#include "chorus/algo/stamp.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/communicator.hpp"
#include "chorus/transport/shm/detail/segment.hpp"
#include "chorus/transport/shm/detail/socket.hpp"
#include "chorus/transport/tcp/link.hpp"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

fs::path g_root;

void write_seed(const std::string& target, const std::string& name, const Bytes& b) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

template <class T>
void append(Bytes& b, const T& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

void store_request() {
  using namespace chorus::detail;
  write_seed("store_request", "set", encode_store_request(StoreOp::set, {"rank/0/addr"}, 0, "127.0.0.1:29500"));
  write_seed("store_request", "get", encode_store_request(StoreOp::get, {"k"}, 30000, {}));
  write_seed("store_request", "wait_three", encode_store_request(StoreOp::wait, {"a", "b", "c"}, 1000, {}));
  write_seed("store_request", "add", encode_store_request(StoreOp::add, {"counter"}, static_cast<std::uint64_t>(-5), {}));
  write_seed("store_request", "check_none", encode_store_request(StoreOp::check, {}, 0, {}));
}

void store_response() {
  using namespace chorus::detail;
  write_seed("store_response", "get_value", encode_store_response(StoreStatus::ok, "127.0.0.1:29500"));
  std::string add(8, '\0');
  put_u64(reinterpret_cast<std::uint8_t*>(add.data()), 42);
  write_seed("store_response", "add_42", encode_store_response(StoreStatus::ok, add));
  write_seed("store_response", "check_true", encode_store_response(StoreStatus::ok, std::string(1, '\1')));
  write_seed("store_response", "timeout", encode_store_response(StoreStatus::timeout, "key 'k' not set within 10 ms"));
}

void handshake() {
  using namespace chorus;
  using namespace chorus::detail;
  const std::array<std::uint8_t, 16> cc = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  auto seed = [&](const char* name, std::uint8_t setup, const Hello& h, std::uint8_t flags) {
    Bytes b{setup};
    const auto hello = encode_hello(h, flags, cc);
    b.insert(b.end(), hello.begin(), hello.end());
    b.resize(1 + kReplyBytes);
    write_seed("handshake", name, b);
  };
  Hello store;
  store.kind = kHandshakeStore;
  seed("hello_store", 0, store, 0);
  Hello link;
  link.kind = kHandshakeLink;
  link.nonce = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};
  link.rank = 1;
  link.peer = 0;
  link.world = 4;
  seed("hello_link_token", 3, link, kFlagToken);
  // A REPLY that says ok (the layout of handshake_accept's), with a token.
  Bytes reply{0, 'C', 'H', 'R', 'S', 1, 0, 0, kFlagToken};
  reply.insert(reply.end(), cc.begin(), cc.end());
  reply.resize(1 + kReplyBytes, 0x5a);
  write_seed("handshake", "reply_ok", reply);
}

void tcp_frame() {
  using namespace chorus::tcp::detail;
  auto frame = [](FrameType t, std::uint32_t flags, std::uint64_t tag, std::uint64_t size, std::uint64_t id) {
    return FrameHeader{static_cast<std::uint32_t>(t), flags, tag, size, id};
  };
  Bytes one;
  append(one, frame(FrameType::eager, 0, 7, 1024, 0));
  write_seed("tcp_frame", "eager", one);
  Bytes large;
  append(large, frame(FrameType::rts, 0, 7, 1 << 20, 1));
  append(large, frame(FrameType::cts, 0, 0, 1 << 20, 1));
  append(large, frame(FrameType::data, 0, 0, 1 << 20, 1));
  append(large, frame(FrameType::cts, kCtsReject, 0, 16, 2));
  write_seed("tcp_frame", "rts_cts_data", large);
}

void shm_hello() {
  using namespace chorus::shm::detail;
  const chorus::JobNonce nonce = {0xc7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  ShmHello h;
  h.nonce = nonce;
  h.rank = 2;
  h.peer = 0;
  h.world = 4;
  h.pid = 4242;
  h.probe_addr = 0x5555'0000'1000;
  Bytes b;
  append(b, h);
  b.push_back(4);  // world
  b.push_back(0);  // rank
  b.insert(b.end(), nonce.begin(), nonce.end());
  for (std::uint8_t bits : {0, 1, 1, 3}) b.push_back(bits);  // ranks 1, 2 expected; 3 connected
  write_seed("shm_hello", "accepted", b);
}

void shm_record() {
  using namespace chorus::shm;
  using namespace chorus::shm::detail;
  auto record = [](Bytes& b, RecordType t, std::uint64_t size, std::uint64_t payload, std::uint64_t id) {
    Record r;
    r.type = static_cast<std::uint32_t>(t);
    r.tag = 7;
    r.size = size;
    r.id = id;
    r.payload = payload;
    const std::size_t at = b.size();
    append(b, r);
    b.resize(at + record_bytes(payload), 0x33);
  };
  auto seed = [](const char* name, std::uint64_t head, const Bytes& ring) {
    Bytes b;
    append(b, head);
    append(b, head + ring.size());  // tail
    b.insert(b.end(), ring.begin(), ring.end());
    write_seed("shm_record", name, b);
  };
  Bytes ring;
  record(ring, RecordType::eager, 100, 100, 0);
  record(ring, RecordType::rts, 1 << 20, 0, 1);
  record(ring, RecordType::fin, 1 << 20, 0, 1);
  record(ring, RecordType::data, 1 << 20, 256, 2);
  seed("records", 0, ring);
  // A pad record at the last 64 bytes of the ring, then a record at its start.
  Bytes wrap;
  record(wrap, RecordType::pad, 0, 0, 0);
  record(wrap, RecordType::eager, 8, 8, 0);
  seed("pad_wraps", Policy::kRingBytes - kRecordAlign, wrap);
}

void descriptor() {
  using namespace chorus;
  using namespace chorus::algo;
  using chorus::mismatch::Stamp;
  Stamp s;
  s.desc = CollectiveDesc{CollectiveKind::all_reduce, DataType::float32, ReduceOp::sum, -1, 13, 4};
  Bytes same;
  append(same, s);
  append(same, s.desc);
  write_seed("descriptor", "same", same);
  Bytes differ;
  append(differ, s);
  append(differ, CollectiveDesc{CollectiveKind::broadcast, DataType::int64, ReduceOp::sum, 2, 1000, 4});
  write_seed("descriptor", "differ", differ);
}

void error_notice() {
  using namespace chorus;
  const std::string text =
      "chorus mismatch: rank 0: all_reduce float32 sum count 13 seq 4: collectives differ: rank 0 called "
      "all_reduce float32 sum count 13 seq 4, rank 2 called broadcast int64 root 2 count 1000 seq 4";
  Bytes b;
  append(b, mismatch::ErrorNotice::of(ErrorCode::mismatch, text));
  b.insert(b.end(), text.begin(), text.end());
  write_seed("error_notice", "mismatch", b);
}

Bytes be32(std::uint32_t v) { return {std::uint8_t(v >> 24), std::uint8_t(v >> 16), std::uint8_t(v >> 8), std::uint8_t(v)}; }

Bytes gzip(const Bytes& plain) {
  const fs::path tmp = fs::temp_directory_path() / "chorus_fuzz_corpus.gz";
  gzFile f = gzopen(tmp.c_str(), "wb9");
  gzwrite(f, plain.data(), static_cast<unsigned>(plain.size()));
  gzclose(f);
  std::ifstream in(tmp, std::ios::binary);
  Bytes out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(tmp);
  return out;
}

void idx() {
  // 3 images of 4x2 pixels and their labels.
  Bytes images;
  for (auto v : {0x803u, 3u, 4u, 2u}) {
    const auto b = be32(v);
    images.insert(images.end(), b.begin(), b.end());
  }
  for (int i = 0; i < 3 * 4 * 2; ++i) images.push_back(static_cast<std::uint8_t>(i * 10));
  Bytes labels;
  for (auto v : {0x801u, 3u}) {
    const auto b = be32(v);
    labels.insert(labels.end(), b.begin(), b.end());
  }
  for (std::uint8_t l : {0, 9, 4}) labels.push_back(l);
  auto seed = [](const char* name, const Bytes& im, const Bytes& lb) {
    Bytes b;
    append(b, static_cast<std::uint16_t>(im.size()));
    b.insert(b.end(), im.begin(), im.end());
    b.insert(b.end(), lb.begin(), lb.end());
    write_seed("idx", name, b);
  };
  seed("plain", images, labels);
  seed("gzip", gzip(images), gzip(labels));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus folder, e.g. fuzz/corpus>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  store_request();
  store_response();
  handshake();
  tcp_frame();
  shm_hello();
  shm_record();
  descriptor();
  error_notice();
  idx();
  return 0;
}
