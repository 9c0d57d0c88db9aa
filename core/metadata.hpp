// Where engines publish their segment descriptors and find each other's. The embedded default
// is a peer-to-peer handshake (P2PHANDSHAKE): every engine serves its own descriptor on a TCP
// port and its segment name is that "ip:port". Other backends (etcd) implement the same
// interface.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "descriptor.hpp"
#include "ferry/engine.hpp"

namespace ferry {

struct MetadataSettings {
    std::string url = "P2PHANDSHAKE";
    std::string local_ip = "127.0.0.1";
    uint16_t rpc_port = 0; // 0: any free port
    std::string local_server_name; // name to publish under, where the backend allows names
    std::chrono::milliseconds timeout{5000};
};

class MetadataBackend {
public:
    virtual ~MetadataBackend() = default;
    // Name peers open this engine by.
    virtual const std::string &segment_name() const = 0;
    // Publish or replace this engine's descriptor.
    virtual Result<void> publish(const SegmentDescriptor &descriptor) = 0;
    virtual Result<SegmentDescriptor> fetch(const std::string &segment_name) = 0;
};

Result<std::unique_ptr<MetadataBackend>> make_metadata_backend(const MetadataSettings &settings);

// Handshake wire format, shared by server and client.
inline constexpr uint32_t kHandshakeMagic = 0x46524853; // "FRHS"
inline constexpr uint16_t kHandshakeVersion = 1;
inline constexpr uint16_t kHandshakeGetDescriptor = 1;
inline constexpr size_t kHandshakeHeaderBytes = 12;

} // namespace ferry
