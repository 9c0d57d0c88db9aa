/* Included first in every C++ translation unit of libferry and the plugins (base/meson.build:
   glibcxx_baseline_args). Keeps them loadable with GCC 11's libstdc++ (GLIBCXX_3.4.29: RHEL 9,
   Rocky 9, Amazon Linux 2023) when built with GCC 12: GCC 12 made
   std::condition_variable::wait(unique_lock&) a new GLIBCXX_3.4.30 symbol (it may now throw on
   thread cancellation: PR libstdc++/103382); the GLIBCXX_3.4.11 one, which every libstdc++
   since GCC 4.4 exports, does the same wait. Ferry never cancels threads. python/tools/wheels.py
   check fails any ELF past the baseline, and the test glibcxx_baseline checks the built
   libferry and plugins in every build, so a new GCC 12-only symbol shows up there rather than
   on a RHEL 9 host. */
#ifdef __cplusplus
#include <cstddef> /* defines __GLIBCXX__ when the library is libstdc++ */
#endif
#if defined(__cplusplus) && defined(__GLIBCXX__) && defined(__x86_64__)
__asm__(
    ".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
    "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
#endif
