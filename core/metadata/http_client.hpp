// Minimal HTTP(S) over libcurl: POST for etcd's JSON gateway, one request at a time per client,
// plus a streaming variant for watches, and GET/PUT/DELETE for Mooncake's HTTP metadata server.
// https:// always verifies the server's certificate and host name (there is no "insecure"
// switch); a TLS failure says which file to set.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "ferry/result.hpp"

struct curl_slist;  // libcurl's header list

namespace ferry {

// Files for https:// (PEM). Empty ca_file: the system's CA store.
struct HttpTls {
    std::string ca_file;
    std::string cert_file;  // client certificate, for servers that require one
    std::string key_file;
    // Whose server this is, for TLS messages: "etcd" names the etcd_* keys that fix them.
    std::string service = "etcd";
};

// An answer of any HTTP status.
struct HttpResponse {
    long status = 0;
    std::string body;
};

class HttpClient {
public:
    explicit HttpClient(HttpTls tls = {});
    ~HttpClient();
    HttpClient(const HttpClient &) = delete;
    HttpClient &operator=(const HttpClient &) = delete;

    // POST a JSON body; the response body on HTTP 200, an error naming the URL otherwise
    // (-EACCES for HTTP 401 and for TLS refusals, which retrying does not cure). A non-empty
    // `authorization` is sent as the Authorization header. The body is never put in a message.
    Result<std::string> post(const std::string &url, const std::string &body, std::chrono::milliseconds timeout,
                             std::string_view authorization = {});

    // `method` (GET, PUT, DELETE) with `body` (PUT; nullptr: none). Any HTTP status is an
    // answer; errors are only failures to get one (unreachable, timed out, TLS, not HTTP: -EPROTO)
    // and an answer over `max_body` bytes (-EMSGSIZE), which is not read further.
    Result<HttpResponse> request(const char *method, const std::string &url, const std::string *body,
                                 std::chrono::milliseconds timeout, size_t max_body);

    // POST and hand each received chunk to `on_data` until the server closes, `stop` becomes
    // true, `on_data` returns false, or an error occurs.
    Result<void> stream(const std::string &url, const std::string &body, const std::atomic<bool> &stop,
                        const std::function<bool(std::string_view)> &on_data, std::string_view authorization = {});

private:
    // Options common to post and stream; the returned list is freed by the caller.
    curl_slist *prepare(const std::string &url, const std::string *body, std::string_view authorization,
                        const char *content_type = "application/json");
    Error failure(const std::string &url, int curl_code) const;

    void *curl_;
    HttpTls tls_;
    char error_buffer_[256] = {};
};

}  // namespace ferry
