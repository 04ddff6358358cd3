// SPDX-License-Identifier: BSD-3-Clause
// TorchStore (bootstrap/torch_store.hpp) against the real thing: torch 1.13's TCPStore server,
// started by /usr/bin/python3 on port 0, which prints the port it got and then obeys one command
// a line on its standard input (set, get, add, wait, compare_set through torch's own client), so
// that keys written by either side are read by the other. Also torchrun's variables
// (torch_agent_store_attempt) and a rendezvous that joins the agent's store as torchrun's
// workers would. Exits 77 (skipped) where /usr/bin/python3 cannot import torch.distributed.
#include "chorus/bootstrap/torch_store.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/bootstrap/rendezvous.hpp"

extern char** environ;

namespace bootstrap_test_torch_store {

using namespace std::chrono_literals;
using chorus::Error;
using chorus::ErrorCode;
using chorus::TorchStore;
using Clock = std::chrono::steady_clock;

namespace {

// The server's side: torch's TCPStore (master) and, for the commands, torch's own client of it.
constexpr const char* kServerScript = R"PY(
import sys
try:
    import datetime
    import torch.distributed as dist
except ImportError as e:
    print("NO_TORCH", e, flush=True)
    sys.exit(0)
store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30), wait_for_workers=False)
print("PORT", store.port, flush=True)
for line in sys.stdin:
    w = line.split()
    if not w:
        continue
    if w[0] == "quit":
        break
    try:
        if w[0] == "set":
            store.set(w[1], w[2])
            r = "ok"
        elif w[0] == "get":
            r = store.get(w[1]).decode()
        elif w[0] == "add":
            r = store.add(w[1], int(w[2]))
        elif w[0] == "wait":
            store.wait(w[1:], datetime.timedelta(seconds=10))
            r = "ok"
        elif w[0] == "cas":
            r = store.compare_set(w[1], "" if w[2] == "-" else w[2], w[3]).decode()
        else:
            r = "error unknown command " + w[0]
    except Exception as e:
        r = "error " + str(e).replace("\n", " ")
    print(r, flush=True)
)PY";

/// /usr/bin/python3 serving torch's TCPStore; killed (SIGKILL) by the destructor if still running.
class TorchServer {
 public:
  TorchServer() {
    int in[2], out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::array<char*, 4> argv{const_cast<char*>("/usr/bin/python3"), const_cast<char*>("-c"),
                              const_cast<char*>(kServerScript), nullptr};
    const int rc = ::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      skip("cannot start /usr/bin/python3 (" + std::string(std::strerror(rc)) + ")");
    }
    const std::string first = line(60s);  // importing torch takes a few seconds
    if (first.rfind("NO_TORCH", 0) == 0) skip("/usr/bin/python3 has no torch.distributed: " + first);
    REQUIRE_MESSAGE(first.rfind("PORT ", 0) == 0, "the server's first line: " << first);
    port_ = static_cast<std::uint16_t>(std::stoi(first.substr(5)));
  }
  ~TorchServer() {
    ::close(to_);
    ::close(from_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  TorchServer(const TorchServer&) = delete;
  TorchServer& operator=(const TorchServer&) = delete;

  std::uint16_t port() const { return port_; }

  /// One command to the python side and its one-line answer (within 40 s: torch's get waits up
  /// to the store's 30 s).
  std::string ask(const std::string& command) {
    const std::string text = command + "\n";
    REQUIRE(::write(to_, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    return line(40s);
  }

  /// Ends the server (its store goes with it) and waits for it, bounded.
  void stop() {
    const std::string text = "quit\n";
    REQUIRE(::write(to_, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    const auto deadline = Clock::now() + 30s;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      REQUIRE_MESSAGE(Clock::now() < deadline, "the python server did not exit within 30 s of 'quit'");
      std::this_thread::sleep_for(10ms);
    }
    pid_ = -1;
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "python server status " << status);
  }

 private:
  [[noreturn]] static void skip(const std::string& why) {
    std::printf("SKIP: %s\n", why.c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }

  std::string line(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string l = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return l;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      REQUIRE_MESSAGE(left > 0, "no line from the python server within " << limit.count() << " ms");
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(from_, chunk, sizeof chunk);
      REQUIRE_MESSAGE(n > 0, "the python server ended its output (it exited?); read so far: " << buffer_);
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::uint16_t port_ = 0;
  std::string buffer_;
};

/// Sets variables for the scope of one test case and restores them.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

chorus::GetEnv env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  throw std::runtime_error("no chorus::Error was thrown");
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("torchrun's agent store variables: TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT") {
  using chorus::torch_agent_store_attempt;
  CHECK_FALSE(torch_agent_store_attempt(env({})).has_value());
  CHECK_FALSE(torch_agent_store_attempt(env({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).has_value());
  CHECK(torch_agent_store_attempt(
            env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "0"}})) == 0);
  CHECK(torch_agent_store_attempt(
            env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "3"}})) == 3);
  const auto bad = error_of([] { torch_agent_store_attempt(env({{"TORCHELASTIC_USE_AGENT_STORE", "1"}})); });
  CHECK(bad.code() == ErrorCode::invalid_argument);
  CHECK(contains(bad.what(), "TORCHELASTIC_USE_AGENT_STORE='1'"));
  const auto missing = error_of([] { torch_agent_store_attempt(env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}})); });
  CHECK(contains(missing.what(), "TORCHELASTIC_RESTART_COUNT is not set"));
  const auto garbled = error_of([] {
    torch_agent_store_attempt(env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "x"}}));
  });
  CHECK(contains(garbled.what(), "TORCHELASTIC_RESTART_COUNT"));
}

