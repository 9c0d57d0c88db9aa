// Payload I/O between a socket and registered memory, hidden from ThreadSanitizer.
//
// What orders such I/O with the application's own use of the memory is the peer: a WRITE's bytes
// are the application's again once the peer acknowledged them, a READ's once they arrived. The
// acknowledgement travels over the connection, which TSan does not model (nor another process),
// so in a TSan build every transfer would be reported as racing with the application, and a
// suppressed report still costs TSan a report per 8 bytes of a later memset. In other builds
// this is nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define FERRY_TCP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TCP_TSAN 1
#endif
#endif

#ifdef FERRY_TCP_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char *file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char *file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char *file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char *file, int line);
#endif

namespace ferry_tcp {

// Scope of one send or receive call that moves payload bytes.
class UntrackedPayloadIo {
public:
#ifdef FERRY_TCP_TSAN
    UntrackedPayloadIo() {
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    ~UntrackedPayloadIo() {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    }
#else
    UntrackedPayloadIo() {}  // user-provided: a scope guard, not an unused variable
#endif
    UntrackedPayloadIo(const UntrackedPayloadIo &) = delete;
    UntrackedPayloadIo &operator=(const UntrackedPayloadIo &) = delete;
};

}  // namespace ferry_tcp
