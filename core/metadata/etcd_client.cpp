#include "metadata/etcd_client.hpp"

#include <cerrno>
#include <cstring>

#include "control/auth.hpp"
#include "metadata/etcd_json.hpp"
#include "util/file_trust.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

bool has(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

}  // namespace

bool etcd_token_rejected(std::string_view text) {
    return has(text, "invalid auth token") || has(text, "user name is empty") || has(text, "HTTP 401");
}

std::string *etcd_security_field(EtcdSecurity &s, const std::string &key) {
    if (key == "etcd_ca_file") return &s.ca_file;
    if (key == "etcd_cert_file") return &s.cert_file;
    if (key == "etcd_key_file") return &s.key_file;
    if (key == "etcd_user") return &s.user;
    if (key == "etcd_password") return &s.password;
    if (key == "etcd_password_file") return &s.password_file;
    return nullptr;
}

Result<void> resolve_etcd_security(MetadataSettings &settings) {
    EtcdSecurity &s = settings.etcd;
    const bool tls_keys = !s.ca_file.empty() || !s.cert_file.empty() || !s.key_file.empty();
    const bool auth_keys = !s.user.empty() || !s.password.empty() || !s.password_file.empty();
    const bool etcd = settings.url.rfind("etcd://", 0) == 0, etcds = settings.url.rfind("etcds://", 0) == 0;
    if ((tls_keys || auth_keys) && !etcd && !etcds)
        return fail(-EINVAL, cat("config keys etcd_* are set but metadata is '", settings.url,
                                 "', not an etcd:// or etcds:// address; remove them or point metadata at etcd"));
    if (tls_keys && etcd)
        return fail(-EINVAL, cat("etcd TLS files (etcd_ca_file, etcd_cert_file, etcd_key_file) are set but metadata '",
                                 settings.url, "' is plain HTTP; write etcds://", settings.url.substr(7),
                                 " to reach etcd over TLS"));
    if (s.cert_file.empty() != s.key_file.empty())
        return fail(-EINVAL,
                    "config keys 'etcd_cert_file' and 'etcd_key_file' go together: set both (a client "
                    "certificate and its private key) or neither");
    // Checked as a plugin is (file_trust.hpp): a CA file others could change lets them vouch for
    // any etcd. curl opens them again by path, which no other user can redirect once every
    // directory above is trusted. The private key is warned about when others may read it.
    struct TlsFile {
        const char *key;
        const std::string *path;
        const char *what;
        Secrecy secrecy;
    };
    for (const auto &f : {TlsFile{"etcd_ca_file", &s.ca_file, "etcd CA certificate", Secrecy::Public},
                          TlsFile{"etcd_cert_file", &s.cert_file, "etcd client certificate", Secrecy::Public},
                          TlsFile{"etcd_key_file", &s.key_file, "etcd private key", Secrecy::Secret}})
        if (!f.path->empty())
            if (auto file = open_private_file(*f.path, cat("config key '", f.key, "'"), f.what, f.secrecy); !file)
                return std::unexpected(file.error());
    if (!s.password.empty() && !s.password_file.empty())
        return fail(-EINVAL, "config keys 'etcd_password' and 'etcd_password_file' are both set; set one of them");
    if (s.user.empty() && (!s.password.empty() || !s.password_file.empty()))
        return fail(-EINVAL, "an etcd password is set but 'etcd_user' is not; set the etcd user it belongs to");
    if (!s.user.empty() && s.password.empty() && s.password_file.empty())
        return fail(-EINVAL, cat("config key 'etcd_user' = '", s.user,
                                 "' needs its password: set 'etcd_password_file' (or 'etcd_password')"));
    if (!s.password_file.empty()) {
        auto p = read_secret_file(s.password_file, "config key 'etcd_password_file'", "etcd password");
        if (!p) return std::unexpected(p.error());
        if (p->empty()) return fail(-EINVAL, cat("the etcd password file '", s.password_file, "' is empty"));
        s.password = std::move(*p);
    }
    return {};
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, EtcdSecurity security, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)), security_(std::move(security)), timeout_(timeout) {}

HttpTls EtcdClient::tls() const { return {security_.ca_file, security_.cert_file, security_.key_file}; }

