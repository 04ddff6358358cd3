// SPDX-License-Identifier: BSD-3-Clause
// rendezvous(): rank and size resolution, stores from init_method, nonce agreement, generations.
#include <doctest/doctest.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/creation_notice.hpp"
#include "chorus/bootstrap/init_method.hpp"  // the detail:: steps of rendezvous()
#include "chorus/bootstrap/rendezvous.hpp"

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_rendezvous {

using namespace std::chrono_literals;
using chorus::Bootstrap;
using chorus::Error;
using chorus::ErrorCode;
using chorus::Options;

namespace {

void run_threads(int n, const std::function<void(int)>& f) {
  std::vector<std::thread> ts;
  std::mutex mu;
  std::exception_ptr first;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      try {
        f(i);
      } catch (...) {
        std::lock_guard lk(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

/// Sets (or unsets, with nullopt) variables for one scope; restores them after. Tests that use it
/// run their ranks only after setting, so no thread reads the environment while it changes.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::optional<std::string>>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) ::setenv(name, value->c_str(), 1);
      else ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// No launcher, no master, no CHORUS_* overrides.
ScopedEnv* clean_env() {
  return new ScopedEnv({{"RANK", {}},
                        {"WORLD_SIZE", {}},
                        {"OMPI_COMM_WORLD_RANK", {}},
                        {"OMPI_COMM_WORLD_SIZE", {}},
                        {"PMI_RANK", {}},
                        {"PMI_SIZE", {}},
                        {"SLURM_PROCID", {}},
                        {"SLURM_NTASKS", {}},
                        {"MASTER_ADDR", {}},
                        {"MASTER_PORT", {}},
                        {"CHORUS_TIMEOUT", {}},
                        {"CHORUS_JOB_TOKEN", {}}});
}

std::uint16_t free_port();

/// Runs `f(port)` with a port that was free a moment ago. env:// and tcp:// make rank 0 bind a
/// port the caller names, so the test must name one: it probes for a free port, and should another
/// process take it in between (rank 0's bind then fails with "Address already in use"), it tries
/// again with a new one, up to 5 times. No fixed port, and no flake from a clash.
template <class F>
auto on_free_port(F&& f) {
  for (int attempt = 1;; ++attempt) {
    try {
      return f(free_port());
    } catch (const Error& e) {
      if (attempt == 5 || std::string(e.what()).find("in use") == std::string::npos) throw;
    }
  }
}

std::uint16_t free_port() {
  namespace asio = chorus::detail::asio;
  asio::io_context io;
  chorus::detail::asio_tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

/// All ranks rendezvous with options made by `make(rank)`; returns the Bootstraps.
std::vector<Bootstrap> rendezvous_all(int n, const std::function<Options(int)>& make) {
  std::vector<Bootstrap> out(n);
  run_threads(n, [&](int r) { out[r] = chorus::rendezvous(make(r)); });
  return out;
}

void check_agreement(const std::vector<Bootstrap>& bs) {
  const int n = static_cast<int>(bs.size());
  for (int r = 0; r < n; ++r) {
    CHECK(bs[r].rank == r);
    CHECK(bs[r].size == n);
    CHECK(bs[r].options.rank == r);
    CHECK(bs[r].options.world_size == n);
    CHECK(bs[r].nonce == bs[0].nonce);
    REQUIRE(bs[r].store);
  }
  CHECK(bs[0].nonce != chorus::JobNonce{});
  // The prefixed stores are one namespace: what rank 0 sets, everyone sees.
  bs[0].store->set("hello", "from 0");
  for (const auto& b : bs) CHECK(b.store->get("hello", 5s) == "from 0");
}

std::string error_text(const std::function<void()>& f, ErrorCode want) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == want);
    return e.what();
  }
  FAIL("no error");
  return {};
}

Options with_rank(int rank, int size, std::shared_ptr<chorus::Store> store = {}) {
  Options o;
  o.rank = rank;
  o.world_size = size;
  o.store = std::move(store);
  o.timeout = 10s;
  return o;
}

}  // namespace

TEST_CASE("rendezvous over a MemoryStore: one nonce per job") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  for (int n : {1, 2, 5}) {
    auto store = std::make_shared<chorus::MemoryStore>();
    auto bs = rendezvous_all(n, [&](int r) { return with_rank(r, n, store); });
    check_agreement(bs);
  }
  auto job1 = rendezvous_all(3, [s = std::make_shared<chorus::MemoryStore>()](int r) { return with_rank(r, 3, s); });
  auto job2 = rendezvous_all(3, [s = std::make_shared<chorus::MemoryStore>()](int r) { return with_rank(r, 3, s); });
  CHECK(job1[0].nonce != job2[0].nonce);
}

TEST_CASE("sequential rendezvous through one store do not collide") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  auto store = std::make_shared<chorus::MemoryStore>();
  constexpr int n = 4;
  auto first = rendezvous_all(n, [&](int r) { return with_rank(r, n, store); });
  check_agreement(first);
  first[0].store->set("only-in-first", "1");
  auto second = rendezvous_all(n, [&](int r) { return with_rank(r, n, store); });
  check_agreement(second);
  CHECK(first[0].nonce != second[0].nonce);
  CHECK_FALSE(second[1].store->check({"only-in-first"}));
  CHECK(second[1].store->get("hello", 1s) == "from 0");
  CHECK(first[1].store->check({"only-in-first"}));

  // Ranks running ahead: each rank does three rendezvous back to back, without waiting for the
  // others between them; the k-th of every rank still meet.
  std::vector<std::vector<Bootstrap>> per_rank(n);
  run_threads(n, [&](int r) {
    for (int k = 0; k < 3; ++k) per_rank[r].push_back(chorus::rendezvous(with_rank(r, n, store)));
  });
  for (int k = 0; k < 3; ++k)
    for (int r = 1; r < n; ++r) CHECK(per_rank[r][k].nonce == per_rank[0][k].nonce);
  CHECK(per_rank[0][0].nonce != per_rank[0][1].nonce);
  CHECK(per_rank[0][1].nonce != per_rank[0][2].nonce);
}

