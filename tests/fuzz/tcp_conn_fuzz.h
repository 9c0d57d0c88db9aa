// Shared by tcp_conn_fuzz.cpp and make_tcp_conn_seeds.cpp: where the fuzzed tcp.so instance
// registers its memory, and how an input is laid out.
//
// Input: byte 0 picks the instance (kConfigs: 0 no secret, 1 a cluster secret, 2 no secret and
// zerocopy=1); the rest is sent to it as a client's byte stream.
// Memory, mapped at a fixed address so that inputs can name it:
//   [kBase, +64 KiB)            canary, not registered
//   [kReadRegion, +1 MiB)       registered REMOTE_READ only, every byte kReadByte
//   [.., +64 KiB)               canary
//   [kWriteRegion, +256 KiB)    registered REMOTE_WRITE only
//   [.., +64 KiB)               canary
#pragma once

#include <cstddef>
#include <cstdint>

namespace tcp_conn_fuzz {

inline constexpr unsigned kConfigs = 3;
inline constexpr uint64_t kBase = 0x7e9000000000ull;  // application memory for ASan and TSan alike
inline constexpr size_t kCanary = 64 << 10;
inline constexpr size_t kReadSize = 1 << 20;
inline constexpr size_t kWriteSize = 256 << 10;
inline constexpr uint64_t kReadRegion = kBase + kCanary;
inline constexpr uint64_t kWriteRegion = kReadRegion + kReadSize + kCanary;
inline constexpr size_t kMapSize = 3 * kCanary + kReadSize + kWriteSize;
inline constexpr uint8_t kReadByte = 0x52;
inline constexpr uint8_t kCanaryByte = 0xC3;
inline constexpr const char *kAuthKey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

}  // namespace tcp_conn_fuzz
