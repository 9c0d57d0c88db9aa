// Metadata in Redis: redis://[user[:password]@]host[:port][/db] (port 6379 unless given, db 0
// unless the path or redis_db says). Both keys of a segment (kv_store.hpp) are written with
// SET ... PX <lease TTL> and kept alive with PEXPIRE by the keeper (kv_metadata.cpp), so a crashed
// engine's segment leaves Redis after etcd_lease_ttl_s, as with etcd's leases. Credentials come
// from redis_user / redis_password_file / redis_password or from the URL (not both); the
// password is never logged.
#include <cerrno>
#include <charconv>

#include "control/auth.hpp"
#include "metadata/kv_store.hpp"
#include "metadata/redis_client.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// %XX escapes, as a password with '@' or ':' must be written in a URL.
Result<std::string> url_unescape(const std::string &text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out += text[i];
            continue;
        }
        int v = 0;
        if (i + 2 >= text.size() ||
            std::from_chars(text.data() + i + 1, text.data() + i + 3, v, 16).ptr != text.data() + i + 3)
            return fail(-EINVAL, "a '%' in the metadata URL's user or password is not followed by two hex digits");
        out += static_cast<char>(v);
        i += 2;
    }
    return out;
}

struct RedisUrl {
    std::string host, user, password, where;
    uint16_t port = 6379;
    std::optional<int> db;
};

Result<RedisUrl> parse_redis_url(const std::string &url) {
    RedisUrl out;
    std::string rest = url.substr(std::string("redis://").size());
    auto path_at = rest.find_first_of("/?#");
    std::string authority = rest.substr(0, path_at), path = path_at == std::string::npos ? "" : rest.substr(path_at);
    auto at = authority.rfind('@');
    std::string userinfo = at == std::string::npos ? "" : authority.substr(0, at);
    std::string hostport = at == std::string::npos ? authority : authority.substr(at + 1);
    out.where = "redis://" +
                (at == std::string::npos ? ""
                                         : userinfo.substr(0, userinfo.find(':')) +
                                               (userinfo.find(':') == std::string::npos ? "" : ":***") + "@") +
                hostport + path;
    auto bad = [&](const std::string &why) {
        return fail(-EINVAL, cat("metadata '", out.where, "': ", why,
                                 "; write redis://[user[:password]@]host:port[/db], e.g. redis://10.0.0.5:6379/0"));
    };
    if (!userinfo.empty()) {
        auto colon = userinfo.find(':');
        auto user = url_unescape(userinfo.substr(0, colon));
        auto password = url_unescape(colon == std::string::npos ? "" : userinfo.substr(colon + 1));
        if (!user || !password) return bad((!user ? user : password).error().message);
        out.user = std::move(*user);
        out.password = std::move(*password);
    }
    std::string port_text;
    if (!hostport.empty() && hostport[0] == '[') {
        auto close = hostport.find(']');
        if (close == std::string::npos) return bad("an IPv6 address lacks its ']'");
        out.host = hostport.substr(1, close - 1);
        if (close + 1 < hostport.size()) {
            if (hostport[close + 1] != ':') return bad("junk after the IPv6 address");
            port_text = hostport.substr(close + 2);
        }
    } else {
        auto colon = hostport.rfind(':');
        out.host = hostport.substr(0, colon);
        if (colon != std::string::npos) port_text = hostport.substr(colon + 1);
    }
    if (out.host.empty()) return bad("no host");
    if (!port_text.empty() || hostport.back() == ':') {
        unsigned v = 0;
        auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), v);
        if (ec != std::errc() || ptr != port_text.data() + port_text.size() || v == 0 || v > 65535)
            return bad(cat("port '", port_text, "' is not 1..65535"));
        out.port = static_cast<uint16_t>(v);
    }
    if (!path.empty() && path[0] != '/') return bad("a query or fragment is not understood");
    if (path.size() > 1) {
        auto db = parse_redis_db("the URL's database", path.substr(1));
        if (!db) return bad(db.error().message);
        out.db = *db;
    }
    return out;
}

class RedisStore final : public KvStore {
public:
    RedisStore(RedisTarget target, std::chrono::milliseconds timeout, int lease_ttl_s)
        : client_(std::move(target), timeout), ttl_ms_(std::to_string(int64_t{lease_ttl_s} * 1000)) {}

    Result<void> check() override { return client_.connect(); }

    Result<std::optional<std::string>> get(const std::string &key) override {
        auto r = command({"GET", key}, "GET");
        if (!r) return std::unexpected(r.error());
        if (r->type == RedisReply::Type::Nil) return std::optional<std::string>();
        if (r->type != RedisReply::Type::String) return std::unexpected(unexpected("GET"));
        return std::optional<std::string>(std::move(r->str));
    }

    Result<std::vector<std::optional<std::string>>> get_many(const std::vector<std::string> &keys) override {
        std::vector<std::string> args{"MGET"};
        args.insert(args.end(), keys.begin(), keys.end());
        auto r = command(std::move(args), "MGET");
        if (!r) return std::unexpected(r.error());
        if (r->type != RedisReply::Type::Array || r->elements.size() != keys.size())
            return std::unexpected(unexpected("MGET"));
        std::vector<std::optional<std::string>> out;
        for (auto &e : r->elements) {
            if (e.type == RedisReply::Type::String) out.emplace_back(std::move(e.str));
            else if (e.type == RedisReply::Type::Nil) out.emplace_back();
            else return std::unexpected(unexpected("MGET"));
        }
        return out;
    }

