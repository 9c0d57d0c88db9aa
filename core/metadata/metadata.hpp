// core/metadata/: segment descriptors (descriptor.hpp) and their codecs, and where engines publish
// and find them (this file): the P2P handshake over the control channel, etcd, Redis and
// Mooncake's HTTP metadata server, their clients, the first contact's retries, and the host
// identity a descriptor carries.
// May include: control/, util/
//
// Where engines publish their segment descriptors and find each other's. The embedded default
// is a peer-to-peer handshake (P2PHANDSHAKE): every engine serves its own descriptor on its
// control server (control_server.hpp) and its segment name is that "ip:port". Other backends (etcd,
// Redis, Mooncake's HTTP metadata server) implement the same interface.
#pragma once

#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "ferry/result.hpp"
#include "metadata/descriptor.hpp"

namespace ferry {

// How an etcd backend reaches etcd securely (config keys etcd_*; see etcd_client.hpp).
struct EtcdSecurity {
    std::string ca_file;    // etcds:// only; empty: the system's CA store
    std::string cert_file;  // client certificate and its key, for etcd --client-cert-auth
    std::string key_file;
    std::string user;      // etcd user/password authentication
    std::string password;  // never logged
    std::string password_file;
};

// How a Redis backend logs in (config keys redis_*; redis_metadata.cpp). The URL's
// redis://user:password@host:port/db may give them too, never both.
struct RedisSettings {
    std::string user;      // an ACL user (Redis 6+); empty: the default user
    std::string password;  // never logged
    std::string password_file;
    std::string db;  // config key redis_db as given; the URL's /db otherwise
};

struct MetadataSettings {
    std::string url = "P2PHANDSHAKE";
    std::string local_ip = "127.0.0.1";
    uint16_t rpc_port = 0;          // 0: any free port
    std::string local_server_name;  // name to publish under, where the backend allows names
    std::chrono::milliseconds timeout{5000};
    std::chrono::milliseconds retry_for{10000};  // how long to retry an unreachable metadata server at start
    int lease_ttl_s = 10;                        // etcd, Redis: a dead engine's segment disappears after this
    // Redis, HTTP: how often an engine checks that its own segment is still published (writing it
    // again when it is not) and whether the segments it opened changed (stores without watches).
    std::chrono::milliseconds poll{2000};
    EtcdSecurity etcd;
    RedisSettings redis;
};

// A region registered (`region` set) or unregistered (nullopt) at `addr`.
struct RegionChange {
    uint64_t addr = 0;
    std::optional<RegionDescriptor> region;
};

class MetadataBackend {
public:
    virtual ~MetadataBackend() = default;
    // Name peers open this engine by.
    virtual const std::string &segment_name() const = 0;
    // Publish or replace this engine's descriptor.
    virtual Result<void> publish(const SegmentDescriptor &descriptor) = 0;
    // Stores that keep the descriptor in parts (etcd) are told what changed since the last
    // publish or publish_changes instead, in the order it happened, so a register costs O(1)
    // there; `generation` is the descriptor's after the changes. Called one at a time.
    virtual Result<void> publish_changes(uint64_t generation, std::span<const RegionChange> changes) {
        (void)generation;
        (void)changes;
        return fail(-ENOTSUP, "this metadata backend takes whole descriptors only");
    }
    // Backends that answer peers themselves (P2PHANDSHAKE: the engine's control server) take a
    // source they call per request instead, so registering memory costs nothing until a peer
    // asks, and a peer still sees every region registered before it asked. Returns true when
    // the backend serves from `source` from now on; then publish() is never needed. Stores that
    // peers read without asking us (etcd) return false and are published every change.
    using DescriptorSource = std::function<std::shared_ptr<const std::vector<uint8_t>>()>;
    virtual bool serve_on_demand(DescriptorSource source) {
        (void)source;
        return false;
    }
    virtual Result<SegmentDescriptor> fetch(const std::string &segment_name) = 0;
    // Called (from a backend thread) with the name of a segment whose descriptor changed, so
    // cached copies are re-read. Backends that cannot tell never call it.
    virtual void on_change(std::function<void(const std::string &)> listener) { (void)listener; }
};

class ControlServer;

// P2PHANDSHAKE serves descriptors from the engine's control server (its address is the
// segment name) and fetches them from peers' control servers, authenticated with `secret`
// (empty: none). Redis and HTTP name segments by the control server's address unless
// local_server_name is set; etcd ignores both.
Result<std::unique_ptr<MetadataBackend>> make_metadata_backend(const MetadataSettings &settings, ControlServer &control,
                                                               const std::string &secret);
Result<std::unique_ptr<MetadataBackend>> make_etcd_metadata(const MetadataSettings &settings);
// http://host:port/path (Mooncake's HTTP metadata server) and redis://[user[:password]@]host:port[/db];
// `default_name` is the segment name when local_server_name is empty.
Result<std::unique_ptr<MetadataBackend>> make_http_metadata(const MetadataSettings &settings,
                                                            const std::string &default_name);
Result<std::unique_ptr<MetadataBackend>> make_redis_metadata(const MetadataSettings &settings,
                                                             const std::string &default_name);

// The config key's field in `s`, or nullptr when `key` is not one of the redis_* keys.
std::string *redis_setting_field(RedisSettings &s, const std::string &key);
// Checks the redis_* keys against each other and the metadata URL, and reads
// redis_password_file into `password`.
Result<void> resolve_redis_settings(MetadataSettings &settings);
// A Redis database index (0, 1, ...); `origin` names where the text came from, for the error.
Result<int> parse_redis_db(const std::string &origin, const std::string &text);

}  // namespace ferry
