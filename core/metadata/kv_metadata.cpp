// The metadata backend over a plain key-value store (kv_store.hpp: Redis, Mooncake's HTTP
// metadata server). Such stores have no watches and, over HTTP, no leases, so one keeper thread
// per engine, every metadata_poll_ms (and, with leases, every third of the lease TTL):
//   - keeps this engine's segment: Redis extends both keys' TTL (PEXPIRE) and, like every store,
//     reads the stamp back, and the descriptor too while it is at most kVerifyBytes; a key gone
//     (the server restarted or was flushed) or a value that is not what it wrote (someone
//     overwrote it) makes it write descriptor and stamp again;
//   - polls the stamps of the segments this engine opened and reports a changed one through
//     on_change, so the engine re-reads that descriptor before its next op (a peer restarted
//     with new endpoints, or registered memory).
// A clean shutdown deletes both keys (if the stamp is still ours). With Redis a crashed engine's
// keys expire after the lease TTL; over HTTP they stay until an engine of that name starts again
// or someone deletes them, and peers' ops to it fail with the transport's connect error.
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "metadata/kv_store.hpp"
#include "metadata/metadata_retry.hpp"
#include "util/log.hpp"

namespace ferry {

Result<std::vector<std::optional<std::string>>> KvStore::get_many(const std::vector<std::string> &keys) {
    std::vector<std::optional<std::string>> out;
    out.reserve(keys.size());
    for (const auto &k : keys) {
        auto v = get(k);
        if (!v) return std::unexpected(v.error());
        out.push_back(std::move(*v));
    }
    return out;
}

namespace {

constexpr const char *kComponent = "metadata";
// Stamps read in one request while polling (Redis MGET; HTTP reads them one by one anyway).
constexpr size_t kPollBatch = 256;
// An engine reads its own descriptor back every poll, and writes it again if it differs, while
// it is this small (a few thousand regions); larger ones only by their stamp.
constexpr size_t kVerifyBytes = 256u << 10;

std::string random_instance() {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != sizeof v)
        v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^ getpid();
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) out[i] = digits[v & 15];
    return out;
}

// What is kept of a stamp seen: the value, or for one far longer than any stamp (a store that
// answers with something else) its length and hash, so a hostile store cannot make an engine
// keep its answers.
std::optional<std::string> fingerprint(std::optional<std::string> value) {
    if (!value || value->size() <= 64) return value;
    return cat("#", value->size(), ":", std::hash<std::string>{}(*value));
}

class KvMetadata final : public MetadataBackend {
public:
    KvMetadata(MetadataSettings settings, KvStoreInfo info, KvStoreFactory factory, std::string name)
        : settings_(std::move(settings)),
          info_(std::move(info)),
          factory_(std::move(factory)),
          name_(std::move(name)),
          segment_key_(kSegmentKeyPrefix + name_),
          stamp_key_(kStampKeyPrefix + name_),
          instance_(random_instance()),
          store_(factory_()) {}

    ~KvMetadata() override {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        stop_cv_.notify_all();
        if (keeper_.joinable()) keeper_.join();
        // Leave at once on a clean shutdown, unless the store is away (each call would wait out
        // the timeout) or another engine has taken the name over since.
        std::lock_guard lock(mutex_);
        if (written_stamp_.empty() || outage_) return;
        auto stamp = store_->get(stamp_key_);
        if (!stamp || !*stamp || **stamp != written_stamp_) return;
        auto a = published_ ? store_->remove(segment_key_) : Result<void>{};
        auto b = store_->remove(stamp_key_);
        if (!a || !b)
            FERRY_LOG(Debug, kComponent, "removing segment ", name_, " from ", info_.store, ": ",
                      (!a ? a.error() : b.error()).message);
    }

