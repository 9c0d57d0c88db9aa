// Writes the seed corpus of tcp_conn_fuzz (corpus/tcp_conn/seed-*) with tcp.so's own frame
// encoder, so the fuzzer starts from whole client sessions:
//   <build>/tests/fuzz/make_tcp_conn_seeds tests/fuzz/corpus/tcp_conn
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "handshake.hpp"
#include "tcp_conn_fuzz.h"
#include "wire.hpp"

using namespace ferry_tcp;
using namespace tcp_conn_fuzz;

namespace {

struct Session {
    std::vector<uint8_t> bytes;
    explicit Session(unsigned config) { bytes.push_back(static_cast<uint8_t>(config)); }
    Session &frame(uint8_t type, uint64_t id = 0, uint64_t addr = 0, uint64_t length = 0, uint32_t msg_len = 0,
                   uint8_t flags = 0, uint16_t version = kWireVersion) {
        Header h;
        h.type = type;
        h.id = id;
        h.addr = addr;
        h.length = length;
        h.msg_len = msg_len;
        h.flags = flags;
        h.version = version;
        uint8_t out[kHeaderSize];
        encode_header(h, out);
        last_ = bytes.size();
        bytes.insert(bytes.end(), out, out + kHeaderSize);
        return *this;
    }
    // Sets the status of the frame added last (an ERROR's negative errno).
    Session &status(int32_t v) {
        Header h = decode_header(bytes.data() + last_);
        h.status = v;
        encode_header(h, bytes.data() + last_);
        return *this;
    }
    size_t last_ = 0;
    Session &data(size_t n, uint8_t v) {
        bytes.insert(bytes.end(), n, v);
        return *this;
    }
    // HELLO with a nonce, AUTH with the all-zero proof of "no key".
    Session &handshake(uint8_t flags = 0) {
        frame(kHello, 0, 0, 0, kHelloData, flags).data(kNonceSize, 0x42);
        return frame(kAuth, 0, 0, 0, kAuthData).data(kProofSize, flags ? 0x17 : 0);
    }
};

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <corpus/tcp_conn directory>\n", argv[0]);
        return 2;
    }
    std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    auto put = [&](const char *name, const Session &s) {
        std::ofstream(dir / (std::string("seed-") + name), std::ios::binary)
            .write(reinterpret_cast<const char *>(s.bytes.data()), static_cast<std::streamsize>(s.bytes.size()));
    };
    put("requests", Session(0)
                        .handshake()
                        .frame(kReadReq, 1, kReadRegion, 4096)
                        .frame(kWriteReq, 2, kWriteRegion + 100, 64)
                        .data(64, 0xAB)
                        .frame(kReadReq, 3, kWriteRegion, 16)  // no read access: ERROR
                        .frame(kWriteReq, 4, kReadRegion, 32)
                        .data(32, 1)  // no write access: drained
                        .frame(kReadReq, 5, kReadRegion, 8)
                        .frame(kReadReq, 6, kReadRegion + 8, 8)
                        .frame(kReadReq, 7, kBase, 8));  // canary: ERROR
    put("secret-wrong-proof", Session(1).handshake(kFlagAuth).frame(kReadReq, 1, kReadRegion, 64));
    put("zerocopy-read-done", Session(2)
                                  .handshake()
                                  .frame(kReadReq, 1, kReadRegion, kReadSize)
                                  .frame(kReadDone, 1, 0, 1)
                                  .frame(kReadReq, 2, kReadRegion, 512 << 10));
    put("old-version", Session(0).frame(kHello, 0, 0, 0, kHelloData, 0, 1).data(kNonceSize, 0));
    put("read-done-unasked", Session(0).handshake().frame(kReadDone, 9, 0, 1));
    // tcp_lane: what a server answers (tcp_lane_fuzz.cpp: mode 0/1 handshake, 2 responses to
    // ids 1..6: READ 4096; WRITE 4096; WRITE 16; READ 70000 in 64 KiB slices; READ 8).
    std::filesystem::path lane = dir.parent_path() / "tcp_lane";
    std::filesystem::create_directories(lane);
    auto put_lane = [&](const char *name, const Session &s) {
        std::ofstream(lane / (std::string("seed-") + name), std::ios::binary)
            .write(reinterpret_cast<const char *>(s.bytes.data()), static_cast<std::streamsize>(s.bytes.size()));
    };
    put_lane("handshake", Session(0).frame(kHelloAck, 0, 0, 0, kHelloAckData).data(kHelloAckData, 0).frame(kAuthAck));
    put_lane("handshake-key",
             Session(1).frame(kHelloAck, 0, 0, 0, kHelloAckData, kFlagAuth).data(kHelloAckData, 7).frame(kAuthAck));
    put_lane("refused", Session(0).frame(kError, 0, 0, 0, 5).status(-13).data(5, 'n'));
    Session r(2);
    r.frame(kReadResp, 1, 0, 4096).data(4096, 1).frame(kWriteAck, 2).frame(kWriteAck, 3);
    uint64_t left = 70000;
    for (uint64_t id = 4; left > 0; ++id) {
        uint64_t n = left < 65536 ? left : 65536;
        r.frame(kReadResp, id, 0, n, 0, id == 5 ? kFlagNeedsDone : 0).data(n, 2);
        left -= n;
    }
    put_lane("responses", r.frame(kReadResp, 6, 0, 8).data(8, 3));
    put_lane("error-then-cut", Session(2)
                                   .frame(kReadResp, 1, 0, 4096)
                                   .data(4096, 1)
                                   .frame(kError, 2, 0, 0, 6)
                                   .status(-14)
                                   .data(6, 'e')
                                   .frame(kWriteAck, 3)
                                   .frame(kReadResp, 4, 0, 65536)
                                   .data(100, 2));
    std::printf("wrote the seeds under %s and %s\n", dir.c_str(), lane.c_str());
    return 0;
}