TEST_CASE("torch store: set, get, add, check, wait, compare_set against torch 1.13's TCPStore, keys shared both ways") {
  TorchServer server;
  TorchStore store("127.0.0.1", server.port(), 20s, /*rank=*/5);

  // Written by torch's client, read by chorus's.
  REQUIRE(server.ask("set py/hello from-python") == "ok");
  CHECK(store.get("py/hello", 5s) == "from-python");
  CHECK(store.check({"py/hello"}));
  CHECK_FALSE(store.check({"py/hello", "py/absent"}));
  store.wait({"py/hello"}, 5s);

  // Written by chorus's client, read by torch's: values are bytes, a NUL included.
  store.set("cpp/hello", "from-cpp");
  CHECK(server.ask("get cpp/hello") == "from-cpp");
  CHECK(server.ask("wait cpp/hello py/hello") == "ok");
  const std::string binary("a\0b\xff", 4);
  store.set("cpp/binary", binary);
  CHECK(store.get("cpp/binary", 5s) == binary);
  store.set("cpp/empty", "");
  CHECK(store.get("cpp/empty", 5s).empty());
  store.set("cpp/hello", "replaced");
  CHECK(server.ask("get cpp/hello") == "replaced");

  // add: one counter, both clients.
  CHECK(store.add("counter", 5) == 5);
  CHECK(server.ask("add counter 10") == "15");
  CHECK(store.add("counter", -20) == -5);
  CHECK(store.get("counter", 5s) == "-5");
  CHECK(server.ask("get counter") == "-5");

  // compare_set, as torch's server answers it.
  CHECK(store.compare_set("cas", "", "first") == "first");        // missing, expected empty: set
  CHECK(server.ask("get cas") == "first");
  CHECK(store.compare_set("cas", "wrong", "second") == "first");  // no match: unchanged
  CHECK(store.compare_set("cas", "first", "second") == "second");
  CHECK(server.ask("cas cas second third") == "third");
  CHECK(store.get("cas", 5s) == "third");
  CHECK(store.compare_set("cas-absent", "x", "y") == "x");       // missing, expected not empty
  CHECK_FALSE(store.check({"cas-absent"}));

  // A get parked on the server until torch's client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);  // let the get park first (it passes either way)
    (void)server.ask("set late value-late");
  });
  CHECK(store.get("late", 10s) == "value-late");
  setter.join();

  // chorus's PrefixStore over it is what the rendezvous uses under torchrun.
  chorus::PrefixStore prefixed("chorus/torchelastic/attempt_0/", std::make_shared<TorchStore>("127.0.0.1", server.port(), 20s));
  prefixed.set("k", "v");
  CHECK(server.ask("get chorus/torchelastic/attempt_0/k") == "v");
  server.stop();
}

