// SPDX-License-Identifier: BSD-3-Clause
// bootstrap/pmix.hpp declares the few PMIx structures and constants it passes to libpmix.so.2
// itself, so that chorus needs no PMIx headers. This program checks them against OpenPMIx's own
// <pmix.h> (libpmix-dev): a difference fails its build; it then loads the library and calls one
// function outside any launcher (PMIx_Initialized: false), which fails when the symbols are not
// where dlopen looks.
#include <dlfcn.h>
#include <pmix.h>

#include <cstddef>
#include <cstdio>
#include <string_view>

#include "chorus/bootstrap/pmix.hpp"

namespace p = chorus::detail::pmix;

static_assert(sizeof(p::Proc) == sizeof(pmix_proc_t));
static_assert(offsetof(p::Proc, nspace) == offsetof(pmix_proc_t, nspace));
static_assert(offsetof(p::Proc, rank) == offsetof(pmix_proc_t, rank));
static_assert(sizeof(p::Value) == sizeof(pmix_value_t));
static_assert(offsetof(p::Value, type) == offsetof(pmix_value_t, type));
static_assert(offsetof(p::Value, data) == offsetof(pmix_value_t, data));
static_assert(sizeof(p::Value::data) == sizeof(pmix_value_t::data));
static_assert(sizeof(p::Info) == sizeof(pmix_info_t));
static_assert(offsetof(p::Info, key) == offsetof(pmix_info_t, key));
static_assert(offsetof(p::Info, flags) == offsetof(pmix_info_t, flags));
static_assert(offsetof(p::Info, value) == offsetof(pmix_info_t, value));
static_assert(p::kSuccess == PMIX_SUCCESS);
static_assert(p::kBool == PMIX_BOOL && p::kString == PMIX_STRING && p::kInt == PMIX_INT);
static_assert(p::kScopeGlobal == PMIX_GLOBAL);
static_assert(UINT32_MAX - 1 == PMIX_RANK_WILDCARD);
static_assert(sizeof(p::Proc::nspace) == PMIX_MAX_NSLEN + 1 && sizeof(p::Info::key) == PMIX_MAX_KEYLEN + 1);

int main() {
  // The keys pmix.hpp spells out.
  static_assert(sizeof(PMIX_COLLECT_DATA) == sizeof("pmix.collect") && sizeof(PMIX_TIMEOUT) == sizeof("pmix.timeout"));
  if (std::string_view(PMIX_COLLECT_DATA) != "pmix.collect" || std::string_view(PMIX_TIMEOUT) != "pmix.timeout") {
    std::puts("FAIL: PMIx key names differ");
    return 1;
  }
  void* lib = ::dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("FAIL: dlopen(libpmix.so.2): %s\n", ::dlerror());
    return 1;
  }
  auto initialized = reinterpret_cast<int (*)()>(::dlsym(lib, "PMIx_Initialized"));
  for (const char* name : {"PMIx_Init", "PMIx_Finalize", "PMIx_Put", "PMIx_Commit", "PMIx_Fence", "PMIx_Get",
                           "PMIx_Value_destruct"})
    if (::dlsym(lib, name) == nullptr) {
      std::printf("FAIL: libpmix.so.2 has no %s\n", name);
      return 1;
    }
  if (initialized == nullptr || initialized() != 0) {
    std::puts("FAIL: PMIx_Initialized missing or true outside a launcher");
    return 1;
  }
  ::dlclose(lib);
  std::puts("OK: chorus's PMIx declarations match <pmix.h>, and libpmix.so.2 has every function it calls");
  return 0;
}
