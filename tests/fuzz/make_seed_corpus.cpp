// Writes the seed corpus (corpus/<target>/seed-*) with Ferry's real encoders, so the fuzzers
// start from valid frames, endpoints and descriptors. Run from the build:
//   <build>/tests/fuzz/make_seed_corpus tests/fuzz/corpus
// libFuzzer adds what it finds to the corpus directories it is given; tests/fuzz/run.sh keeps
// those in a scratch copy, so the committed corpus stays small and reviewed.
#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../plugins/shm/map_wire.hpp"
#include "../../plugins/shm/stage.hpp"
#include "../../plugins/shm/wire.hpp"
#include "control/control_protocol.hpp"
#include "memory.hpp"
#include "metadata/chunk_codec.hpp"
#include "metadata/descriptor.hpp"
#include "util/base64.hpp"
#include "wire.hpp"

namespace fs = std::filesystem;

namespace {

fs::path g_root;
int g_written = 0;

void put(const std::string &target, const std::string &name, const void *data, size_t size) {
    fs::create_directories(g_root / target);
    std::ofstream out(g_root / target / ("seed-" + name), std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char *>(data), static_cast<std::streamsize>(size));
    ++g_written;
}
void put(const std::string &target, const std::string &name, const std::vector<uint8_t> &v) {
    put(target, name, v.data(), v.size());
}
void put(const std::string &target, const std::string &name, const std::string &s) {
    put(target, name, s.data(), s.size());
}

void tcp_wire() {
    using namespace ferry_tcp;
    auto header = [](uint8_t type, uint64_t id, uint64_t addr, uint64_t length, uint8_t flags = 0) {
        Header h;
        h.type = type;
        h.id = id;
        h.addr = addr;
        h.length = length;
        h.flags = flags;
        std::vector<uint8_t> out(kHeaderSize);
        encode_header(h, out.data());
        return out;
    };
    put("tcp_wire", "hello", header(kHello, 0, 0, 0));
    put("tcp_wire", "write-req", header(kWriteReq, 1, 0x7f0000001000, 4096));
    put("tcp_wire", "read-req", header(kReadReq, 2, 0x7f0000002000, 1 << 20));
    put("tcp_wire", "read-resp-needs-done", header(kReadResp, 2, 0, 65536, kFlagNeedsDone));
    put("tcp_wire", "read-done", header(kReadDone, 9, 0, 3));
    Header err;
    err.type = kError;
    err.status = -14;
    err.msg_len = 5;
    std::vector<uint8_t> e(kHeaderSize);
    encode_header(err, e.data());
    e.insert(e.end(), {'E', 'F', 'A', 'U', 'L'});
    put("tcp_wire", "error", e);
    sockaddr_storage ss{};
    auto *v4 = reinterpret_cast<sockaddr_in *>(&ss);
    v4->sin_family = AF_INET;
    v4->sin_port = htons(40123);
    inet_pton(AF_INET, "127.0.0.1", &v4->sin_addr);
    uint8_t ep[kEndpointSize];
    encode_endpoint(ss, ep);
    put("tcp_wire", "endpoint-v4", ep, sizeof ep);
    sockaddr_storage ss6{};
    auto *v6 = reinterpret_cast<sockaddr_in6 *>(&ss6);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(7000);
    inet_pton(AF_INET6, "::1", &v6->sin6_addr);
    encode_endpoint(ss6, ep);
    put("tcp_wire", "endpoint-v6", ep, sizeof ep);
}

void descriptor() {
    using namespace ferry;
    SegmentDescriptor d;
    d.name = "127.0.0.1:7000";
    d.host_id = "0123456789abcdef-boot";
    d.generation = 3;
    put("descriptor", "empty", encode_descriptor(d));
    d.transports.push_back({"tcp", std::vector<uint8_t>(28, 0x11)});
    d.transports.push_back({"shm", std::vector<uint8_t>(24, 0x22)});
    RegionDescriptor r1;
    r1.addr = 0x7f0000000000;
    r1.length = 1 << 20;
    r1.access = kRemoteRead | kRemoteWrite;
    r1.keys.push_back({"tcp", {1, 2, 3, 4, 5, 6, 7, 8}});
    RegionDescriptor r2 = r1;
    r2.addr = r1.end();
    r2.length = 4096;
    r2.kind = 1;
    r2.device = 0;
    r2.access = kRemoteRead;
    r2.keys.push_back({"cuda_ipc", std::vector<uint8_t>(64, 0xab)});
    d.regions = {r1, r2};
    put("descriptor", "two-regions", encode_descriptor(d));
    d.control = "127.0.0.1:7001";
    put("descriptor", "with-control", encode_descriptor(d));
}

void descriptor_chunk() {
    using namespace ferry;
    std::vector<RegionDescriptor> run;
    for (uint64_t i = 0; i < 8; ++i)
        run.push_back({0x7f0000000000 + i * 4096, 4096, 0, -1, 3, {{"tcp", {}}, {"rdma", {1, 2, 3, 4}}}});
    run[5].addr += 4096;  // a gap
    run[6].length = 100;  // another length
    run[6].addr = run[5].end();
    run[7] = {run[6].end() + 64, 1 << 20, 1, 2, 1, {{"cuda_ipc", std::vector<uint8_t>(64, 0xab)}}};
    std::vector<const RegionDescriptor *> ptrs;
    for (const auto &r : run) ptrs.push_back(&r);
    put("descriptor_chunk", "run", encode_parts_chunk(ptrs));
    put("descriptor_chunk", "one", encode_parts_chunk(std::span(ptrs.data() + 7, 1)));
    put("descriptor_chunk", "version1", encode_region_chunk(ptrs));
}

void base64() {
    put("base64", "text", ferry::base64_encode(std::string_view("ferry segment descriptor")));
    put("base64", "pad1", ferry::base64_encode(std::string_view("ab")));
    put("base64", "pad2", ferry::base64_encode(std::string_view("a")));
    put("base64", "binary", std::string("\x00\xff\x10=", 4));
}

void config_yaml() {
    put("config_yaml", "flat",
        std::string("local_ip: 127.0.0.1\nrpc_port: 0\nprotocols: [shm, tcp]\n"
                    "log_level: warn\nhandshake_timeout_ms: 5000\n"));
    put("config_yaml", "nested",
        std::string("metadata: etcd://127.0.0.1:2379/ferry\n"
                    "transports:\n  tcp:\n    lanes: 2\n    op_timeout_ms: 1000\n"
                    "  shm: {adopt_memfd: true}\n"
                    "plugin_path: /opt/ferry/plugins:/usr/lib/ferry\n"));
    put("config_yaml", "local-server-name", std::string("local_server_name: 127.0.0.1:7000\n"));
    put("config_yaml", "not-a-map", std::string("- a\n- b\n"));
}

void efa_mem() {
    using namespace ferry_efa;
    std::vector<RemoteChunk> chunks = {{0x7f0000000000, 1 << 20, 0x1234, 0x7f0000000000, 3, 0},
                                       {0x7f0000100000, 1 << 20, 0x1235, 0, 1, 0}};
    MemHead h{kMemMagic, kWireVersion, 0, static_cast<uint32_t>(chunks.size()), 0};
    std::vector<uint8_t> out(sizeof h + chunks.size() * sizeof(RemoteChunk));
    memcpy(out.data(), &h, sizeof h);
    memcpy(out.data() + sizeof h, chunks.data(), chunks.size() * sizeof(RemoteChunk));
    put("efa_mem", "two-chunks", out);
    h.count = 0;
    put("efa_mem", "no-chunks", &h, sizeof h);
}

void control_server() {
    using namespace ferry::control;
    ferry::ByteWriter hello;
    hello.bytes(std::vector<uint8_t>(kNonceBytes, 0x42));
    hello.u32(kFlagSecret);
    hello.str("127.0.0.1:7000");
    auto h = frame(kHello, hello.data());
    put("control_server", "hello", h);
    auto with_auth = h;
    std::vector<uint8_t> proof(sizeof(Proof), 0x17);  // AUTH carries the bare proof
    auto a = frame(kAuth, proof);
    with_auth.insert(with_auth.end(), a.begin(), a.end());
    auto g = frame(kGetDescriptor, std::string_view("127.0.0.1:7000"));
    with_auth.insert(with_auth.end(), g.begin(), g.end());
    put("control_server", "hello-auth-get", with_auth);
    put("control_server", "get-without-hello", g);
    put("control_server", "notify-without-hello", frame(kNotify, std::string_view("hello there")));
}

// Without a secret: HELLO with no flag, the all-zero proof, then requests after Ready.
void control_server_open() {
    using namespace ferry::control;
    ferry::ByteWriter hello;
    hello.bytes(std::vector<uint8_t>(kNonceBytes, 0x42));
    hello.u32(0);
    hello.str("127.0.0.1:7000");
    auto ready = frame(kHello, hello.data());
    auto a = frame(kAuth, std::vector<uint8_t>(sizeof(Proof), 0));
    ready.insert(ready.end(), a.begin(), a.end());
    auto with = [&](std::vector<std::vector<uint8_t>> frames) {
        auto out = ready;
        for (auto &f : frames) out.insert(out.end(), f.begin(), f.end());
        return out;
    };
    put("control_server_open", "hello-auth", ready);
    put("control_server_open", "get", with({frame(kGetDescriptor, std::string_view("127.0.0.1:7000"))}));
    put("control_server_open", "notify-get",
        with({frame(kNotify, std::string_view("after the write")),
              frame(kGetDescriptor, std::string_view("127.0.0.1:7000"))}));
    put("control_server_open", "unknown-type", with({frame(99, std::string_view("x"))}));
    auto cut = frame(kNotify, std::vector<uint8_t>(64, 0x61));
    cut.resize(40);
    put("control_server_open", "truncated-notify", with({cut}));
}

// What a server sends a client: byte 0 is the client's configuration (bit 0: a secret).
void control_client() {
    using namespace ferry::control;
    ferry::ByteWriter hello;
    hello.bytes(std::vector<uint8_t>(kNonceBytes, 0x24));
    hello.u32(0);
    hello.bytes(std::vector<uint8_t>(sizeof(Proof), 0));
    auto stream = [](uint8_t config, std::vector<std::vector<uint8_t>> frames) {
        std::vector<uint8_t> out{config};
        for (auto &f : frames) out.insert(out.end(), f.begin(), f.end());
        return out;
    };
    ferry::SegmentDescriptor d;
    d.name = "127.0.0.1:7000";
    d.control = "127.0.0.1:7000";
    auto desc = ferry::encode_descriptor(d);
    put("control_client", "open-handshake-get-notify",
        stream(0, {frame(0, hello.data()), frame(0, std::vector<uint8_t>{}), frame(0, desc),
                   frame(0, std::vector<uint8_t>{})}));
    put("control_client", "open-refused-at-limit",
        stream(0, {frame(EUSERS, std::string_view("control server at 127.0.0.1:7000 refused the connection: 128 "
                                                  "connections already open from this address"))}));
    put("control_client", "open-queue-full",
        stream(0,
               {frame(0, hello.data()), frame(0, std::vector<uint8_t>{}), frame(ENOBUFS, std::string_view("full"))}));
    ferry::ByteWriter secret_hello;
    secret_hello.bytes(std::vector<uint8_t>(kNonceBytes, 0x24));
    secret_hello.u32(kFlagSecret);
    secret_hello.bytes(std::vector<uint8_t>(sizeof(Proof), 0x99));
    put("control_client", "secret-wrong-proof",
        stream(1, {frame(0, secret_hello.data()), frame(EACCES, std::string_view("authentication failed"))}));
}

// shm_wire: byte 0 picks the instance and the Hello, then (selector, Request) records; the
// selector bits are explained in shm_wire_fuzz.cpp's steer().
void shm_wire() {
    auto record = [](std::vector<uint8_t> &v, uint8_t selector, uint32_t opcode, uint64_t remote, uint64_t len,
                     uint64_t local, uint64_t id) {
        ferry_shm::Request r{};
        r.id = id;
        r.opcode = opcode;
        r.local_fd = -1;
        r.remote_addr = remote;
        r.length = len;
        r.local_addr = local;
        v.push_back(selector);
        const auto *b = reinterpret_cast<const uint8_t *>(&r);
        v.insert(v.end(), b, b + sizeof r);
    };
    constexpr uint8_t kInRegion = 3, kBoundedLen = 4, kOpcode = 0x40, kMemfd = 2 << 3, kGateClosed = 0x20;
    std::vector<uint8_t> rw = {0};
    record(rw, kInRegion | kBoundedLen | kOpcode, 0, 100, 5000, 7, 1);  // WRITE
    record(rw, kInRegion | kBoundedLen | kOpcode, 1, 100, 5000, 7, 2);  // READ
    record(rw, 1 | kBoundedLen | kOpcode, 0, 65536 + 120, 200, 0, 3);   // straddles the end
    record(rw, 2 | kBoundedLen | kOpcode, 0, 10, 64, 0, 4);             // WRITE to the read-only region
    put("shm_wire", "write-read-edges", rw);
    std::vector<uint8_t> memfd = {1};
    record(memfd, kInRegion | kBoundedLen | kOpcode | kMemfd, 1, 4096, 40000, 3, 1);
    record(memfd, kInRegion | kBoundedLen | kOpcode | kMemfd, 0, 0, 65536, 0, 2);
    record(memfd, kInRegion | kBoundedLen | kOpcode | kGateClosed, 1, 0, 4096, 0, 3);
    put("shm_wire", "adopt-memfd-pieces-gate", memfd);
    std::vector<uint8_t> raw = {0};
    record(raw, 0, 1, 16, 8, 16, 1);  // raw address and opcode
    record(raw, 0, 7, 0, 0, 0, 2);    // malformed
    put("shm_wire", "raw-requests", raw);
    std::vector<uint8_t> stale = {1 << 1};
    record(stale, kInRegion | kBoundedLen | kOpcode, 1, 0, 64, 0, 1);
    put("shm_wire", "stale-token", stale);
    put("shm_wire", "raw-hello", std::vector<uint8_t>{3 << 1, 'F', 'S', 'H', 'H', 3, 0, 0, 0});
    // Staging (plugins/shm/stage.hpp): byte 0's bit 3 offers an area; records become blocks.
    constexpr uint8_t kStaging = 8, kRawFrame = 0x80, kRevoked = 0x20;
    std::vector<uint8_t> staged = {kStaging};
    record(staged, kInRegion | kOpcode, 0, 64, 0x3f3f3f3f3f3f3f40, 7, 7);    // 8 WRITEs of 64 bytes
    record(staged, kInRegion | kOpcode, 1, 4096, 0x1111111111111111, 7, 3);  // 4 READs
    record(staged, 2 | kOpcode, 0, 0, 0x4040404040404040, 0, 5);             // WRITEs to the read-only region
    record(staged, 1 | kOpcode, 1, 65536 - 32, 0x4040404040404040, 0, 2);    // straddles the region's end
    record(staged, kInRegion | kOpcode | kRevoked, 0, 0, 0x4040, 0, 1);      // revoked before the claim
    put("shm_wire", "stage-blocks", staged);
    std::vector<uint8_t> frames = {kStaging | 1};
    record(frames, kRawFrame, 0, 65536 - 64, 4096, 1, 1);  // block past the area's end
    record(frames, kRawFrame, 0, 65, 4096, 1, 2);          // misaligned
    record(frames, kRawFrame, 0, 0, 64, 1, 3);             // too short for its op list
    record(frames, kRawFrame, 0, 0, 65536, 5000, 4);       // too many ops
    record(frames, kRawFrame, 0, 0, UINT64_MAX, 1, 5);     // wraps
    put("shm_wire", "stage-raw-frames", frames);
    std::vector<uint8_t> unstaged = {0};  // the new records without an area: refused one by one
    record(unstaged, 0, ferry_shm::kOpStageOffer, 0, 65536, 0, 0);
    record(unstaged, 0, ferry_shm::kOpStageBatch, 0, 4096, 1, 9);
    put("shm_wire", "stage-records-without-area", unstaged);
}

// shm_map_wire: byte 0 picks the decoder (0 request, 1 reply, 2 desc), then the record.
void shm_map_wire() {
    auto with = [](uint8_t which, const void *rec, size_t n) {
        std::vector<uint8_t> v{which};
        v.insert(v.end(), static_cast<const uint8_t *>(rec), static_cast<const uint8_t *>(rec) + n);
        return v;
    };
    ferry_shm::MapRequest rq{ferry_shm::kMapRequestMagic, 3, 0x7f0000000000ull, 4 << 20};
    put("shm_map_wire", "request-rw", with(0, &rq, sizeof rq));
    ferry_shm::MapReply ok{};
    ok.magic = ferry_shm::kMapReplyMagic;
    ok.base = 0x7f0000000000ull;
    ok.length = (4 << 20) + 100;
    ok.fd_offset = 0;
    ok.live_offset = (4 << 20) + 4096;
    ok.live_value = 0x1234567;
    ok.ino = 42;
    ok.access = 3;
    put("shm_map_wire", "reply-ok", with(1, &ok, sizeof ok));
    ferry_shm::MapReply no{};
    no.magic = ferry_shm::kMapReplyMagic;
    no.status = -13;
    snprintf(no.message, sizeof no.message, "shm: pid 1: not registered for remote write");
    put("shm_map_wire", "reply-refused", with(1, &no, sizeof no));
    ferry_shm::SharedDesc d{ferry_shm::kSharedDescMagic, ferry_shm::kWireVersion, 0};
    put("shm_map_wire", "desc", with(2, &d, sizeof d));
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
        return 2;
    }
    g_root = argv[1];
    tcp_wire();
    descriptor();
    descriptor_chunk();
    base64();
    config_yaml();
    efa_mem();
    control_server();
    control_server_open();
    control_client();
    shm_wire();
    shm_map_wire();
    std::printf("wrote %d seed files under %s\n", g_written, g_root.c_str());
    return 0;
}
