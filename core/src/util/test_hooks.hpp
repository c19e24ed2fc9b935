// Fault injection that the tests drive, compiled in only where HASTEN_TEST_HOOKS is set (the
// build with the test suite; a build without tests, the one to install, has none of it).
//
//   HASTEN_TEST_CRASH_AT=POINT[:N]  the N-th time (default 1) the process reaches POINT it
//                                   kills itself with SIGKILL (a power cut, an OOM kill)
//   HASTEN_TEST_CRASH_RANK=R        only on rank R (default 0)
//   HASTEN_TEST_FAIL_AT=POINT[:N]   instead throws hasten::Error("injected failure at POINT")
//
// The points are named where they are reached (save-files-written, save-manifest-written,
// save-set-aside, save-swapped, ...); docs/reliability.md lists them.
#pragma once

namespace hasten::detail {

#if defined(HASTEN_TEST_HOOKS) && HASTEN_TEST_HOOKS
void test_point(const char* point, int rank);
bool test_forbids(const char* what);  // HASTEN_TEST_NO_<WHAT>=1: take the fallback path
#else
inline void test_point(const char*, int) {}
inline bool test_forbids(const char*) { return false; }
#endif

}  // namespace hasten::detail
