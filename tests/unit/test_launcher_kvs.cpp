// SPDX-License-Identifier: BSD-3-Clause
// Meeting through the launcher's key-value service (bootstrap/launcher_kvs.hpp): which service an
// environment offers, the PMI-1 exchange against a fake Hydra server that serves several ranks
// (put, a real barrier, get), its errors, and the address rank 0 publishes. The PMIx side runs
// for real under Open MPI's mpirun across namespace hosts (integration/run_mpi_hosts.sh).
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/launcher_kvs.hpp"
#include "chorus/bootstrap/init_method.hpp"  // the detail:: steps of rendezvous()
#include "chorus/bootstrap/rendezvous.hpp"

namespace {

using chorus::Error;
using chorus::ErrorCode;
using chorus::detail::Pmi1Connection;

chorus::GetEnv env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// Hydra's side for `n` ranks, one socket pair each: answers init, get_my_kvsname, put, get and
/// finalize at once, and barrier_in with barrier_out once every rank has entered it. With
/// `barrier = false` it never answers barrier_in (a rank that never comes).
class FakeHydra {
 public:
  explicit FakeHydra(int n, bool barrier = true) : n_(n), barrier_(barrier), fds_(n), heard_(n) {
    for (int r = 0; r < n; ++r) {
      int p[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, p) == 0);
      fds_[r] = {p[0], p[1]};
    }
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { serve(r); });
  }
  ~FakeHydra() {
    for (auto& [rank_end, server_end] : fds_) ::shutdown(server_end, SHUT_RDWR);
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    for (auto& [rank_end, server_end] : fds_) {
      ::close(rank_end);
      ::close(server_end);
    }
  }
  int fd(int rank) const { return fds_[rank].first; }
  std::vector<std::string> heard(int rank) {
    std::lock_guard lock(m_);
    return heard_[rank];
  }

 private:
  void serve(int r) {
    const int fd = fds_[r].second;
    auto say = [&](const std::string& t) { (void)!::write(fd, t.data(), t.size()); };
    for (;;) {
      std::string l;
      char c = 0;
      while (::read(fd, &c, 1) == 1 && c != '\n') l += c;
      if (l.empty()) return;  // closed
      {
        std::lock_guard lock(m_);
        heard_[r].push_back(l);
      }
      const auto cmd = Pmi1Connection::field(l, "cmd");
      if (cmd == "init") {
        say("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
      } else if (cmd == "get_my_kvsname") {
        say("cmd=my_kvsname kvsname=kvs_1_0\n");
      } else if (cmd == "put") {
        std::lock_guard lock(m_);
        kvs_[*Pmi1Connection::field(l, "key")] = *Pmi1Connection::field(l, "value");
        say("cmd=put_result rc=0 msg=success\n");
      } else if (cmd == "barrier_in") {
        std::unique_lock lock(m_);
        const int round = ++entered_;
        const int wanted = (round + n_ - 1) / n_ * n_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return stop_ || (barrier_ && entered_ >= wanted); });
        if (stop_) return;
        lock.unlock();
        say("cmd=barrier_out\n");
      } else if (cmd == "get") {
        std::lock_guard lock(m_);
        const auto it = kvs_.find(*Pmi1Connection::field(l, "key"));
        say(it == kvs_.end() ? "cmd=get_result rc=-1 msg=key_not_found\n"
                             : "cmd=get_result rc=0 msg=success value=" + it->second + "\n");
      } else if (cmd == "finalize") {
        say("cmd=finalize_ack\n");
      }
    }
  }

  int n_;
  bool barrier_;
  std::vector<std::pair<int, int>> fds_;
  std::vector<std::vector<std::string>> heard_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kvs_;
  int entered_ = 0;
  bool stop_ = false;
};

}  // namespace

TEST_CASE("PMI-1 answers: fields by name") {
  const std::string line = "cmd=get_result rc=0 msg=success value=10.0.0.1:4242\n";
  CHECK(Pmi1Connection::field(line, "cmd") == "get_result");
  CHECK(Pmi1Connection::field(line, "rc") == "0");
  CHECK(Pmi1Connection::field(line, "value") == "10.0.0.1:4242");
  CHECK_FALSE(Pmi1Connection::field(line, "val").has_value());  // a whole key, not a prefix
  CHECK_FALSE(Pmi1Connection::field(line, "kvsname").has_value());
  CHECK(Pmi1Connection::field("cmd=barrier_out", "cmd") == "barrier_out");
}