TEST_CASE("rendezvous over tcp://host:port") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  constexpr int n = 3;
  std::uint16_t port = 0;
  auto bs = on_free_port([&](std::uint16_t p) {
    port = p;
    return rendezvous_all(n, [&](int r) {
      Options o = with_rank(r, n);
      o.init_method = "tcp://127.0.0.1:" + std::to_string(p);
      return o;
    });
  });
  check_agreement(bs);
  auto* server = dynamic_cast<chorus::TcpStore*>(bs[0].options.store.get());
  REQUIRE(server);
  CHECK(server->is_server());
  CHECK(server->port() == port);
  CHECK_FALSE(dynamic_cast<chorus::TcpStore*>(bs[1].options.store.get())->is_server());
}

TEST_CASE("rendezvous over tcp with a job token") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  auto bs = on_free_port([&](std::uint16_t port) {
    return rendezvous_all(2, [&](int r) {
      Options o = with_rank(r, 2);
      o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
      o.job_token = "s3cret";
      return o;
    });
  });
  check_agreement(bs);
}

TEST_CASE("rendezvous over tcp://[::1]:port") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  try {
    chorus::TcpStore probe("::1", 0, true, 2s);
  } catch (const Error& e) {
    MESSAGE("IPv6 loopback not available, skipped: " << e.what());
    return;
  }
  // An IPv4 probe; should the number be taken on ::1, on_free_port tries another.
  auto bs = on_free_port([&](std::uint16_t port) {
    return rendezvous_all(2, [&](int r) {
      Options o = with_rank(r, 2);
      o.init_method = "tcp://[::1]:" + std::to_string(port);
      return o;
    });
  });
  check_agreement(bs);
}

/// MASTER_ADDR=127.0.0.1 and MASTER_PORT=`port` (env://), for the scope of the result.
ScopedEnv local_master(std::uint16_t port) {
  return ScopedEnv({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}});
}

/// Ranks 0 and 1 of 2 meet through env:// (MASTER_ADDR, MASTER_PORT set by the caller); their
/// Bootstraps, checked to agree.
std::vector<Bootstrap> meet_two() {
  auto bs = rendezvous_all(2, [](int r) { return with_rank(r, 2); });
  check_agreement(bs);
  return bs;
}

TEST_CASE("rendezvous over env:// (MASTER_ADDR, MASTER_PORT)") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  auto bs = on_free_port([&](std::uint16_t port) {
    ScopedEnv master = local_master(port);
    return rendezvous_all(3, [&](int r) {
      Options o = with_rank(r, 3);
      o.init_method = r == 1 ? "env://" : "";  // both mean env://
      return o;
    });
  });
  check_agreement(bs);
}