    // The first contact, with retries: connect (and log in), write our stamp, read it back. A
    // server that does not keep what it is given (the URL names some other HTTP service) fails
    // here, not at the first fetch.
    Result<void> start() {
        const std::string probe = cat(instance_, "-0");
        auto r = retry_at_start(
            info_.label, info_.store, kComponent, settings_.retry_for, info_.hint,
            [&]() -> Result<void> {
                std::lock_guard lock(mutex_);
                if (auto c = store_->check(); !c) return c;
                if (auto p = store_->put(stamp_key_, probe); !p) return p;
                auto back = store_->get(stamp_key_);
                if (!back) return std::unexpected(back.error());
                if (!*back || **back != probe)
                    return fail(-EPROTO, cat(info_.where, " does not keep what it is given: key ", stamp_key_,
                                             " read back ", *back ? "a different value" : "as missing",
                                             " right after it was written; point the metadata URL at a metadata "
                                             "server (Mooncake's serves http://host:port/metadata)"));
                written_stamp_ = probe;
                return {};
            },
            /*protocol_is_fatal=*/true);
        if (!r) return r;
        keeper_ = std::thread([this] { keeper_loop(); });
        return {};
    }

    const std::string &segment_name() const override { return name_; }

    Result<void> publish(const SegmentDescriptor &descriptor) override {
        std::lock_guard lock(mutex_);
        base_ = descriptor;
        base_.regions.clear();
        regions_.clear();
        for (const auto &r : descriptor.regions) regions_[r.addr] = r;
        published_ = true;
        write_or_defer_locked(*store_);
        return {};
    }

    // Whole descriptors only: every change writes all of it (one value, one request).
    Result<void> publish_changes(uint64_t generation, std::span<const RegionChange> changes) override {
        std::lock_guard lock(mutex_);
        for (const auto &c : changes) {
            if (c.region) regions_[c.addr] = *c.region;
            else regions_.erase(c.addr);
        }
        base_.generation = generation;
        // After a failed write the keeper writes it all again; until then changes only gather,
        // so registering does not wait out the timeout of a store that is away.
        if (!dirty_) write_or_defer_locked(*store_);
        return {};
    }

    Result<SegmentDescriptor> fetch(const std::string &name) override {
        if (name.empty() || name.size() > kMaxNameBytes)
            return fail(-EINVAL, cat("segment name '", name.substr(0, 64), "' must be 1..", kMaxNameBytes, " bytes"));
        const std::string key = kSegmentKeyPrefix + name;
        Result<std::vector<std::optional<std::string>>> got;
        {
            std::lock_guard lock(mutex_);
            // The stamp first: the descriptor read after it is at least as new.
            got = store_->get_many({kStampKeyPrefix + name, key});
        }
        if (!got)
            return fail(got.error().code, cat("cannot fetch segment '", name, "' from ", info_.store, " ", info_.where,
                                              ": ", got.error().message));
        if (!(*got)[1])
            return fail(-ENOENT, cat("segment '", name, "' is not registered in ", info_.store, " ", info_.where,
                                     " (no key ", key, ": not started yet, or its engine stopped",
                                     info_.leases ? ", or died and its lease expired" : "", ")"));
        const std::string &bytes = *(*got)[1];
        auto d = decode_descriptor({reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size()});
        if (!d)
            return fail(-EPROTO, cat("segment '", name, "' in ", info_.store, " ", info_.where,
                                     " is not a Ferry segment descriptor (", d.error().message, "); key ", key,
                                     " was written by something other than a Ferry engine"));
        if (d->name != name)
            return fail(-EPROTO, cat("key ", key, " in ", info_.store, " ", info_.where,
                                     " holds the descriptor of segment '", d->name.substr(0, 64), "', not '", name,
                                     "'; it was copied or written by something other than its engine"));
        std::lock_guard lock(watch_mutex_);
        watched_[name] = fingerprint(std::move((*got)[0]));
        return d;
    }

