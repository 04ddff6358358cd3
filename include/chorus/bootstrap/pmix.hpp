// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// A PMIx client, as small as one exchange needs: what a rank started by Open MPI's mpirun (4 and
/// 5; its daemons serve PMIx) uses to publish one value and read rank 0's, the way MPI_Init
/// exchanges addresses. PMIx_Init, PMIx_Put (global scope) and PMIx_Commit, PMIx_Fence over the
/// job collecting the data, PMIx_Get of rank 0's key, PMIx_Finalize: the PMIx Standard's client
/// calls, taken from libpmix.so.2 (OpenPMIx, Debian's libpmix2, which Open MPI itself uses) at
/// run time with dlopen, so a program links no PMIx library and one without it only loses this
/// way of meeting (MASTER_ADDR still works).
///
/// The few structures passed across are declared here as the PMIx Standard (v4) lays them out:
/// pmix_proc_t (a namespace of 256 chars, then a uint32 rank), pmix_value_t (a uint16 type, then
/// a union at offset 8; 32 bytes), pmix_info_t (a key of 512 chars, uint32 directives, a
/// pmix_value_t at offset 520; 552 bytes). tests/unit/test_pmix_abi.cpp checks them against
/// <pmix.h> where its headers are installed (libpmix-dev).

#include <dlfcn.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "chorus/core/error.hpp"

namespace chorus::detail::pmix {

inline constexpr int kSuccess = 0;               // PMIX_SUCCESS
inline constexpr std::uint16_t kBool = 1;        // PMIX_BOOL
inline constexpr std::uint16_t kString = 3;      // PMIX_STRING
inline constexpr std::uint16_t kInt = 6;         // PMIX_INT
inline constexpr std::uint8_t kScopeGlobal = 3;  // PMIX_GLOBAL

struct Proc {  // pmix_proc_t
  char nspace[256];
  std::uint32_t rank;
};
struct Value {  // pmix_value_t
  std::uint16_t type;
  union {
    bool flag;
    int integer;
    char* string;
    unsigned char bytes[24];  // the union's size: its largest member is 24 bytes
  } data;
};
struct Info {  // pmix_info_t
  char key[512];
  std::uint32_t flags;
  Value value;
};
static_assert(sizeof(Proc) == 260 && offsetof(Proc, rank) == 256);
static_assert(sizeof(Value) == 32 && offsetof(Value, data) == 8);
static_assert(sizeof(Info) == 552 && offsetof(Info, value) == 520);

/// An info of `key` with a value of `type` (its data still zero).
inline Info info(const char* key, std::uint16_t type) {
  Info i{};
  std::strncpy(i.key, key, sizeof i.key - 1);
  i.value.type = type;
  return i;
}
inline Info info(const char* key, bool flag) {
  Info i = info(key, kBool);
  i.value.data.flag = flag;
  return i;
}
inline Info info(const char* key, int integer) {
  Info i = info(key, kInt);
  i.value.data.integer = integer;
  return i;
}

/// One PMIx client session of this process: init in the constructor, finalize in the destructor.
/// Every call that fails throws `system` naming the call and PMIx's status; fence and get are
/// bounded by `timeout` (PMIx's own "pmix.timeout", whole seconds, at least 1).
class Client {
 public:
  explicit Client(std::chrono::milliseconds timeout)
      : timeout_s_(static_cast<int>(std::max<std::int64_t>(1, (timeout.count() + 999) / 1000))) {
    lib_ = ::dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr)
      throw Error(ErrorCode::system, std::string("cannot load libpmix.so.2 (OpenPMIx, which Open MPI's mpirun serves; "
                                                 "Debian package libpmix2): ") + ::dlerror());
    sym(init_, "PMIx_Init");
    sym(finalize_, "PMIx_Finalize");
    sym(put_, "PMIx_Put");
    sym(commit_, "PMIx_Commit");
    sym(fence_, "PMIx_Fence");
    sym(get_, "PMIx_Get");
    sym(value_destruct_, "PMIx_Value_destruct");
    check(init_(&self_, nullptr, 0), "PMIx_Init");
    initialized_ = true;
  }
  ~Client() {
    if (initialized_) finalize_(nullptr, 0);
    if (lib_ != nullptr) ::dlclose(lib_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  std::uint32_t rank() const { return self_.rank; }
  std::string nspace() const { return self_.nspace; }

  /// Publishes key = value to every rank of the job (after the next fence).
  void put(const std::string& key, const std::string& value) {
    Value v{};
    v.type = kString;
    std::string copy = value;
    v.data.string = copy.data();
    check(put_(kScopeGlobal, key.c_str(), &v), "PMIx_Put(" + key + ")");
    check(commit_(), "PMIx_Commit");
  }
  /// Every rank of the job's namespace, with the data they put.
  void fence() {
    const Info infos[] = {info("pmix.collect", true), info("pmix.timeout", timeout_s_)};
    Proc all{};
    std::memcpy(all.nspace, self_.nspace, sizeof all.nspace);
    all.rank = UINT32_MAX - 1;  // PMIX_RANK_WILDCARD
    check(fence_(&all, 1, infos, 2), "PMIx_Fence");
  }
  /// The string `rank` put under `key`.
  std::string get(std::uint32_t rank, const std::string& key) {
    Proc p{};
    std::memcpy(p.nspace, self_.nspace, sizeof p.nspace);
    p.rank = rank;
    const Info infos[] = {info("pmix.timeout", timeout_s_)};
    Value* v = nullptr;
    check(get_(&p, key.c_str(), infos, 1, &v), "PMIx_Get(rank " + std::to_string(rank) + ", " + key + ")");
    std::string out;
    const bool is_string = v != nullptr && v->type == kString && v->data.string != nullptr;
    if (is_string) out = v->data.string;
    if (v != nullptr) {
      value_destruct_(v);
      std::free(v);
    }
    if (!is_string)
      throw Error(ErrorCode::system, "PMIx_Get(rank " + std::to_string(rank) + ", " + key + "): not a string");
    return out;
  }

 private:
  template <class F>
  void sym(F& f, const char* name) {
    f = reinterpret_cast<F>(::dlsym(lib_, name));
    if (f == nullptr) throw Error(ErrorCode::system, std::string("libpmix.so.2 has no ") + name);
  }
  static void check(int status, const std::string& call) {
    if (status != kSuccess)
      throw Error(ErrorCode::system, call + " failed with PMIx status " + std::to_string(status));
  }

  int timeout_s_;
  void* lib_ = nullptr;
  bool initialized_ = false;
  Proc self_{};
  int (*init_)(Proc*, Info*, std::size_t) = nullptr;
  int (*finalize_)(const Info*, std::size_t) = nullptr;
  int (*put_)(std::uint8_t, const char*, Value*) = nullptr;
  int (*commit_)() = nullptr;
  int (*fence_)(const Proc*, std::size_t, const Info*, std::size_t) = nullptr;
  int (*get_)(const Proc*, const char*, const Info*, std::size_t, Value**) = nullptr;
  void (*value_destruct_)(Value*) = nullptr;
};

}  // namespace chorus::detail::pmix