TEST_CASE("mpirun/mpiexec on several hosts without MASTER_ADDR: the launcher's key-value service") {
  using chorus::detail::InitMethod;
  auto method = [](std::map<std::string, std::string> vars) {
    return chorus::detail::parse_init_method("env://", env(std::move(vars)),
                                             [](const chorus::LaunchInfo&) { return std::string("job"); });
  };
  const std::map<std::string, std::string> hydra = {
      {"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}, {"PMI_FD", "6"}};
  InitMethod m = method(hydra);
  CHECK(m.launcher_kvs == "pmi1");
  CHECK(m.kind == InitMethod::Kind::tcp);
  CHECK_FALSE(m.job_file);
  const std::map<std::string, std::string> ompi = {{"OMPI_COMM_WORLD_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                   {"PMIX_NAMESPACE", "952696833"},
                                                   {"PMIX_SERVER_URI41", "pmix-server.1;tcp4://127.0.0.1:1"}};
  CHECK(method(ompi).launcher_kvs == "pmix");
  auto rank_only = ompi;  // a PMIx server that publishes its address under another name
  rank_only.erase("PMIX_SERVER_URI41");
  rank_only["PMIX_RANK"] = "1";
  CHECK(method(rank_only).launcher_kvs == "pmix");
  // Every rank on this host: still the job's file store, no launcher exchange.
  auto one_host = ompi;
  one_host["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  CHECK(method(one_host).job_file);
  CHECK(method(one_host).launcher_kvs.empty());
  // MASTER_ADDR wins.
  auto named = hydra;
  named["MASTER_ADDR"] = "10.1.2.3";
  named["MASTER_PORT"] = "29500";
  CHECK(method(named).launcher_kvs.empty());
  CHECK(method(named).host == "10.1.2.3");
  // torchrun's variables are not an MPI launcher's, and Open MPI without a PMIx server named:
  // the refusal that says what to set.
  auto no_server = ompi;
  no_server.erase("PMIX_SERVER_URI41");
  try {
    (void)method(no_server);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK(mentions(e.what(), "PMIX_SERVER_URI"));
    CHECK(mentions(e.what(), "mpirun -x MASTER_ADDR=host0"));
  }
}

TEST_CASE("PMI-1: every rank gets rank 0's value after a barrier all of them entered") {
  constexpr int kRanks = 3;
  FakeHydra hydra(kRanks);
  std::vector<std::string> got(kRanks), errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      try {
        got[r] = chorus::detail::launcher_exchange("pmi1", r, r == 0 ? "10.9.8.7:40123" : "",
                                                   std::chrono::seconds(10),
                                                   env({{"PMI_FD", std::to_string(hydra.fd(r))}}));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    CHECK_MESSAGE(errors[r].empty(), errors[r]);
    CHECK(got[r] == "10.9.8.7:40123");
  }
  CHECK(hydra.heard(0) == std::vector<std::string>{"cmd=init pmi_version=1 pmi_subversion=1", "cmd=get_my_kvsname",
                                                   "cmd=put kvsname=kvs_1_0 key=chorus_store value=10.9.8.7:40123",
                                                   "cmd=barrier_in", "cmd=finalize"});
  CHECK(hydra.heard(2) == std::vector<std::string>{"cmd=init pmi_version=1 pmi_subversion=1", "cmd=get_my_kvsname",
                                                   "cmd=barrier_in", "cmd=get kvsname=kvs_1_0 key=chorus_store",
                                                   "cmd=finalize"});
}

TEST_CASE("PMI-1: a barrier that never completes is a timeout naming the rank, not a hang") {
  FakeHydra hydra(2, /*barrier=*/false);
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)chorus::detail::launcher_exchange("pmi1", 1, "", std::chrono::milliseconds(300),
                                            env({{"PMI_FD", std::to_string(hydra.fd(1))}}));
    FAIL("no timeout");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::timeout);
    CHECK(mentions(e.what(), "rank 1"));
    CHECK(mentions(e.what(), "PMI-1 barrier"));
    CHECK(mentions(e.what(), "PMI_FD="));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("the address rank 0 publishes: CHORUS_SOCKET_IFNAME's, else not loopback nor docker's") {
  namespace asio = chorus::detail::asio;
  using chorus::detail::choose_publishable;
  using chorus::detail::InterfaceAddress;
  auto at = [](std::string name, const char* a) { return InterfaceAddress{std::move(name), asio::ip::make_address(a)}; };
  const std::vector<InterfaceAddress> host = {at("lo", "127.0.0.1"), at("docker0", "172.17.0.1"),
                                              at("eth0", "fe80::1"), at("eth0", "2001:db8::5"), at("eth0", "10.0.0.5"),
                                              at("ib0", "10.1.0.5")};
  CHECK(choose_publishable("", host).to_string() == "10.0.0.5");  // IPv4 first, kernel's order
  CHECK(choose_publishable("ib", host).to_string() == "10.1.0.5");
  CHECK(choose_publishable("", {at("lo", "127.0.0.1"), at("eth0", "fe80::1"), at("eth0", "2001:db8::5")}).to_string() ==
        "2001:db8::5");
  CHECK(choose_publishable("", {at("lo", "127.0.0.1"), at("docker0", "172.17.0.1")}).is_loopback());
  CHECK_THROWS_AS(choose_publishable("nosuch", host), Error);
}