    Result<void> put(const std::string &key, const std::string &value) override {
        auto r = command({"SET", key, value, "PX", ttl_ms_}, "SET");
        if (!r) return std::unexpected(r.error());
        if (r->type != RedisReply::Type::Status) return std::unexpected(unexpected("SET"));
        return {};
    }

    Result<bool> touch(const std::string &key) override {
        auto r = command({"PEXPIRE", key, ttl_ms_}, "PEXPIRE");
        if (!r) return std::unexpected(r.error());
        if (r->type != RedisReply::Type::Integer) return std::unexpected(unexpected("PEXPIRE"));
        return r->integer == 1;
    }

    Result<void> remove(const std::string &key) override {
        auto r = command({"DEL", key}, "DEL");
        if (!r) return std::unexpected(r.error());
        return {};
    }

private:
    // One command; an error reply becomes an error naming the command and what to do.
    Result<RedisReply> command(std::vector<std::string> args, const char *name) {
        auto r = client_.command(std::move(args));
        if (!r) return r;
        if (r->type != RedisReply::Type::Error) return r;
        const std::string &e = r->str;
        const std::string where =
            cat("Redis at ", client_.target().where, " refused ", name, " (", e.substr(0, 200), ")");
        if (e.rfind("READONLY", 0) == 0)
            return fail(-EROFS, cat(where, ": it is a read-only replica; point redis:// at the primary"));
        if (e.rfind("NOAUTH", 0) == 0 || e.rfind("NOPERM", 0) == 0 || e.rfind("WRONGPASS", 0) == 0)
            return fail(-EACCES, cat(where, ": give redis_user a role that may read and write the keys ferry/*"));
        if (e.rfind("OOM", 0) == 0) return fail(-ENOSPC, cat(where, ": Redis is full (maxmemory)"));
        return fail(-EPROTO, where);
    }

    Error unexpected(const char *name) const {
        return {-EPROTO, cat("Redis at ", client_.target().where, " answered ", name,
                             " with a reply of the wrong type: is it a Redis server?")};
    }

    RedisClient client_;
    std::string ttl_ms_;
};

}  // namespace

Result<KvStoreMaker> redis_store(const MetadataSettings &settings) {
    if (settings.url.rfind("rediss://", 0) == 0)
        return fail(-EPROTONOSUPPORT,
                    "metadata 'rediss://...': Redis over TLS is not supported; use redis:// on a "
                    "private network, or a TLS tunnel (stunnel, spiped) ending on this host");
    auto url = parse_redis_url(settings.url);
    if (!url) return std::unexpected(url.error());
    const RedisSettings &s = settings.redis;
    RedisTarget t;
    t.host = url->host;
    t.port = url->port;
    t.where = url->where;
    if (!url->user.empty() && !s.user.empty() && url->user != s.user)
        return fail(-EINVAL, cat("metadata '", t.where, "' names user '", url->user, "' and redis_user says '", s.user,
                                 "'; give the user in one place"));
    if (!url->password.empty() && !s.password.empty())
        return fail(-EINVAL, cat("metadata '", t.where,
                                 "' carries a password and redis_password or redis_password_file is set too; give the "
                                 "password in one place (preferably redis_password_file)"));
    t.user = s.user.empty() ? url->user : s.user;
    t.password = s.password.empty() ? url->password : s.password;
    t.password_origin = !s.password_file.empty() ? cat("redis_password_file '", s.password_file, "'")
                        : !s.password.empty()    ? std::string("redis_password")
                                                 : std::string("the password in the metadata URL");
    if (!t.user.empty() && t.password.empty())
        return fail(-EINVAL,
                    cat("Redis user '", t.user, "' needs its password: set redis_password_file (or redis_password)"));
    int db = url->db.value_or(0);
    if (!s.db.empty()) {
        int key_db = *parse_redis_db("config key 'redis_db'", s.db);
        if (url->db && *url->db != key_db)
            return fail(-EINVAL, cat("metadata '", t.where, "' selects database ", *url->db, " and redis_db says ",
                                     key_db, "; give the database in one place"));
        db = key_db;
    }
    t.db = db;
    if (auto why = hiredis_error(); !why.empty()) return fail(-ENOENT, why);
    KvStoreInfo info{"Redis", "Redis metadata", t.where, "check the redis:// address and that redis-server runs", true};
    auto timeout = settings.timeout;
    int ttl = settings.lease_ttl_s;
    return KvStoreMaker{std::move(info), [t, timeout, ttl]() -> std::unique_ptr<KvStore> {
                            return std::make_unique<RedisStore>(t, timeout, ttl);
                        }};
}

Result<std::unique_ptr<MetadataBackend>> make_redis_metadata(const MetadataSettings &settings,
                                                             const std::string &default_name) {
    auto maker = redis_store(settings);
    if (!maker) return std::unexpected(maker.error());
    std::string name = settings.local_server_name.empty() ? default_name : settings.local_server_name;
    return make_kv_metadata(settings, std::move(maker->info), std::move(maker->factory), std::move(name));
}

}  // namespace ferry
