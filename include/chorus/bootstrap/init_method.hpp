// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Where the store of a rendezvous is (InitMethod, parse_init_method: step 2 of
/// bootstrap/impl/rendezvous.hpp), the store made from it (make_store), and the rank, size and
/// nonce helpers rendezvous() uses. Inline: a program built with CHORUS_SEPARATE_COMPILATION
/// compiles them where it calls them (the communicator's join(), the tests), rendezvous() itself
/// in chorus::compiled.

#include <unistd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "chorus/bootstrap/file_store.hpp"
#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/bootstrap/launcher_kvs.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/bootstrap/torch_store.hpp"
#include "chorus/detail/crypto.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"

namespace chorus {
namespace detail {

/// Where the store is, from an init_method.
struct InitMethod {
  enum class Kind { tcp, file };
  Kind kind = Kind::tcp;
  std::string host;  ///< tcp: without brackets
  std::uint16_t port = 0;
  std::string path;  ///< file
  /// file: the store of a one-host mpirun job without MASTER_ADDR (job_file_store), whose name
  /// the ranks remove once every one has opened it.
  bool job_file = false;
  /// tcp: under mpirun/mpiexec with ranks on several hosts and no MASTER_ADDR, the launcher's
  /// key-value service ("pmi1", "pmix") through which rank 0 hands out its store's address
  /// (launcher_kvs.hpp); host and port are then empty until that exchange.
  std::string launcher_kvs;
  /// tcp: where the port came from when no variable or URL named it ("derived from
  /// SLURM_JOB_ID=12 and SLURM_STEP_ID=0"), for the errors of a port another program holds;
  /// empty otherwise.
  std::string port_origin;
};

/// The job id where a launcher's variables carry none: MPICH/Hydra's KVS name (asked of its PMI
/// server), else the parent's pid (mpirun, orted or hydra_pmi_proxy started every rank of this
/// host; not so when the ranks are wrapper scripts that do not exec the program).
inline std::string fallback_job_id(const LaunchInfo& launch) {
  if (launch.source == "mpich")
    if (auto kvs = hydra_kvs_name(GetEnv(&env_string))) return file_name_safe("hydra-" + *kvs);
  return "ppid-" + std::to_string(::getppid());
}
using JobIdLookup = std::function<std::string(const LaunchInfo&)>;

/// env:// without MASTER_ADDR nor a Slurm node list to take it from (master_addr). Under mpirun
/// with every rank on this host: a file store, $TMPDIR/chorus-<uid>-<job id>.store (TMPDIR when
/// absolute, else /tmp). Otherwise nothing stands in for MASTER_ADDR: invalid_argument saying
/// what to set.
inline InitMethod job_file_or_refusal(const GetEnv& getenv, const JobIdLookup& job_id_lookup) {
  const auto launch = detect_launch(getenv);
  const bool mpi = launch && (launch->source == "openmpi" || launch->source == "mpich");
  if (mpi && launch->local_size == launch->world_size) {
    std::string dir = getenv("TMPDIR").value_or("/tmp");
    if (dir.front() != '/') dir = "/tmp";  // file:// takes an absolute path
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    InitMethod m;
    m.kind = InitMethod::Kind::file;
    m.path = dir + "/chorus-" + std::to_string(::getuid()) + "-" +
             (launch->job_id.empty() ? job_id_lookup(*launch) : launch->job_id) + ".store";
    m.job_file = true;
    return m;
  }
  if (mpi) {
    const std::string kvs = launcher_kvs_kind(*launch, getenv);
    if (!kvs.empty()) {
      InitMethod m;
      m.launcher_kvs = kvs;
      return m;
    }
  }
  std::string why = "MASTER_ADDR is not set";
  if (mpi && launch->local_size > 0)
    why = "this " + launch->source + " job has ranks on several hosts (" + std::to_string(launch->local_size) + " of " +
          std::to_string(launch->world_size) + " here), which cannot meet in a file on one host, MASTER_ADDR is not set, and the launcher's key-value service is not "
          "there (" + (launch->source == "mpich" ? "PMI_FD" : "PMIX_NAMESPACE with PMIX_RANK or PMIX_SERVER_URI*") + " not set)";
  else if (mpi)
    why = "the " + launch->source + " launcher does not say how many ranks are on this host, and MASTER_ADDR is not set";
  else if (launch && launch->source == "slurm")
    why = "MASTER_ADDR is not set, nor is SLURM_STEP_NODELIST or SLURM_JOB_NODELIST to take it from";
  throw Error(ErrorCode::invalid_argument,
              "init_method env:// needs MASTER_ADDR (rank 0's host) and MASTER_PORT (a free port there) on every "
              "rank: " + why + ". Set both (torchrun does; mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500, "
              "mpiexec -genv MASTER_ADDR host0 -genv MASTER_PORT 29500, export for srun), or use init_method "
              "file:///path on a file system every rank shares");
}

/// Parses init_method; env:// reads MASTER_ADDR and MASTER_PORT through `getenv` and, without
/// MASTER_ADDR, the launcher's variables (master_addr, job_file_or_refusal; `job_id_lookup` is
/// asked for the job id when they carry none).
inline InitMethod parse_init_method(const std::string& method, const GetEnv& getenv,
                                    const JobIdLookup& job_id_lookup = &fallback_job_id) {
  InitMethod m;
  auto parse_port = [](const std::string& text, const std::string& what) {
    return static_cast<std::uint16_t>(parse_int(text, what, 1, 65535));
  };
  if (method.empty() || method == "env://") {
    auto addr = master_addr(getenv);
    if (!addr) return job_file_or_refusal(getenv, job_id_lookup);
    m.host = *addr;
    if (m.host.size() >= 2 && m.host.front() == '[' && m.host.back() == ']') m.host = m.host.substr(1, m.host.size() - 2);
    if (auto port = getenv("MASTER_PORT")) {
      m.port = parse_port(*port, "MASTER_PORT");
      return m;
    }
    // srun: every task derives the same port from the job and step ids.
    const auto launch = detect_launch(getenv);
    if (launch && launch->source == "slurm")
      if (const auto derived = slurm_master_port(getenv)) {
        m.port = *derived;
        m.port_origin = "derived from SLURM_JOB_ID=" + getenv("SLURM_JOB_ID").value_or("") +
                        " and SLURM_STEP_ID=" + getenv("SLURM_STEP_ID").value_or("(unset: 0)") +
                        " as 15000 + (16 x job + step) mod 15000, since MASTER_PORT is not set";
        return m;
      }
    throw Error(ErrorCode::invalid_argument,
                "init_method env:// needs MASTER_PORT; it is not set" +
                    (getenv("MASTER_ADDR") ? std::string()
                                           : " (MASTER_ADDR defaults to " + *addr +
                                                 ", the first host of Slurm's node list; SLURM_JOB_ID, from which "
                                                 "the port would be derived, is not set either)"));
  }
  constexpr std::string_view kTcp = "tcp://", kFile = "file://";
  if (method.starts_with(kTcp)) {
    const std::string rest = method.substr(kTcp.size());
    std::string host, port;
    if (!rest.empty() && rest.front() == '[') {
      const auto close = rest.find(']');
      if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
        throw Error(ErrorCode::invalid_argument, "init_method '" + method + "': expected tcp://[ipv6]:port");
      host = rest.substr(1, close - 1);
      port = rest.substr(close + 2);
    } else {
      const auto colon = rest.rfind(':');
      if (colon == std::string::npos)
        throw Error(ErrorCode::invalid_argument, "init_method '" + method + "': expected tcp://host:port");
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
      if (host.find(':') != std::string::npos)
        throw Error(ErrorCode::invalid_argument,
                    "init_method '" + method + "': put an IPv6 address in brackets: tcp://[addr]:port");
    }
    if (host.empty()) throw Error(ErrorCode::invalid_argument, "init_method '" + method + "': empty host");
    m.host = host;
    m.port = parse_port(port, "the port of init_method '" + method + "'");
    return m;
  }
  if (method.starts_with(kFile)) {
    m.kind = InitMethod::Kind::file;
    m.path = method.substr(kFile.size());
    if (m.path.empty() || m.path.front() != '/')
      throw Error(ErrorCode::invalid_argument,
                  "init_method '" + method + "': expected file:///absolute/path (no host part)");
    return m;
  }
  throw Error(ErrorCode::invalid_argument,
              "init_method '" + method + "' is not env://, tcp://host:port or file:///path");
}

/// Rank and world size from Options (where set) and the launcher (for the rest).
inline std::pair<int, int> resolve_rank_and_size(const Options& o, const GetEnv& getenv) {
  int rank = o.rank;
  int size = o.world_size;
  if (rank < 0 || size < 0) {
    if (auto l = detect_launch(getenv)) {
      if (rank < 0) rank = l->rank;
      if (size < 0) size = l->world_size;
    }
  }
  if (rank < 0 || size < 0)
    throw Error(ErrorCode::invalid_argument,
                "rank and world size are unknown: set RANK and WORLD_SIZE, or launch with torchrun/mpirun/srun "
                "(or set Options::rank and Options::world_size)");
  if (size < 1 || rank >= size)
    throw Error(ErrorCode::invalid_argument,
                "rank " + std::to_string(rank) + " is out of range for world size " + std::to_string(size));
  return {rank, size};
}

inline std::string nonce_to_hex(const JobNonce& n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (auto b : n) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

inline JobNonce nonce_from_hex(const std::string& s, const ErrorContext& ctx) {
  JobNonce n{};
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error(ErrorCode::mismatch, ctx, "malformed job nonce in the store");
  };
  if (s.size() != 2 * n.size()) throw Error(ErrorCode::mismatch, ctx, "malformed job nonce in the store");
  for (std::size_t i = 0; i < n.size(); ++i)
    n[i] = static_cast<std::uint8_t>(digit(s[2 * i]) * 16 + digit(s[2 * i + 1]));
  return n;
}

/// A job's own file store (InitMethod::job_file): every rank opens it and counts itself in; the
/// last to arrive removes the file's name, which the ranks keep open, so no later job finds a stale
/// store under its id. Every rank waits for the removal, so none goes on (and could open the
/// name again for another communicator) before it.
inline std::shared_ptr<Store> job_file_store(const std::string& path, int size, std::chrono::milliseconds timeout) {
  auto store = std::make_shared<FileStore>(path, timeout);
  const std::string removed = "chorus/job_file/removed";
  if (store->add("chorus/job_file/opened", 1) == size) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw system_error({}, "unlink(" + path + ")");
    store->set(removed, "1");
  }
  try {
    store->wait({removed}, timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::timeout) throw;
    throw Error(ErrorCode::timeout,
                "not all " + std::to_string(size) + " ranks opened the job's file store " + path + " within " +
                    std::to_string(timeout.count()) + " ms: did they all start? (A file left by an earlier job "
                    "with the same id would do this too: remove it.)");
  }
  return store;
}

/// The TcpStore of a host:port init method (env://, tcp://, srun's derived port): rank 0 serves
/// it, the others connect. Kept for the process when its communicators are gone, so that a program
/// that creates communicators one after the other (test suites, notebooks, a retry) meets on the
/// same store, one generation after the other (step 3 above). Made afresh each time, rank 0's
/// second store could not start while a fast rank still spoke to its first, and that rank lost
/// its connection when the first went ("store server gone?"). A kept store is taken again only
/// when no communicator holds it and host, port, role, timeout and token are the same; a kept
/// client answers one request first (its server may have gone with rank 0's process: then a new
/// connection is made). Of the stores no communicator holds, the last kIdleUrlStores are kept.
inline std::shared_ptr<Store> url_store(const std::string& host, std::uint16_t port, bool is_server,
                                        std::chrono::milliseconds timeout, const std::string& token) {
  constexpr std::size_t kIdleUrlStores = 8;
  struct Entry {
    std::string host;
    std::uint16_t port;
    bool server;
    std::chrono::milliseconds timeout;
    std::string token;
    std::shared_ptr<TcpStore> store;
  };
  struct Cache {
    std::mutex mutex;
    std::vector<Entry> entries;  // oldest first
    pid_t owner = ::getpid();
    // OpenSSL first: its exit handler, registered now, runs after this cache's destructor (whose
    // registration follows the constructor) has joined the servers' threads (detail::openssl_init).
    Cache() { openssl_init(); }
    ~Cache() {
      // A child made by fork() has the parent's entries but not their servers' threads: joining
      // those would abort. It leaves them be.
      if (::getpid() != owner)
        for (auto& e : entries) new std::shared_ptr<TcpStore>(std::move(e.store));
    }
  };
  static Cache cache;
  std::vector<std::shared_ptr<TcpStore>> released;  // let go outside the lock (a server joins its thread)
  const auto idle = [](const Entry& e) { return e.store.use_count() == 1; };
  const auto same_place = [&](const Entry& e) { return e.host == host && e.port == port && e.server == is_server; };
  std::shared_ptr<TcpStore> store;
  {
    std::lock_guard lock(cache.mutex);
    for (auto it = cache.entries.begin(); it != cache.entries.end();) {
      if (same_place(*it) && idle(*it)) {
        if (!store && it->timeout == timeout && it->token == token) {
          store = it->store;
        } else if (is_server || it->timeout != timeout || it->token != token) {
          released.push_back(std::move(it->store));  // its port or its settings are wanted anew
          it = cache.entries.erase(it);
          continue;
        }
      }
      ++it;
    }
  }
  if (store && !is_server) {
    try {
      (void)store->check({"chorus/url_store/alive"});
    } catch (const Error&) {
      std::lock_guard lock(cache.mutex);
      std::erase_if(cache.entries, [&](const Entry& e) { return e.store == store; });
      released.push_back(std::move(store));
    }
  }
  if (store) return store;
  released.clear();  // before a server binds the port again
  store = std::make_shared<TcpStore>(host, port, is_server, timeout, token);
  std::lock_guard lock(cache.mutex);
  cache.entries.push_back(Entry{host, port, is_server, timeout, token, store});
  std::size_t idle_count = 0;
  for (const auto& e : cache.entries) idle_count += idle(e) ? 1 : 0;
  for (auto it = cache.entries.begin(); idle_count > kIdleUrlStores && it != cache.entries.end();) {
    if (idle(*it)) {
      released.push_back(std::move(it->store));
      it = cache.entries.erase(it);
      --idle_count;
    } else {
      ++it;
    }
  }
  return store;
}

/// The store of `o`; where it was found through the launcher's key-value service,
/// `*resolved_init_method` is set to its address ("tcp://host:port"), from which the tcp links
/// choose the address they listen on.
inline std::shared_ptr<Store> make_store(const Options& o, int rank, int size, std::string* resolved_init_method) {
  const auto m = parse_init_method(o.init_method, GetEnv(&env_string));
  if (!m.launcher_kvs.empty()) {
    auto [store, address] = launcher_store(m.launcher_kvs, rank, o.socket_ifname, o.setup_bound(), o.job_token,
                                           GetEnv(&env_string));
    log(LogLevel::info, LogSubsys::bootstrap, rank, "store: ", address, ", its address handed out by the launcher's ",
        m.launcher_kvs);
    *resolved_init_method = std::move(address);
    return store;
  }
  if (m.job_file) return job_file_store(m.path, size, o.timeout);
  if (m.kind == InitMethod::Kind::file) return std::make_shared<FileStore>(m.path, o.timeout);
  // CHORUS_AGENT_STORE=1: the launcher hosts the store (chorus::launch_local), rank 0 is a client.
  bool agent_store = false;
  if (auto v = env_string("CHORUS_AGENT_STORE")) {
    if (*v != "0" && *v != "1")
      throw Error(ErrorCode::invalid_argument, "CHORUS_AGENT_STORE='" + *v + "' is not 0 or 1");
    agent_store = *v == "1";
  }
  // torchrun's agent serves a torch TCPStore on MASTER_PORT: every rank joins it, under a prefix
  // of its own per restart of the worker group (torch's workers use "/worker/attempt_<n>").
  const bool env_method = o.init_method.empty() || o.init_method == "env://";
  if (env_method && !agent_store)
    if (const auto attempt = torch_agent_store_attempt(GetEnv(&env_string))) {
      const std::string prefix = "chorus/torchelastic/attempt_" + std::to_string(*attempt) + "/";
      auto agent = std::make_shared<TorchStore>(m.host, m.port, o.timeout, rank);
      log(LogLevel::info, LogSubsys::bootstrap, rank, "store: torchrun's agent store (a torch TCPStore) at ",
          host_port_string(m.host, m.port), ", keys under ", prefix);
      return std::make_shared<PrefixStore>(prefix, std::move(agent));
    }
  if (m.port_origin.empty())
    return url_store(m.host, m.port, rank == 0 && !agent_store, o.timeout, o.job_token);
  // A derived port (srun without MASTER_PORT) may be held by another program on rank 0's host:
  // rank 0 cannot listen there, and the other ranks reach nothing or a stranger. Say so, with
  // the way out.
  log(LogLevel::info, LogSubsys::bootstrap, rank, "store: ", host_port_string(m.host, m.port), ", the port ",
      m.port_origin);
  try {
    return url_store(m.host, m.port, rank == 0 && !agent_store, o.timeout, o.job_token);
  } catch (const Error& e) {
    const std::string message = e.message();
    const std::string where = host_port_string(m.host, m.port);
    const std::string way_out = "set MASTER_PORT to a free port on " + m.host + " for every task (MASTER_PORT=29500 srun ...)";
    if (rank == 0 && !agent_store && e.code() == ErrorCode::system)
      throw Error(ErrorCode::system, ErrorContext{rank, -1, "rendezvous"},
                  "cannot serve the store on " + where + ", the port " + m.port_origin +
                      ": another program holds it, or it is not free (" + message + "); " + way_out);
    throw Error(e.code(), ErrorContext{rank, -1, "rendezvous"},
                "no store at " + where + ", the port " + m.port_origin + " (" + message +
                    "). If rank 0 reports that another program holds the port, " + way_out);
  }
}

}  // namespace detail

}  // namespace chorus