/// Joins its thread when it goes, also when a check throws on the way.
struct Joined {
  std::thread thread;
  ~Joined() {
    if (thread.joinable()) thread.join();
  }
};

/// Waits (at most 10 s) until `server` has served more than `count` requests; false if it has not.
bool await_requests(const chorus::TcpStore& server, std::uint64_t count) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server.requests_served() <= count) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST_CASE("env:// one communicator after another: a fast rank's next round meets rank 0's kept store") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  on_free_port([&](std::uint16_t port) {
    ScopedEnv master = local_master(port);
    auto first = meet_two();
    const auto first_nonce = first[0].nonce;
    auto* server = dynamic_cast<chorus::TcpStore*>(first[0].options.store.get());
    REQUIRE(server);
    REQUIRE(server->is_server());
    const auto served = server->requests_served();
    // Rank 1 lets its communicator go and starts the next while rank 0 still holds its first.
    first[1] = Bootstrap{};
    Bootstrap second0, second1;
    std::exception_ptr error;
    {
      Joined fast{std::thread([&] {
        try {
          second1 = chorus::rendezvous(with_rank(1, 2));
        } catch (...) {
          error = std::current_exception();
        }
      })};
      REQUIRE(await_requests(*server, served));  // rank 1's next round has reached rank 0's store
      server = nullptr;
      first[0] = Bootstrap{};  // only now does rank 0 let its first communicator go
      second0 = chorus::rendezvous(with_rank(0, 2));
    }
    if (error) std::rethrow_exception(error);
    check_agreement({second0, second1});
    CHECK(second0.nonce != first_nonce);
    // The same store, generation 2 (a new one would have started again at 1).
    CHECK(second0.options.store->check({"chorus/g2/nonce"}));
    return 0;
  });
}

/// Waits (at most 10 s) until the store on 127.0.0.1:`port` is one that rank 0 has joined and
/// rank 1 not yet (a new one: the first round's had both); false if it has not come.
bool await_fresh_store(std::uint16_t port) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    try {
      chorus::TcpStore probe("127.0.0.1", port, false, 2s);
      if (probe.check({"chorus/rank0/rendezvous"}) && !probe.check({"chorus/rank1/rendezvous"})) return true;
    } catch (const Error&) {
      // the first round's server going, or the new one not there yet
    }
    std::this_thread::sleep_for(1ms);
  }
}

TEST_CASE("env:// kept stores: settings that differ make a new store; a client whose server went connects anew") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  on_free_port([&](std::uint16_t port) {
    ScopedEnv master = local_master(port);
    auto first = meet_two();
    first = {};
    // Rank 0 comes back with another timeout: its kept server is let go (the port is wanted again)
    // and a new one serves. Rank 1 starts only then: its kept client finds its server gone.
    std::vector<Bootstrap> second(2);
    std::exception_ptr error;
    {
      Joined rank0{std::thread([&] {
        try {
          Options o = with_rank(0, 2);
          o.timeout = 11s;
          second[0] = chorus::rendezvous(o);
        } catch (...) {
          error = std::current_exception();
        }
      })};
      REQUIRE(await_fresh_store(port));
      second[1] = chorus::rendezvous(with_rank(1, 2));
    }
    if (error) std::rethrow_exception(error);
    check_agreement(second);
    // A new store: generation 1 again.
    CHECK(second[0].options.store->check({"chorus/g1/nonce"}));
    CHECK_FALSE(second[0].options.store->check({"chorus/g2/nonce"}));
    return 0;
  });
}

