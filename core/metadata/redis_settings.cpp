// The redis_* engine keys: parsed with the engine's configuration (config.cpp) and checked
// before any backend starts, apart from the Redis backend itself (redis_metadata.cpp), so code
// that parses configurations (ferry-info, the config fuzz target) needs no Redis client.
#include <cerrno>
#include <charconv>

#include "control/auth.hpp"
#include "metadata/metadata.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

bool is_redis_url(const std::string &url) { return url.rfind("redis://", 0) == 0 || url.rfind("rediss://", 0) == 0; }

}  // namespace

Result<int> parse_redis_db(const std::string &origin, const std::string &text) {
    int v = -1;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < 0)
        return fail(-EINVAL, cat(origin, " '", text, "' is not a Redis database index (0, 1, ...)"));
    return v;
}

std::string *redis_setting_field(RedisSettings &s, const std::string &key) {
    if (key == "redis_user") return &s.user;
    if (key == "redis_password") return &s.password;
    if (key == "redis_password_file") return &s.password_file;
    if (key == "redis_db") return &s.db;
    return nullptr;
}

Result<void> resolve_redis_settings(MetadataSettings &settings) {
    RedisSettings &s = settings.redis;
    if ((!s.user.empty() || !s.password.empty() || !s.password_file.empty() || !s.db.empty()) &&
        !is_redis_url(settings.url))
        return fail(-EINVAL, cat("config keys redis_* are set but metadata is not a redis:// address; remove them or "
                                 "point metadata at Redis"));
    if (!s.password.empty() && !s.password_file.empty())
        return fail(-EINVAL, "config keys 'redis_password' and 'redis_password_file' are both set; set one of them");
    if (!s.db.empty())
        if (auto db = parse_redis_db("config key 'redis_db'", s.db); !db) return std::unexpected(db.error());
    if (!s.password_file.empty()) {
        auto p = read_secret_file(s.password_file, "config key 'redis_password_file'", "Redis password");
        if (!p) return std::unexpected(p.error());
        if (p->empty()) return fail(-EINVAL, cat("the Redis password file '", s.password_file, "' is empty"));
        s.password = std::move(*p);
    }
    return {};
}

}  // namespace ferry