    void on_change(std::function<void(const std::string &)> listener) override {
        std::lock_guard lock(listener_mutex_);
        listener_ = std::move(listener);
    }

private:
    // Descriptor first, stamp after it.
    Result<void> write_locked(KvStore &store) {
        SegmentDescriptor d = base_;
        d.regions.reserve(regions_.size());
        for (const auto &[_, r] : regions_) d.regions.push_back(r);
        auto bytes = encode_descriptor(d);
        const std::string stamp = cat(instance_, "-", d.generation);
        std::string value(bytes.begin(), bytes.end());
        if (auto r = store.put(segment_key_, value); !r) return r;
        if (auto r = store.put(stamp_key_, stamp); !r) return r;
        written_stamp_ = stamp;
        written_descriptor_ = value.size() <= kVerifyBytes ? std::move(value) : std::string();
        dirty_ = false;
        return {};
    }

    void write_or_defer_locked(KvStore &store) {
        if (auto r = write_locked(store); !r) {
            dirty_ = true;
            FERRY_LOG(Warn, kComponent, "publishing segment ", name_, " in ", info_.store, " failed (",
                      r.error().message, "); will retry every ", settings_.poll.count(), " ms");
        }
    }

    // Our own keys: whether they are gone or not ours, and why (empty: they are fine). The
    // descriptor itself is compared too when it is small enough (`descriptor` not empty).
    Result<std::string> check_own(KvStore &store, const std::string &stamp, const std::string &descriptor) {
        auto alive = store.touch(segment_key_);
        if (!alive) return std::unexpected(alive.error());
        auto stamp_alive = store.touch(stamp_key_);
        if (!stamp_alive) return std::unexpected(stamp_alive.error());
        std::vector<std::string> keys{stamp_key_};
        if (!descriptor.empty()) keys.push_back(segment_key_);
        auto got = store.get_many(keys);
        if (!got) return std::unexpected(got.error());
        const auto &now = *got;
        if (!*alive || !*stamp_alive || !now[0] || (keys.size() > 1 && !now[1]))
            return std::string("it was missing: the store restarted or was flushed");
        if (*now[0] != stamp)
            return cat("its stamp read '", now[0]->substr(0, 40), "', not ours ('", stamp,
                       "'): another writer replaced it (two engines named ", name_, "?)");
        if (keys.size() > 1 && *now[1] != descriptor)
            return std::string("its descriptor was not the one this engine wrote: another writer replaced it");
        return std::string();
    }

    // Reports the opened segments whose stamp changed since it was last seen.
    Result<void> poll_peers(KvStore &store) {
        std::vector<std::string> names;
        {
            std::lock_guard lock(watch_mutex_);
            for (const auto &[n, _] : watched_) names.push_back(n);
        }
        std::vector<std::string> changed;
        for (size_t at = 0; at < names.size(); at += kPollBatch) {
            std::vector<std::string> keys;
            for (size_t i = at; i < std::min(names.size(), at + kPollBatch); ++i)
                keys.push_back(kStampKeyPrefix + names[i]);
            auto got = store.get_many(keys);
            if (!got) return std::unexpected(got.error());
            std::lock_guard lock(watch_mutex_);
            for (size_t i = 0; i < keys.size(); ++i) {
                auto it = watched_.find(names[at + i]);
                auto seen = fingerprint(std::move((*got)[i]));
                if (it == watched_.end() || it->second == seen) continue;
                it->second = std::move(seen);
                changed.push_back(it->first);
            }
        }
        for (const auto &n : changed) {
            FERRY_LOG(Debug, kComponent, "segment ", n, " changed in ", info_.store);
            std::lock_guard lock(listener_mutex_);
            if (listener_) listener_(n);
        }
        return {};
    }