Result<std::string> EtcdClient::post_any(HttpClient &http, const std::string &path, const std::string &body,
                                         const std::string &token) {
    Error last{-ECONNREFUSED, "no etcd endpoint"};
    for (size_t k = 0; k < endpoints_.size(); ++k) {
        size_t i = (good_endpoint_ + k) % endpoints_.size();
        auto r = http.post(endpoints_[i] + path, body, timeout_, token);
        if (r) {
            good_endpoint_ = i;
            return r;
        }
        last = r.error();
        // etcd refused the request itself: another member would say the same.
        if (has(last.message, ": HTTP 4")) break;
    }
    return std::unexpected(explain(last));
}

// Adds what to set when etcd refuses for want of credentials.
Error EtcdClient::explain(const Error &e) const {
    if (has(e.message, "user name is empty") && security_.user.empty())
        return {-EACCES, cat(e.message, "; etcd has authentication enabled: set etcd_user and etcd_password_file")};
    if (has(e.message, "https://") && has(e.message, "\"connection closed\""))
        return {e.code, cat(e.message,
                            "; etcd's JSON gateway cannot reach its own member: with --client-cert-auth, etcd's "
                            "server certificate must allow client use too (extendedKeyUsage serverAuth, clientAuth)")};
    if (has(e.message, "permission denied"))
        return {-EACCES, cat(e.message, "; grant etcd user '", security_.user,
                             "' a role with READWRITE on Ferry's key prefix (etcdctl role grant-permission --prefix)")};
    return e;
}

Result<std::string> EtcdClient::authenticate(HttpClient &http) {
    const std::string body = etcd_json::text({{"name", security_.user}, {"password", security_.password}});
    auto r = post_any(http, "/v3/auth/authenticate", body, {});
    if (!r) {
        const std::string source = security_.password_file.empty()
                                       ? std::string("etcd_password")
                                       : cat("etcd_password_file '", security_.password_file, "'");
        if (has(r.error().message, "authentication failed"))
            return fail(-EACCES, cat("etcd refused user '", security_.user, "': wrong user or password (",
                                     r.error().message, "); check etcd_user and ", source));
        if (has(r.error().message, "authentication is not enabled"))
            return fail(-EACCES, cat("etcd_user '", security_.user, "' is set but etcd has authentication disabled (",
                                     r.error().message, "); unset etcd_user or run `etcdctl auth enable`"));
        return fail(r.error().code, cat("authenticating to etcd as '", security_.user, "': ", r.error().message));
    }
    if (auto answer = etcd_json::parse(*r))
        if (std::string token = etcd_json::string_or(*answer, {"token"}, ""); !token.empty()) return token;
    return fail(-EPROTO, "etcd answered /v3/auth/authenticate without a token");
}

Result<std::string> EtcdClient::token(HttpClient &http) {
    if (!authenticates()) return std::string();
    std::lock_guard lock(token_mutex_);
    if (token_.empty()) {
        auto t = authenticate(http);
        if (!t) return t;
        token_ = std::move(*t);
        FERRY_LOG(Debug, "etcd", "authenticated to etcd as ", security_.user);
    }
    return token_;
}

void EtcdClient::forget_token(const std::string &token) {
    std::lock_guard lock(token_mutex_);
    if (token_ == token) token_.clear();
}

Result<std::string> EtcdClient::call(HttpClient &http, const std::string &path, const std::string &body) {
    for (int attempt = 0;; ++attempt) {
        auto t = token(http);
        if (!t) return std::unexpected(t.error());
        auto r = post_any(http, path, body, *t);
        if (r || attempt > 0 || !authenticates() || !etcd_token_rejected(r.error().message)) return r;
        // Expired (--auth-token-ttl) or unknown after an etcd restart: authenticate again.
        FERRY_LOG(Debug, "etcd", "etcd rejected the auth token; authenticating again");
        forget_token(*t);
    }
}

Result<void> EtcdClient::stream(HttpClient &http, size_t i, const std::string &path, const std::string &body,
                                const std::atomic<bool> &stop, const std::function<bool(std::string_view)> &on_data) {
    auto t = token(http);
    if (!t) return std::unexpected(t.error());
    // From the member that answered last: with etcd's simple tokens (kept per member) that is
    // the member that issued this one.
    return http.stream(endpoints_[(good_endpoint_ + i) % endpoints_.size()] + path, body, stop, on_data, *t);
}

}  // namespace ferry
