// SPDX-License-Identifier: BSD-3-Clause
// run_threads and run_processes (see spawn.hpp): compiled once, in chorus_test_main, instead of in
// every test file that starts ranks.
#include "support/spawn.hpp"

#include "chorus/bootstrap/tcp_store.hpp"

extern char** environ;  // NOLINT: POSIX

namespace chorus::test {

void run_threads(int n, const RankBody& body, ThreadOptions topt) {
  if (n < 1) throw std::invalid_argument("run_threads: n must be >= 1");
  auto store = topt.store ? topt.store : std::make_shared<chorus::MemoryStore>();
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));

  auto run_rank = [&](int r) {
    chorus::Options o;
    o.rank = r;
    o.world_size = n;
    o.store = store;
    o.timeout = topt.timeout;
    try {
      body(r, std::move(o));
    } catch (...) {
      auto e = std::current_exception();
      std::lock_guard lk(mu);
      std::cerr << "[chorus::test::run_threads] rank " << r << " of " << n << " failed"
                << (first ? "" : " (first)") << ": " << detail::describe(e) << std::endl;
      if (!first) first = e;
    }
  };
  try {
    for (int r = 0; r < n; ++r) threads.emplace_back(run_rank, r);
  } catch (...) {
    // Could not start every thread: the started ranks fail by timeout at rendezvous.
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

namespace detail {

constexpr const char* kEnvCall = "CHORUS_TEST_CHILD_CALL";
constexpr const char* kEnvCase = "CHORUS_TEST_CHILD_CASE";
constexpr const char* kEnvRank = "CHORUS_TEST_CHILD_RANK";
constexpr const char* kEnvSize = "CHORUS_TEST_CHILD_WORLD_SIZE";
constexpr const char* kEnvPort = "CHORUS_TEST_CHILD_STORE_PORT";
constexpr const char* kEnvTimeout = "CHORUS_TEST_CHILD_TIMEOUT_MS";
constexpr const char* kEnvParent = "CHORUS_TEST_CHILD_PARENT_PID";
constexpr const char* kStoreHost = "127.0.0.1";

/// Failed doctest assertions in this process, counted by the listener below (the count doctest
/// keeps itself lives in its implementation file, out of reach).
std::atomic<int> g_failed_asserts{0};

struct FailureCounter : doctest::IReporter {
  explicit FailureCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& a) override {
    if (a.m_failed) g_failed_asserts.fetch_add(1, std::memory_order_relaxed);
  }
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

const doctest::detail::TestCase& current_test() {
  const auto* opts = doctest::getContextOptions();
  if (opts == nullptr || opts->currentTest == nullptr)
    throw std::logic_error("chorus::test::run_processes must be called inside a doctest test case");
  return *opts->currentTest;
}

/// The index of this run_processes call within the running test case (0, 1, ...), counted the
/// same way in the parent and in the child, which re-runs the same test case.
int next_call_index() {
  static const void* test = nullptr;
  static int count = 0;
  const void* cur = &current_test();
  if (cur != test) {
    test = cur;
    count = 0;
  }
  return count++;
}

long env_long(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw std::logic_error(std::string("run_processes child: ") + name + " is not set");
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0') throw std::logic_error(std::string("run_processes child: bad ") + name);
  return x;
}

/// A doctest filter that matches exactly `s`: commas and backslashes escaped.
std::string doctest_filter_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void flush_all() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

/// Set by each child in the parent's store before it runs the body: a child that exits 0 without
/// having run it (its doctest filters selected nothing) must not pass for a success.
std::string ran_key(int rank) { return "chorus_test/child_ran/" + std::to_string(rank); }

/// The child side: run the body as rank CHORUS_TEST_CHILD_RANK and leave the process.
[[noreturn]] void run_child(const RankBody& body) {
  // Die with the parent (its test thread), so a killed test run leaves no orphans.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int code = 0;
  int rank = -1;
  try {
    if (static_cast<long>(::getppid()) != env_long(kEnvParent)) std::_Exit(90);
    rank = static_cast<int>(env_long(kEnvRank));
    const int size = static_cast<int>(env_long(kEnvSize));
    const auto port = static_cast<std::uint16_t>(env_long(kEnvPort));
    const std::chrono::milliseconds timeout(env_long(kEnvTimeout));
    chorus::Options o;
    o.rank = rank;
    o.world_size = size;
    o.timeout = timeout;
    o.store = std::make_shared<chorus::TcpStore>(kStoreHost, port, false, timeout);
    o.store->set(ran_key(rank), "1");  // the parent checks that every child got this far
    const int failed_before = g_failed_asserts.load();
    body(rank, std::move(o));
    if (g_failed_asserts.load() != failed_before) {
      std::cerr << "[chorus::test::run_processes] rank " << rank << ": doctest assertions failed\n";
      code = 3;
    }
  } catch (...) {
    std::cerr << "[chorus::test::run_processes] rank " << rank
              << " failed: " << describe(std::current_exception()) << "\n";
    code = 1;
  }
  flush_all();
  // _Exit: no static destructors, no doctest summary, no atexit handlers of the test run.
  std::_Exit(code);
}

std::string read_all(int fd, std::size_t keep_tail) {
  std::string out;
  if (::lseek(fd, 0, SEEK_SET) < 0) return "(could not read the output: lseek failed)";
  char buf[65536];
  for (;;) {
    ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    out.append(buf, static_cast<std::size_t>(k));
    if (out.size() > 2 * keep_tail) out.erase(0, out.size() - keep_tail);
  }
  if (out.size() > keep_tail) out = "...(earlier output cut)...\n" + out.substr(out.size() - keep_tail);
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  ///< memfd holding the child's stdout and stderr
  bool exited = false;
  bool killed_on_timeout = false;
  int status = 0;
};

}  // namespace detail

void run_processes(int n, const RankBody& body, ProcessOptions popt) {
  using Clock = std::chrono::steady_clock;
  const auto& tc = detail::current_test();
  const int call = detail::next_call_index();

  if (const char* child_call = std::getenv(detail::kEnvCall)) {
    // We are a child: run only the call (of the test case) we were started for; never spawn.
    const char* child_case = std::getenv(detail::kEnvCase);
    if (std::to_string(call) == child_call && child_case && std::string_view(child_case) == tc.m_name)
      detail::run_child(body);
    return;
  }
  if (n < 1) throw std::invalid_argument("run_processes: n must be >= 1");
  for (int r : popt.expect_killed)
    if (r < 0 || r >= n) throw std::invalid_argument("run_processes: expect_killed rank out of range");

  const std::string test_name = tc.m_name;
  const std::string suite = tc.m_test_suite ? tc.m_test_suite : "";
  chorus::TcpStore server(detail::kStoreHost, 0, true, popt.comm_timeout);
  const std::uint16_t port = server.port();

  // argv: select exactly this test case (and suite) in the child.
  char exe_buf[4096];
  ssize_t len = ::readlink("/proc/self/exe", exe_buf, sizeof exe_buf - 1);
  const std::string exe = len > 0 ? std::string(exe_buf, static_cast<std::size_t>(len)) : "/proc/self/exe";
  std::vector<std::string> args = {exe, "--test-case=" + detail::doctest_filter_escape(test_name),
                                   "--case-sensitive=true", "--no-intro=true", "--no-version=true",
                                   "--no-skip=true", "--no-breaks=true"};
  if (!suite.empty()) args.push_back("--test-suite=" + detail::doctest_filter_escape(suite));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // Environment: ours without any CHORUS_TEST_CHILD_* or overridden variable, plus the child's.
  auto overridden = [&](std::string_view kv) {
    if (kv.starts_with("CHORUS_TEST_CHILD_")) return true;
    for (const auto& [k, v] : popt.env)
      if (kv.size() > k.size() && kv.starts_with(k) && kv[k.size()] == '=') return true;
    return false;
  };
  std::vector<std::string> base_env;
  for (char** e = environ; e && *e; ++e)
    if (!overridden(*e)) base_env.emplace_back(*e);
  for (const auto& [k, v] : popt.env) base_env.push_back(k + "=" + v);
  base_env.push_back(std::string(detail::kEnvCall) + "=" + std::to_string(call));
  base_env.push_back(std::string(detail::kEnvCase) + "=" + test_name);
  base_env.push_back(std::string(detail::kEnvSize) + "=" + std::to_string(n));
  base_env.push_back(std::string(detail::kEnvPort) + "=" + std::to_string(port));
  base_env.push_back(std::string(detail::kEnvTimeout) + "=" + std::to_string(popt.comm_timeout.count()));
  base_env.push_back(std::string(detail::kEnvParent) + "=" + std::to_string(::getpid()));

  std::vector<detail::Child> children(static_cast<std::size_t>(n));
  std::mutex mu;  // guards Child::exited / killed_on_timeout
  std::condition_variable cv;
  std::vector<std::thread> waiters;

  // Kills every child not yet known to have exited. Safe against pid reuse: a child is reaped
  // (waitpid) only after its waiter has seen it exit, and we never kill an exited one.
  auto kill_running = [&](bool on_timeout) {
    std::lock_guard lk(mu);
    for (auto& c : children)
      if (c.pid > 0 && !c.exited) {
        ::kill(c.pid, SIGKILL);
        if (on_timeout) c.killed_on_timeout = true;
      }
  };
  auto reap_all = [&] {
    for (auto& t : waiters) t.join();
    for (auto& c : children) {
      if (c.pid > 0) {
        while (::waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR) {
        }
      }
    }
  };
  auto close_all = [&] {
    for (auto& c : children)
      if (c.out_fd >= 0) ::close(c.out_fd);
  };

  std::string spawn_error;
  for (int r = 0; r < n && spawn_error.empty(); ++r) {
    auto& c = children[static_cast<std::size_t>(r)];
    c.out_fd = ::memfd_create(("chorus-test-rank-" + std::to_string(r)).c_str(), MFD_CLOEXEC);
    if (c.out_fd < 0) {
      spawn_error = std::string("memfd_create: ") + std::strerror(errno);
      break;
    }
    std::vector<std::string> env = base_env;
    env.push_back(std::string(detail::kEnvRank) + "=" + std::to_string(r));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, c.out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, c.out_fd, 2);
    int rc = ::posix_spawn(&c.pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      c.pid = -1;
      spawn_error = "posix_spawn of rank " + std::to_string(r) + ": " + std::strerror(rc);
      break;
    }
    try {
      waiters.emplace_back([&, r] {
        auto& ch = children[static_cast<std::size_t>(r)];
        siginfo_t info{};
        while (::waitid(P_PID, static_cast<id_t>(ch.pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
        }
        {
          std::lock_guard lk(mu);
          ch.exited = true;
        }
        cv.notify_all();
      });
    } catch (const std::exception& e) {
      spawn_error = std::string("starting a waiter thread: ") + e.what();
    }
  }
  if (!spawn_error.empty()) {
    kill_running(false);
    // Waiters exist for every spawned child but the last one when thread creation failed.
    for (auto& c : children)
      if (c.pid > 0) {
        std::lock_guard lk(mu);
        c.exited = true;
      }
    reap_all();
    close_all();
    throw Failure("run_processes: " + spawn_error);
  }

  const auto deadline = Clock::now() + popt.timeout;
  bool timed_out = false;
  {
    std::unique_lock lk(mu);
    auto all_exited = [&] {
      for (auto& c : children)
        if (!c.exited) return false;
      return true;
    };
    timed_out = !cv.wait_until(lk, deadline, all_exited);
  }
  if (timed_out) kill_running(true);
  reap_all();

  std::ostringstream failures;
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    const auto& c = children[static_cast<std::size_t>(r)];
    const bool want_kill = popt.expect_killed.count(r) != 0;
    const bool was_sigkill = WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL;
    bool ok = want_kill ? (was_sigkill && !c.killed_on_timeout)
                        : (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    if (ok && !server.check({detail::ran_key(r)})) {
      ++failed;
      failures << "\n  rank " << r << ": " << detail::describe_status(c.status)
               << " without running the body (did its doctest filters select test '" << test_name << "'?)";
      continue;
    }
    if (ok) continue;
    ++failed;
    failures << "\n  rank " << r << ": ";
    if (c.killed_on_timeout)
      failures << "still running after " << popt.timeout.count() << " ms, killed";
    else
      failures << detail::describe_status(c.status);
    if (want_kill) failures << " (expected: killed by SIGKILL)";
  }

  const bool verbose = std::getenv("CHORUS_TEST_VERBOSE") != nullptr;
  if (failed > 0 || verbose) {
    for (int r = 0; r < n; ++r) {
      const auto& c = children[static_cast<std::size_t>(r)];
      std::cerr << "---- run_processes '" << test_name << "' rank " << r << " of " << n << " ("
                << (c.killed_on_timeout ? std::string("killed on timeout") : detail::describe_status(c.status))
                << "), output: ----\n"
                << detail::read_all(c.out_fd, 64 * 1024) << "---- end of rank " << r << " ----\n";
    }
    std::cerr.flush();
  }
  close_all();
  if (failed > 0) {
    throw Failure("run_processes(" + std::to_string(n) + ") in test '" + test_name + "': " +
                  std::to_string(failed) + " rank(s) failed:" + failures.str());
  }
}

}  // namespace chorus::test

DOCTEST_REGISTER_LISTENER("chorus_test_failure_counter", 1, chorus::test::detail::FailureCounter);