TEST_CASE("torch store: a wait or get that times out names its keys, and the store stays usable") {
  TorchServer server;
  TorchStore store("127.0.0.1", server.port(), 20s, /*rank=*/2);

  auto t0 = Clock::now();
  const auto waited = error_of([&] { store.wait({"never/a", "never/b"}, 300ms); });
  auto took = Clock::now() - t0;
  CHECK(waited.code() == ErrorCode::timeout);
  CHECK(contains(waited.what(), "'never/a', 'never/b'"));
  CHECK(contains(waited.what(), "rank 2"));
  CHECK(contains(waited.what(), "127.0.0.1:" + std::to_string(server.port())));
  CHECK(took >= 300ms);
  CHECK(took < 5s);

  // The dropped connection's parked wait must not answer the next call: a new connection does.
  store.set("after", "1");
  CHECK(server.ask("set never/a x") == "ok");  // would wake the old wait
  CHECK(server.ask("get after") == "1");
  CHECK(store.add("n", 1) == 1);

  t0 = Clock::now();
  const auto got = error_of([&] { (void)store.get("never/c", 200ms); });
  took = Clock::now() - t0;
  CHECK(got.code() == ErrorCode::timeout);
  CHECK(contains(got.what(), "get 'never/c'"));
  CHECK(took < 5s);
  CHECK(store.check_within({"never/a"}, 2s));
  store.set_within("after2", "2", 2s);
  CHECK(server.ask("get after2") == "2");
  server.stop();
}

TEST_CASE("torch store: a server that goes fails the calls with peer_failure; none there is a timeout") {
  {
    TorchServer server;
    TorchStore store("127.0.0.1", server.port(), 5s);
    store.set("k", "v");
    server.stop();  // the process and its store are gone
    const auto first = error_of([&] { (void)store.add("k2", 1); });
    CHECK(first.code() == ErrorCode::peer_failure);
    const auto later = error_of([&] { store.set("k3", "v"); });
    CHECK(later.code() == ErrorCode::peer_failure);
    CHECK(contains(later.what(), "lost earlier"));
  }
  // A port with a bound socket that does not listen: every connect is refused.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const auto port = ntohs(a.sin_port);
  const auto t0 = Clock::now();
  const auto none = error_of([&] { TorchStore("127.0.0.1", port, 400ms, 1); });
  CHECK(Clock::now() - t0 < 5s);
  ::close(fd);
  CHECK(none.code() == ErrorCode::timeout);
  CHECK(contains(none.what(), "127.0.0.1:" + std::to_string(port)));
  CHECK(contains(none.what(), "rank 1"));
}

TEST_CASE("rendezvous under torchrun's static rendezvous joins the agent's torch store") {
  TorchServer server;  // stands for the agent of node 0
  ScopedEnv vars({{"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", std::to_string(server.port())},
                  {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                  {"TORCHELASTIC_RESTART_COUNT", "2"}});
  std::array<chorus::JobNonce, 2> nonces{};
  std::array<std::string, 2> errors;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        chorus::Options o;
        o.rank = r;
        o.world_size = 2;
        o.timeout = 20s;
        nonces[static_cast<std::size_t>(r)] = chorus::rendezvous(o).nonce;
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(nonces[0] == nonces[1]);
  // Rank 0 published the job's nonce in the agent's store, under the restart's prefix.
  CHECK(server.ask("wait chorus/torchelastic/attempt_2/chorus/g1/nonce") == "ok");
  CHECK(server.ask("get chorus/torchelastic/attempt_2/chorus/g1/world_size") == "2");
  server.stop();
}

}  // namespace bootstrap_test_torch_store
