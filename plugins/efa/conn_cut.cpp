#include "conn_cut.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace ferry_efa {

namespace {

bool same_peer(const sockaddr_storage &a, const std::vector<uint8_t> &want) {
    if (a.ss_family == AF_INET && want.size() >= sizeof(sockaddr_in)) {
        sockaddr_in w;
        memcpy(&w, want.data(), sizeof w);
        auto &x = reinterpret_cast<const sockaddr_in &>(a);
        return w.sin_family == AF_INET && w.sin_port == x.sin_port && w.sin_addr.s_addr == x.sin_addr.s_addr;
    }
    if (a.ss_family == AF_INET6 && want.size() >= sizeof(sockaddr_in6)) {
        sockaddr_in6 w;
        memcpy(&w, want.data(), sizeof w);
        auto &x = reinterpret_cast<const sockaddr_in6 &>(a);
        return w.sin6_family == AF_INET6 && w.sin6_port == x.sin6_port &&
               memcmp(&w.sin6_addr, &x.sin6_addr, sizeof w.sin6_addr) == 0;
    }
    return false;
}

}  // namespace

bool same_address_family(const std::vector<uint8_t> &ours, const uint8_t *addr, size_t len) {
    sa_family_t mine, theirs;
    if (ours.size() < sizeof mine) return true;
    memcpy(&mine, ours.data(), sizeof mine);
    if (mine != AF_INET && mine != AF_INET6) return true;
    if (len != ours.size()) return false;
    memcpy(&theirs, addr, sizeof theirs);
    in_port_t port;
    memcpy(&port, addr + offsetof(sockaddr_in, sin_port), sizeof port);  // same offset in sockaddr_in6
    return theirs == mine && port != 0;
}

size_t cut_connections_to(const std::vector<uint8_t> &addr) {
    if (addr.size() < sizeof(sa_family_t)) return 0;
    sa_family_t family;
    memcpy(&family, addr.data(), sizeof family);
    if (family != AF_INET && family != AF_INET6) return 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return 0;
    size_t cut = 0;
    const int self = dirfd(d);
    while (dirent *e = readdir(d)) {
        char *end = nullptr;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == self) continue;
        struct stat st;
        if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        int type = 0;
        socklen_t tl = sizeof type;
        if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
        sockaddr_storage peer{};
        socklen_t pl = sizeof peer;
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&peer), &pl) != 0 || !same_peer(peer, addr))
            continue;
        if (shutdown(static_cast<int>(fd), SHUT_RDWR) == 0) ++cut;
    }
    closedir(d);
    return cut;
}

}  // namespace ferry_efa