    void keeper_loop() {
        auto store = factory_();
        auto period = settings_.poll;
        if (info_.leases)
            period = std::min(period, std::chrono::milliseconds(std::max(200, settings_.lease_ttl_s * 1000 / 3)));
        std::unique_lock lock(mutex_);
        while (!stop_cv_.wait_for(lock, period, [&] { return stop_; })) {
            const bool check = published_ && !dirty_;
            const std::string expected = written_stamp_;
            const std::string expected_descriptor = written_descriptor_;
            lock.unlock();
            // Reads run without the lock: publishing and fetching go on while a slow store answers.
            Result<std::string> why = std::string();
            if (check) why = check_own(*store, expected, expected_descriptor);
            auto polled = why ? poll_peers(*store) : Result<void>{};
            lock.lock();
            if (stop_) break;
            const Error *down = !why ? &why.error() : !polled ? &polled.error() : nullptr;
            if (down) {
                if (!outage_)
                    FERRY_LOG(Warn, kComponent, info_.store, " ", info_.where, " unreachable (", down->message,
                              "); will register segment ", name_, " again when it answers");
                outage_ = true;
                continue;
            }
            // A publish since the check wrote everything anyway.
            const bool lost = why && !why->empty() && written_stamp_ == expected;
            if (published_ && (dirty_ || lost)) {
                if (auto r = write_locked(*store); !r) {
                    dirty_ = true;
                    if (!outage_)
                        FERRY_LOG(Warn, kComponent, "registering segment ", name_, " again in ", info_.store,
                                  " failed: ", r.error().message);
                    outage_ = true;
                    continue;
                }
                FERRY_LOG(Info, kComponent, "segment ", name_, " registered again in ", info_.store,
                          lost ? cat(" (", *why, ")") : std::string());
            }
            if (outage_) FERRY_LOG(Info, kComponent, info_.store, " reachable again");
            outage_ = false;
        }
    }

    const MetadataSettings settings_;
    const KvStoreInfo info_;
    const KvStoreFactory factory_;
    const std::string name_;
    const std::string segment_key_, stamp_key_;
    const std::string instance_;  // this engine process, in its stamps

    std::mutex mutex_;  // store_, base_, regions_, written_stamp_, published_, dirty_, outage_, stop_
    std::condition_variable stop_cv_;
    std::unique_ptr<KvStore> store_;
    SegmentDescriptor base_;  // regions empty
    std::map<uint64_t, RegionDescriptor> regions_;
    std::string written_stamp_;       // what our stamp key holds, as far as we know (empty: nothing written)
    std::string written_descriptor_;  // what our segment key holds, when at most kVerifyBytes
    bool published_ = false;
    bool dirty_ = false;   // the last write failed: the keeper writes everything again
    bool outage_ = false;  // the keeper could not reach the store last time
    bool stop_ = false;

    std::mutex watch_mutex_;
    std::map<std::string, std::optional<std::string>> watched_;  // opened segment -> its stamp last seen
    std::mutex listener_mutex_;  // held while the listener runs, never with another of ours
    std::function<void(const std::string &)> listener_;

    std::thread keeper_;
};

}  // namespace

Result<std::unique_ptr<KvStore>> make_kv_store(const MetadataSettings &settings) {
    const bool redis = settings.url.rfind("redis://", 0) == 0 || settings.url.rfind("rediss://", 0) == 0;
    auto maker = redis ? redis_store(settings) : http_store(settings);
    if (!maker) return std::unexpected(maker.error());
    return maker->factory();
}

Result<std::unique_ptr<MetadataBackend>> make_kv_metadata(const MetadataSettings &settings, KvStoreInfo info,
                                                          KvStoreFactory factory, std::string name) {
    if (name.size() > kMaxNameBytes)
        return fail(-EINVAL, cat("local_server_name is ", name.size(), " bytes; use at most ", kMaxNameBytes));
    auto backend = std::make_unique<KvMetadata>(settings, std::move(info), std::move(factory), std::move(name));
    if (auto r = backend->start(); !r) return std::unexpected(r.error());
    return std::unique_ptr<MetadataBackend>(std::move(backend));
}

}  // namespace ferry