TEST_CASE("rendezvous over file://") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  std::string dir = (std::filesystem::temp_directory_path() / "chorus-rdv-XXXXXX").string();
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  {
    auto bs = rendezvous_all(3, [&](int r) {
      Options o = with_rank(r, 3);
      o.init_method = "file://" + dir + "/store";
      return o;
    });
    check_agreement(bs);
    // A second communicator through the same file: generation 2.
    auto again = rendezvous_all(3, [&](int r) {
      Options o = with_rank(r, 3);
      o.init_method = "file://" + dir + "/store";
      return o;
    });
    check_agreement(again);
    CHECK(again[0].nonce != bs[0].nonce);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("rank and world size from the launcher's variables") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  ScopedEnv launch({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  Options o;
  o.store = std::make_shared<chorus::MemoryStore>();
  auto b = chorus::rendezvous(o);
  CHECK(b.rank == 0);
  CHECK(b.size == 1);
  // Options win over the environment.
  auto store = std::make_shared<chorus::MemoryStore>();
  auto bs = rendezvous_all(2, [&](int r) { return with_rank(r, 2, store); });
  CHECK(bs[1].rank == 1);
  CHECK(bs[1].size == 2);
}

TEST_CASE("missing or bad settings give clear errors") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  auto mem = std::make_shared<chorus::MemoryStore>();

  Options none;
  none.store = mem;
  auto what = error_text([&] { chorus::rendezvous(none); }, ErrorCode::invalid_argument);
  CHECK(what.find("set RANK and WORLD_SIZE, or launch with torchrun/mpirun/srun") != std::string::npos);

  what = error_text([&] { chorus::rendezvous(with_rank(3, 2, mem)); }, ErrorCode::invalid_argument);
  CHECK(what.find("out of range") != std::string::npos);

  Options o = with_rank(0, 1);
  what = error_text([&] { chorus::rendezvous(o); }, ErrorCode::invalid_argument);  // env://, nothing set
  CHECK(what.find("MASTER_ADDR") != std::string::npos);
  {
    ScopedEnv addr({{"MASTER_ADDR", "127.0.0.1"}});
    what = error_text([&] { chorus::rendezvous(o); }, ErrorCode::invalid_argument);
    CHECK(what.find("MASTER_PORT") != std::string::npos);
    ScopedEnv port({{"MASTER_PORT", "http"}});
    what = error_text([&] { chorus::rendezvous(o); }, ErrorCode::invalid_argument);
    CHECK(what.find("MASTER_PORT='http'") != std::string::npos);
  }
  for (const char* bad : {"foo://x", "tcp://127.0.0.1", "tcp://:29500", "tcp://127.0.0.1:0", "tcp://127.0.0.1:70000",
                          "tcp://::1:29500", "tcp://[::1]29500", "file://relative/path", "file://"}) {
    o.init_method = bad;
    what = error_text([&] { chorus::rendezvous(o); }, ErrorCode::invalid_argument);
    CHECK_MESSAGE(what.find(bad) != std::string::npos, what);
  }
  {
    ScopedEnv t({{"CHORUS_TIMEOUT", "soon"}});
    what = error_text([&] { chorus::rendezvous(with_rank(0, 1, mem)); }, ErrorCode::invalid_argument);
    CHECK(what.find("CHORUS_TIMEOUT") != std::string::npos);
  }
}

TEST_CASE("parse_init_method") {
  auto env = [](std::map<std::string, std::string> vars) -> chorus::GetEnv {
    return [vars](const char* name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  auto m = chorus::detail::parse_init_method("tcp://node-1.example:29500", env({}));
  CHECK(m.kind == chorus::detail::InitMethod::Kind::tcp);
  CHECK(m.host == "node-1.example");
  CHECK(m.port == 29500);
  m = chorus::detail::parse_init_method("tcp://[fe80::1]:1234", env({}));
  CHECK(m.host == "fe80::1");
  CHECK(m.port == 1234);
  m = chorus::detail::parse_init_method("env://", env({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}}));
  CHECK(m.host == "10.0.0.1");
  CHECK(m.port == 29400);
  m = chorus::detail::parse_init_method("", env({{"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "5"}}));
  CHECK(m.host == "::1");
  m = chorus::detail::parse_init_method("file:///shared/job/store", env({}));
  CHECK(m.kind == chorus::detail::InitMethod::Kind::file);
  CHECK(m.path == "/shared/job/store");
}

TEST_CASE("ranks that disagree on the world size, and a missing rank 0") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  auto store = std::make_shared<chorus::MemoryStore>();
  chorus::rendezvous(with_rank(0, 2, store));
  auto what = error_text([&] { chorus::rendezvous(with_rank(1, 3, store)); }, ErrorCode::mismatch);
  CHECK(what.find("world size 3 here but 2 on rank 0") != std::string::npos);

  Options lonely = with_rank(1, 2, std::make_shared<chorus::MemoryStore>());
  lonely.timeout = 100ms;
  what = error_text([&] { chorus::rendezvous(lonely); }, ErrorCode::timeout);
  CHECK(what.find("rank 0 did not publish the job nonce") != std::string::npos);
}

// The mismatched rank leaves a notice (bootstrap/creation_notice.hpp): rank 0's waits through its
// Bootstrap's store, on which its creation waits for rank 1, fail with rank 1's words instead of
// running to their bound. A rank outside rank 0's world leaves none; a wait that does run out says
// how long it waited in all.
TEST_CASE("a rank whose world size differs tells rank 0's waits; a rank outside rank 0's world does not") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  auto store = std::make_shared<chorus::MemoryStore>();
  const Bootstrap b0 = chorus::rendezvous(with_rank(0, 2, store));
  (void)error_text([&] { chorus::rendezvous(with_rank(1, 3, store)); }, ErrorCode::mismatch);
  std::string what = error_text([&] { (void)b0.store->get("never/set", 60s); }, ErrorCode::mismatch);
  CHECK(what.find(
            "rank 0: peer 1: creation: rank 1 could not create its communicator: chorus mismatch: rank 1: "
            "rendezvous (generation 1): world size 3 here but 2 on rank 0") != std::string::npos);
  what = error_text([&] { b0.store->wait({"never/set", "nor/this"}, 60s); }, ErrorCode::mismatch);
  CHECK(what.find("world size 3 here but 2 on rank 0") != std::string::npos);

  auto other = std::make_shared<chorus::MemoryStore>();
  const Bootstrap c0 = chorus::rendezvous(with_rank(0, 2, other));
  (void)error_text([&] { chorus::rendezvous(with_rank(2, 3, other)); }, ErrorCode::mismatch);
  what = error_text([&] { (void)c0.store->get("never/set", 300ms); }, ErrorCode::timeout);
  CHECK(what.find("(waited 300 ms in all)") != std::string::npos);
  c0.store->set("set/now", "v");
  CHECK(c0.store->get("set/now", 1s) == "v");
}

TEST_CASE("creation notices: what a rank reads from one, and from a value that is not one") {
  using chorus::detail::creation_failure_error;
  const std::string notice =
      chorus::detail::encode_creation_failure(4, ErrorCode::invalid_argument, "chorus invalid_argument: bad");
  Error e = creation_failure_error(notice, chorus::ErrorContext{1, -1, "creation"});
  CHECK(e.code() == ErrorCode::peer_failure);
  CHECK(e.rank() == 1);
  CHECK(e.peer() == 4);
  CHECK(std::string(e.what()) ==
        "chorus peer_failure: rank 1: peer 4: creation: rank 4 could not create its communicator: chorus "
        "invalid_argument: bad");
  e = creation_failure_error(chorus::detail::encode_creation_failure(2, ErrorCode::mismatch, "m"),
                             chorus::ErrorContext{0, -1, "creation"});
  CHECK(e.code() == ErrorCode::mismatch);
  for (const std::string bad : {"", "garbage", "1\n", "x\n3\nm", "1\n99999999999\nm", "-1\n2\nm"}) {
    CAPTURE(bad);
    e = creation_failure_error(bad, chorus::ErrorContext{0, -1, "creation"});
    CHECK(e.code() == ErrorCode::peer_failure);
    CHECK(e.peer() == -1);
    CHECK(std::string(e.what()).find("a rank could not create its communicator") != std::string::npos);
  }
}

// Two launchers given one MASTER_PORT (two torchrun-style jobs on one host): the first job's
// rank 0 holds the port; the second's rank 0 cannot listen on it. The error comes before the
// communicator has a rank, so the *_perf programs' "<program>: <rank_label>: <what>" line names
// the launcher's variable, not "rank -1".
TEST_CASE("two launchers on one port: the second names its rank as the launcher gave it") {
  std::unique_ptr<ScopedEnv> env(clean_env());
  std::uint16_t port = 0;
  // The first job (one rank) keeps its store, and with it the port, while the second starts.
  auto first = on_free_port([&](std::uint16_t p) {
    port = p;
    Options o = with_rank(0, 1);
    o.init_method = "tcp://127.0.0.1:" + std::to_string(p);
    return chorus::rendezvous(o);
  });
  REQUIRE(first.store);

  ScopedEnv second({{"RANK", "0"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", std::to_string(port)}});
  Options o;
  o.timeout = 10s;
  const std::string what = error_text([&] { chorus::rendezvous(o); }, ErrorCode::system);
  const std::string line = "all_reduce_perf: " + chorus::rank_label(-1) + ": " + what;
  MESSAGE(line);
  CHECK(line == "all_reduce_perf: rank 0 (from RANK, before rank assignment): chorus system: TcpStore server: "
                "cannot listen on 127.0.0.1:" + std::to_string(port) + ": Address already in use");
  CHECK(line.find("rank -1") == std::string::npos);
}

}  // namespace unit_test_rendezvous
