// Metadata kept in a plain key-value store that has no watches and no multi-key transactions:
// Redis (redis_client.hpp) and Mooncake's HTTP metadata server (http_metadata.cpp). Each
// engine writes two keys (kv_metadata.cpp):
//   ferry/segments/<segment name>   the whole segment descriptor (descriptor.hpp), binary
//   ferry/stamps/<segment name>     "<instance>-<generation>": which engine process wrote it
//                                   (16 random hex digits) and the descriptor's generation
// The descriptor goes first and the stamp after it, so a reader that saw a stamp finds a
// descriptor at least that new. Engines poll the stamps of the segments they opened, a few bytes
// each, to learn that one changed (a register, a restart) without reading whole descriptors,
// and their own (with the descriptor, while it is small), to write both again when the store
// lost them (a restart, FLUSHALL) or someone else wrote them. Mooncake keeps its own keys (mooncake/...), so both can share one server.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/result.hpp"
#include "metadata/metadata.hpp"

namespace ferry {

inline const std::string kSegmentKeyPrefix = "ferry/segments/";
inline const std::string kStampKeyPrefix = "ferry/stamps/";

// One connection's worth of a store: not thread-safe, so each thread that talks to the store
// has its own. Every call ends within the metadata timeout. Errors name the store's URL.
class KvStore {
public:
    virtual ~KvStore() = default;
    // Whatever the store needs before the first call (Redis: connect, AUTH, SELECT), then a
    // round trip; -EACCES and -EINVAL are not cured by retrying.
    virtual Result<void> check() = 0;
    // nullopt: no such key.
    virtual Result<std::optional<std::string>> get(const std::string &key) = 0;
    // In order; Redis reads them at one instant (MGET).
    virtual Result<std::vector<std::optional<std::string>>> get_many(const std::vector<std::string> &keys);
    // With leases (Redis) the key expires after the lease TTL unless touched again.
    virtual Result<void> put(const std::string &key, const std::string &value) = 0;
    // Extends the key's lease; false when the key is gone. Stores without leases: true.
    virtual Result<bool> touch(const std::string &key) {
        (void)key;
        return true;
    }
    virtual Result<void> remove(const std::string &key) = 0;
};

// What the backend says about its store in messages.
struct KvStoreInfo {
    std::string store;  // "Redis", "HTTP metadata server"
    std::string label;  // what errors start with: "Redis metadata", "HTTP metadata"
    std::string where;  // the URL, a password in it replaced by ***
    std::string hint;   // how to fix an unreachable store
    bool leases = false;
};

using KvStoreFactory = std::function<std::unique_ptr<KvStore>()>;

// A store as the URL says, and what to say about it: http_metadata.cpp, redis_metadata.cpp.
struct KvStoreMaker {
    KvStoreInfo info;
    KvStoreFactory factory;
};
Result<KvStoreMaker> http_store(const MetadataSettings &settings);
Result<KvStoreMaker> redis_store(const MetadataSettings &settings);

// Makes a store as the metadata URL says (redis:// or http(s)://); for tests and tools that
// read or plant keys themselves.
Result<std::unique_ptr<KvStore>> make_kv_store(const MetadataSettings &settings);

// The backend over a store: probes it at start with retries (metadata_retry.hpp), then keeps
// this engine's segment published and polls the segments it opened every settings.poll.
Result<std::unique_ptr<MetadataBackend>> make_kv_metadata(const MetadataSettings &settings, KvStoreInfo info,
                                                          KvStoreFactory factory, std::string name);

}  // namespace ferry
