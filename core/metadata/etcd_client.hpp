// Requests to an etcd cluster over its v3 JSON gateway: every endpoint in turn, over TLS for
// etcds://, and with etcd's user/password authentication when etcd_user is set (a token from
// /v3/auth/authenticate in the Authorization header, fetched again when etcd calls it invalid,
// e.g. after its --auth-token-ttl or an etcd restart). The password is never logged.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/result.hpp"
#include "metadata/http_client.hpp"
#include "metadata/metadata.hpp"

namespace ferry {

// The config key's field in `s`, or nullptr when `key` is not one of the etcd_* security keys.
std::string *etcd_security_field(EtcdSecurity &s, const std::string &key);

// Checks the etcd_* keys against each other and against the metadata URL (TLS files need
// etcds://; a certificate needs its key; a user needs exactly one password source), that the
// files are readable, and reads etcd_password_file into `password`.
Result<void> resolve_etcd_security(MetadataSettings &settings);

class EtcdClient {
public:
    EtcdClient(std::vector<std::string> endpoints, EtcdSecurity security, std::chrono::milliseconds timeout);

    HttpTls tls() const;
    bool authenticates() const { return !security_.user.empty(); }

    // POSTs `body` to `path` on the first endpoint that answers (starting with the one that
    // answered last), authenticating first and once more if etcd rejects the token.
    Result<std::string> call(HttpClient &http, const std::string &path, const std::string &body);

    // A watch stream on the i-th endpoint counted from the one that answered last: `on_data`
    // gets each chunk until the stream ends or it returns false. The caller hands a cancel
    // reason that names the token to forget_token().
    Result<void> stream(HttpClient &http, size_t i, const std::string &path, const std::string &body,
                        const std::atomic<bool> &stop, const std::function<bool(std::string_view)> &on_data);
    size_t endpoint_count() const { return endpoints_.size(); }

    // Drops the cached token (if it is still `token`), so the next request authenticates.
    void forget_token(const std::string &token);
    // The token requests carry now (authenticating if there is none); empty without etcd_user.
    Result<std::string> token(HttpClient &http);

private:
    Result<std::string> post_any(HttpClient &http, const std::string &path, const std::string &body,
                                 const std::string &token);
    Result<std::string> authenticate(HttpClient &http);
    Error explain(const Error &e) const;

    std::vector<std::string> endpoints_;
    EtcdSecurity security_;
    std::chrono::milliseconds timeout_;
    std::atomic<size_t> good_endpoint_{0};

    std::mutex token_mutex_;  // held while authenticating, so threads share one new token
    std::string token_;
};

// True when an etcd answer (an error message or a watch's cancel_reason) says the token is
// missing, expired or unknown.
bool etcd_token_rejected(std::string_view text);

}  // namespace ferry
