// The listening TCP sockets this process owns, read from the kernel's tables (/proc/self/fd,
// /proc/self/net/tcp): what a test checks to see which address a server really bound.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ferry::test {

// Socket inodes of this process's open descriptors.
inline std::set<unsigned long> own_socket_inodes() {
    std::set<unsigned long> out;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return out;
    while (dirent *e = readdir(d)) {
        char link[300], target[128];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        unsigned long inode = 0;
        if (sscanf(target, "socket:[%lu]", &inode) == 1) out.insert(inode);
    }
    closedir(d);
    return out;
}

// The IPv4 addresses ("127.0.0.7:port") of the listening TCP sockets this process owns.
inline std::vector<std::string> own_listeners() {
    auto inodes = own_socket_inodes();
    std::vector<std::string> out;
    std::ifstream f("/proc/self/net/tcp");
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string slot, local, remote, state, queues, timer, retr, uid, timeout;
        unsigned long inode = 0;
        in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
        if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
        unsigned addr = 0, port = 0;
        if (sscanf(local.c_str(), "%X:%X", &addr, &port) != 2) continue;
        // /proc prints the address as the host-order rendering of the network-order word.
        char text[32];
        snprintf(text, sizeof text, "%u.%u.%u.%u:%u", addr & 0xff, (addr >> 8) & 0xff, (addr >> 16) & 0xff, addr >> 24,
                 port);
        out.push_back(text);
    }
    return out;
}

inline size_t count_on(const std::vector<std::string> &listeners, const std::string &ip) {
    size_t n = 0;
    for (auto &l : listeners) n += l.rfind(ip + ":", 0) == 0;
    return n;
}

inline std::string joined(const std::vector<std::string> &v) {
    std::string s;
    for (auto &x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "(none)" : s;
}

}  // namespace ferry::test
